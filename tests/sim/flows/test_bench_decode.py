"""The generation benchmark (sim.benches.decode): its quick rows, the bound's weight count
against what the compiler places, the refusal of a run that is not bit-exact."""

import dataclasses
import math

import numpy as np
import pytest

from sim.benches import decode as bench
from sim.compiler.decode import compile_decode
from sim.compiler.decode_quant import quantize_decode
from sim.golden.decode import random_head_weights
from sim.golden.float_model import random_weights


def test_quick_rows_are_finite_and_no_step_beats_its_bound():
    rows = bench.run(quick=True)
    names = [r["bench"] for r in rows]
    assert len(set(names)) == len(names), f"repeated bench names: {names}"
    bound = [r for r in rows if "vs bound" in r["bench"]]
    batches = [r for r in rows if r["bench"].startswith("aggregate tokens/s")]
    assert len(bound) == 1 and len(batches) == 2, names
    for i, r in enumerate(rows):
        for key in ("bench", "value", "unit", "ref", "ratio", "note"):
            assert key in r, f"row {i} ({r.get('bench')}): no {key!r}"
        for key in ("value", "ref", "ratio"):
            assert isinstance(r[key], (int, float)) and math.isfinite(r[key]) and r[key] > 0, \
                f"row {i} ({r['bench']}): {key} = {r[key]!r}"
        assert r["ratio"] == pytest.approx(r["value"] / r["ref"], rel=1e-12), \
            f"row {i} ({r['bench']}): ratio {r['ratio']} is not value / ref"
    want = bench.step_bound(bench.NPU, bench.D128, 1)["cycles"]
    assert bound[0]["ref"] == want, f"bound {bound[0]['ref']} != step_bound {want}"
    assert bound[0]["ratio"] >= 1, f"a step beat its bound: {bound[0]}"
    assert batches[0]["ratio"] == 1, f"batch 1 against itself: {batches[0]}"
    assert 1 < batches[1]["ratio"] <= 2, f"batch 2: {batches[1]}"


@pytest.mark.parametrize("cfg", [
    bench.D128, bench.D128_ROPE,
    dataclasses.replace(bench.D128, n_layers=1, n_kv_heads=4, ffn="gated", activation="silu",
                        d_ff=140, name="gqa-gated"),
], ids=lambda c: c.name)
def test_bound_counts_every_weight_the_compiler_places(cfg):
    seed = 3
    print(f"seed {seed}")
    qm, head = quantize_decode(cfg, random_weights(cfg, seed), random_head_weights(cfg, seed + 1),
                               np.arange(3))
    prog = compile_decode(bench.NPU, qm, head, prompt_len=3, generate=2)
    placed = {name: t.words * bench.NPU.word_bytes
              for name, t in prog.chips[0].alloc.tensors.items() if name.endswith(".w")}
    got = bench.step_bound(bench.NPU, cfg, 1)
    want = {"embedding": placed.pop("embed.w"), "lm_head": placed.pop("lm_head.w"),
            "blocks": sum(placed.values())}
    assert got["weights"] == want, f"{cfg.name}: bound counts {got['weights']}, placed {want}"
    assert got["weight_cycles"] == -(-sum(want.values()) // bench.NPU.array_size)


def test_bound_refuses_what_it_does_not_model():
    n = bench.NPU.array_size
    with pytest.raises(ValueError, match=rf"batch must be 1..{n} .* not {n + 1}"):
        bench.step_bound(bench.NPU, bench.D128, n + 1)
    with pytest.raises(ValueError, match="quant must be int8, not 'smooth16'"):
        bench.step_bound(bench.NPU, dataclasses.replace(bench.D128, quant="smooth16"), 1)


def test_a_run_that_is_not_bit_exact_is_refused(monkeypatch):
    def wrong(*args, **kwargs):
        return {"golden_match": False, "first_mismatch": {"sequence": 0, "step": 1}}
    monkeypatch.setattr(bench, "generate", wrong)
    with pytest.raises(AssertionError, match=r"d128, batch 2, .*not bit-exact.*'step': 1"):
        bench._run(bench.D128, 2)
