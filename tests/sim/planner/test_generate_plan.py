"""``npu plan --generate`` (sim.planner.decode): generation's figures from the compiler's own
shapes-only program, against the ISS's run of the same generation."""

import dataclasses
import json

import numpy as np
import pytest

from hw.spec import model_preset, npu_preset
from sim.compiler.decode import compile_decode
from sim.flows.generate import generate
from sim.planner.decode import dummy_head, grid_min_chips, plan_generate
from sim.planner.plan import _dummy_qmodel
from sim.timing.cycle import time_programs
from sim.timing.launch import time_programs_fast
from tests.helpers import TINY_MODEL, TINY_NPU, assert_one_line_error, run, seeded, tiny_variant

#: A d_model 128 decoder (2 layers, 8 heads of 16) and an NPU variant that holds it.
D128 = dataclasses.replace(model_preset("tiny"), d_model=128, n_heads=8, d_head=16, d_ff=256,
                           n_layers=2)
NPU128 = tiny_variant(sram_bytes=1 << 19, imem_words=1 << 14, d_model_max=128)


@pytest.mark.parametrize("name,npu,strategy,chips,batch,n", [
    ("tiny", tiny_variant(sram_bytes=1 << 17), "single", 1, 1, 4),
    ("tiny", npu_preset("tiny"), "head", 2, 1, 4),
    pytest.param("tiny", npu_preset("tiny"), "pipeline", 2, 2, 4, marks=pytest.mark.slow),
    ("tiny", npu_preset("tiny"), "hidden", 2, 1, 2),
    pytest.param("tiny", npu_preset("tiny"), "pipeline", 4, 4, 4, marks=pytest.mark.slow),
    pytest.param("tiny-llama", npu_preset("tiny"), "head", 4, 2, 4, marks=pytest.mark.slow),
    pytest.param("tiny-llama", tiny_variant(imem_words=8192), "hidden", 3, 2, 4,
                 marks=pytest.mark.slow)])
def test_plan_equals_the_iss(name, npu, strategy, chips, batch, n):
    """The planned first token, every step's cycles and the KV bytes are the ISS's (hidden:
    from the same compiler, shapes only)."""
    cfg = model_preset(name)
    prompts = seeded(11).integers(0, cfg.vocab_size, (batch, 3))
    ran = generate(npu, cfg, prompt=prompts, n=n, backend="iss", strategy=strategy,
                   chips=chips, seed=11)
    planned = plan_generate(npu, cfg, generate=n, prompt_len=3, batch=batch,
                            strategy=strategy, chips=chips, search=False)
    assert planned.fits and planned.timed_by == "cycle model"
    assert planned.ttft_cycles == ran["ttft_cycles"]
    assert planned.step_cycles == ran["step_cycles"]
    assert planned.kv_bytes == ran["kv_bytes"] and planned.sram_bytes == ran["sram_bytes"]


@pytest.mark.parametrize("cfg,npu,chips,batch", [
    (model_preset("tiny-llama"), npu_preset("tiny"), 4, 2), (D128, NPU128, 1, 1),
    pytest.param(D128, NPU128, 2, 1, marks=pytest.mark.slow),
    pytest.param(D128, NPU128, 4, 2, marks=pytest.mark.slow)])
def test_launch_level_timing_of_generation_is_within_2_percent(cfg, npu, chips, batch):
    """Long runs are planned at launch level: within 2% of the cycle model (equal to the RTL)
    on the tiny decoder and a d_model 128 one."""
    prog = compile_decode(npu, _dummy_qmodel(cfg), dummy_head(cfg), prompt_len=3, generate=4,
                          batch=batch, chips=chips, contents=False)
    exact = time_programs(npu, prog.programs, ring=chips > 1).cycles
    fast = time_programs_fast(npu, prog.programs).cycles
    assert abs(fast - exact) <= 0.02 * exact, (fast, exact)


def test_limits_found_by_the_compiler():
    """The longest prompt and the largest batch: the compiler's own limits (learned
    positions, the scratchpad), each named."""
    p = plan_generate(npu_preset("tiny"), model_preset("tiny"), generate=4, prompt_len=3,
                      strategy="head", chips=2)
    assert p.longest_prompt == 5 and "seq_len=8" in p.longest_prompt_limit
    assert p.largest_batch >= 2 and "sram_bytes=65536 is too small" in p.largest_batch_limit
    bigger = plan_generate(npu_preset("tiny"), model_preset("tiny"), generate=4,
                           prompt_len=3, batch=p.largest_batch + 1, strategy="head", chips=2,
                           search=False)
    assert not bigger.fits and "sram_bytes" in bigger.reason


def test_plan_generate_cli(capsys, tmp_path):
    out_json = tmp_path / "p.json"
    status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                           "--generate", "3", "--context", "2", "--min-chips", "--json",
                           str(out_json))
    assert status == 0, err
    assert "single on 1 chip" in out and "does not fit" in out and "head on 2 chips" in out
    plans = json.loads(out_json.read_text())["generate"]
    # Split-KV decode (sequence): the last chip caches the generated tokens and must hold a
    # prompt token too, which a 2-token prompt and 3 generated on 2 chips do not give it.
    assert [(p["strategy"], p["fits"]) for p in plans] == [
        ("single", False), ("head", True), ("pipeline", True), ("hidden", True),
        ("sequence", False)]
    assert "must hold a prompt token" in plans[-1]["reason"]
    assert len(plans[1]["step_cycles"]) == 2 and np.isfinite(plans[1]["tokens_per_s"])
    for argv, msg in ((["--generate", "0", "--chips", "2"], "--generate must be at least 1"),
                      (["--batch", "2", "--chips", "2"], "--batch applies to --generate"),
                      (["--generate", "2", "--strategy", "data+pipeline+head", "--chips", "8"],
                       "--generate plans strategy single, head, pipeline, data, hidden, "
                       "sequence, head+pipeline, data+head, data+pipeline, not "
                       "data+pipeline+head")):
        status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL, *argv)
        assert_one_line_error(status, out, err, msg)


#: tiny-llama with 8 layers, on a tiny NPU that holds its head shards' programs.
DEEP = dataclasses.replace(model_preset("tiny-llama"), n_layers=8)
DEEP_NPU = tiny_variant(sram_bytes=1 << 17, imem_words=1 << 14)


#: DEEP_NPU with 512 KiB: hidden's 8 layers on 2 chips of 128 KiB reach the banks of the
#: reduce-scatter buffers, whose reductions then run 4.3% slower than the cuts' (whose
#: weights do not): a layout the linear extension cannot see (docs/architecture.md).
WIDE_NPU = tiny_variant(sram_bytes=1 << 19, imem_words=1 << 14)


@pytest.mark.parametrize("strategy,chips,grid,batch,tol", [
    ("head+pipeline", 8, (2, 4), 1, 1e-3),
    pytest.param("head", 2, None, 1, 1e-3, marks=pytest.mark.slow),
    pytest.param("hidden", 2, None, 1, 1e-3, marks=pytest.mark.slow),
    # The whole 2x2 torus is timed at launch level, the cut's one replica (a ring of 2) by
    # the cycle model: the two models' 2%.
    pytest.param("data+head", 4, (2, 2), 2, 2e-2, marks=pytest.mark.slow)])
def test_scaled_plan_equals_the_whole_compile(strategy, chips, grid, batch, tol):
    """Large systems are planned from cuts of fewer layers and stages, extended along them:
    within 0.1% of the whole program's timing by the same model, the same bytes and
    instructions per chip."""
    kw = {"generate": 4, "prompt_len": 3, "batch": batch, "strategy": strategy,
          "chips": chips, "grid": grid, "search": False}
    npu = WIDE_NPU if strategy == "hidden" else DEEP_NPU
    whole = plan_generate(npu, DEEP, scaled=False, **kw)
    cut = plan_generate(npu, DEEP, scaled=True, **kw)
    assert whole.fits and cut.fits and cut.notes, (whole.reason, cut.reason)
    for got, want in [(cut.ttft_cycles, whole.ttft_cycles),
                      *zip(cut.step_cycles, whole.step_cycles, strict=True)]:
        assert abs(got - want) <= tol * want, (cut.ttft_cycles, cut.step_cycles,
                                                whole.ttft_cycles, whole.step_cycles)
    assert cut.sram_bytes == [max(whole.sram_bytes)]
    assert cut.kv_bytes == [max(whole.kv_bytes)]
    assert cut.instructions == [max(whole.instructions)]


def test_scaled_plan_names_the_bytes_that_do_not_fit():
    cut = plan_generate(npu_preset("tiny"), DEEP, generate=4, prompt_len=3, strategy="head",
                        chips=2, search=False, scaled=True)
    assert not cut.fits and "sram_bytes=65,536 is too small" in cut.reason, cut.reason


@pytest.mark.parametrize("prompt_len", [3, 12])
def test_a_cut_below_the_scratchpad_names_its_bytes(prompt_len):
    """A scratchpad too small for even a one-layer cut's tensors (the compile places some
    below word 0): the plan does not fit and says by how many bytes, naming sram_bytes, not
    an address."""
    npu = tiny_variant(sram_bytes=1 << 12, imem_words=1 << 14)
    p = plan_generate(npu, DEEP, generate=2, prompt_len=prompt_len, strategy="head+pipeline",
                      chips=4, grid=(2, 2), search=False, scaled=True)
    assert not p.fits and p.reason.startswith("sram_bytes=4096 is too small: the model needs "), \
        p.reason
    assert "activations" in p.reason and "base" not in p.reason, p.reason


def test_grid_min_chips_is_the_fewest_grid_that_fits():
    """head+pipeline's fewest chips for generation, from the cuts' bytes: the grid it names
    fits, and every grid of fewer chips (head groups dividing n_heads, two stages or more)
    does not, each naming the scratchpad."""
    npu = tiny_variant(sram_bytes=1 << 14, imem_words=1 << 14)
    best = grid_min_chips(npu, DEEP, generate=2, prompt_len=3)
    assert best.fits, best.reason
    a, b = map(int, best.grid.split("x"))
    assert a * b == best.chips and "head groups of" in best.notes[0]
    assert max(best.sram_bytes) <= npu.sram_bytes
    for a2 in (2, 4):
        for b2 in range(2, DEEP.n_layers + 1):
            if a2 * b2 < a * b:
                other = plan_generate(npu, DEEP, generate=2, prompt_len=3, chips=a2 * b2,
                                      strategy="head+pipeline", grid=(a2, b2), search=False)
                assert not other.fits and "sram_bytes=16384" in other.reason, (a2, b2)


def test_plan_generate_grid_cli(capsys):
    status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                           "--generate", "2", "--context", "2", "--strategy", "head+pipeline",
                           "--grid", "2x2")
    assert status == 0, err
    assert out.startswith("head+pipeline 2x2 on 4 chips: 1 x (2 prompt + 2 generated)"), out
    for argv, msg in ((["--grid", "2x2", "--chips", "3"], "--chips 3 is not the 2 x 2 chips"),
                      (["--grid", "2by2"], "--grid '2by2' is not AxB"),
                      (["--chips", "4"], "--strategy head+pipeline needs --grid AxB or "
                                          "--min-chips")):
        status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                               "--generate", "2", "--strategy", "head+pipeline", *argv)
        assert_one_line_error(status, out, err, msg)
    status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                           "--generate", "2", "--chips", "2", "--grid", "2x1")
    assert_one_line_error(status, out, err, "--grid applies to head+pipeline")
