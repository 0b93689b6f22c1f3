"""AttentionEngine split-score mode (hw.tile.attention_engine): partial rows out, reduced rows
in; RTL == ISS == golden ``split_partials``, exact cycles, random idle and backpressure."""

import numpy as np
import pytest

from hw.spec.attention import FLAG_PARTIAL, FLAG_REDUCED, flags_value
from hw.spec.timing.attention import launch_cycles
from hw.tile.attention_engine import AttentionEngine
from sim.compiler.attention_launch import attention_launch, emit
from sim.golden.attention import shard_sizes, split_partials
from sim.golden.float_model import attention_mask
from sim.golden.matmul import wrap
from sim.rtl.attention_engine_driver import cfg_payload, run_attention_engine
from sim.rtl.pysim import run_sim
from tests.helpers import (
    OUT_MULT,
    OUT_SHIFT,
    SCORE_MULT,
    SCORE_SHIFT,
    SplitCase,
    assemble,
    assert_memories_equal,
    attention_npu,
    attention_reference,
    seeded,
)


def engine_run(case, launches, before, rng, *, idle=0.25, stall=0.25):
    mem, cycles, _ = run_attention_engine(AttentionEngine.for_npu(case.npu), before, launches,
                                          addr_bits=case.iss.addr_bits, rng=rng, idle=idle,
                                          stall=stall, max_cycles=40_000)
    return mem, cycles


def both_passes(case, rng, **kw):
    """Pass 1 on the ISS and the engine (memories equal), the rows summed, pass 2 likewise."""
    before = case.iss.mem.copy()
    case.iss.run(assemble(emit, case.partials))
    mem, _ = engine_run(case, case.partials, before, rng, **kw)
    assert_memories_equal(mem, case.iss.mem)
    total = case.reduce()
    before = case.iss.mem.copy()
    case.iss.run(assemble(emit, case.reduced))
    mem, _ = engine_run(case, case.reduced, before, rng, **kw)
    assert_memories_equal(mem, case.iss.mem)
    return total


@pytest.mark.parametrize("seed, shards", [(11, 2), (12, 3)])
def test_partial_rows_against_golden_split_partials(seed, shards):
    """Preload, causal: each shard's rows equal ``split_partials``; the engine's memory (rows
    of every shard, reduced output of every shard) equals the ISS's; the output equals the
    whole head."""
    rng = seeded(seed)
    npu = attention_npu(window=8, length=8, dmax=8)
    d_head = 8 * shards
    case = SplitCase(rng, npu, queries=6, keys=6, shards=shard_sizes(d_head, shards),
                     d_model=d_head)
    total = both_passes(case, rng)
    for t in range(6):
        want = split_partials(case.q[t], case.k, shards)
        assert (total[t, :6] == wrap(sum(want))).all(), f"query {t}: reduced row"
        for s in range(shards):
            assert (case.partial_rows(s)[t, :6] == want[s]).all(), f"query {t} shard {s}"
    want = attention_reference(case.q, case.k, case.v, attention_mask(6, 0, True))
    assert (case.output() == want).all()


@pytest.mark.parametrize("seed, npu_kw, kw, seq, mask", [
    (13, {"window": 8, "length": 8}, {"bidirectional": True}, 6, attention_mask(6, 0, False)),
    (14, {"window": 4, "length": 8}, {"interleaved": True, "window": 3, "q_pos": 9,
                                      "k_pos": 9}, 9, attention_mask(9, 3, True, 9)),
    (15, {"window": 5, "length": 8}, {"interleaved": True, "halo": 2, "window": 3,
                                      "bidirectional": True}, 8, None),
])
def test_schedules_and_windows(seed, npu_kw, kw, seq, mask):
    """Bidirectional, interleaved over a wrapping ring with a narrower window, a halo:
    RTL == ISS, and the ISS's output equals the whole head where a mask is given."""
    rng = seeded(seed)
    npu = attention_npu(**npu_kw)
    halo = kw.get("halo", 0)
    case = SplitCase(rng, npu, queries=seq - halo, keys=seq, shards=[4, 4], d_model=12, col=4,
                     **kw)
    both_passes(case, rng)
    if mask is not None:
        sl = case.sl
        want = attention_reference(case.q[:, sl], case.k[:, sl], case.v[:, sl], mask)
        assert (case.output() == want).all()


def test_stale_keys_are_zero():
    """A partial pass with fewer keys than a previous launch wrote: the ring's other slots hold
    that launch's keys, the engine writes 0 there (as the ISS's fresh ring has)."""
    rng = seeded(16)
    npu = attention_npu(window=8, length=8)
    case = SplitCase(rng, npu, queries=3, keys=3, shards=[8], d_model=8)
    full = attention_launch(size=4, d_head=8, queries=6, keys=6, q_base=0, k_base=0,
                            v_base=0, o_base=case.o_base, q_row_words=2, k_row_words=2,
                            v_row_words=2, o_row_words=2, score_mult=SCORE_MULT,
                            score_shift=SCORE_SHIFT, out_mult=OUT_MULT, out_shift=OUT_SHIFT)
    launches = [full, case.partials[0]]
    before = case.iss.mem.copy()
    case.iss.run(assemble(emit, launches))
    assert (case.partial_rows(0)[:, 3:] == 0).all()
    mem, _ = engine_run(case, launches, before, rng)
    assert_memories_equal(mem, case.iss.mem)


@pytest.mark.parametrize("npu_kw, seq, shards, kw", [
    ({"window": 8, "length": 8}, 6, [4, 4], {}),
    ({"window": 4, "length": 10}, 6, [4], {"interleaved": True}),          # P = 2, wraps
    ({"window": 6, "length": 8}, 8, [8], {"interleaved": True, "halo": 3}),
    ({"size": 2, "window": 2, "length": 2, "dmax": 16}, 4, [16], {}),      # R = 4 > W
    ({"window": 8, "length": 8, "pipeline": "deep"}, 6, [8], {}),         # output registers
])
def test_cycles(npu_kw, seq, shards, kw):
    """Every word available and ``o`` always ready: each pass takes exactly
    ``launch_cycles``; with random idle and backpressure never fewer."""
    rng = np.random.default_rng(17)
    npu = attention_npu(**npu_kw)
    halo = kw.get("halo", 0)
    case = SplitCase(rng, npu, queries=seq - halo, keys=seq, shards=shards,
                     d_model=sum(shards), **kw)
    case.iss.run(assemble(emit, case.partials))
    case.reduce()
    for launch in (case.partials[0], case.reduced[0]):
        model = launch_cycles(launch.regs, window=npu.attn_window, length=npu.softmax_len,
                              size=npu.array_size, pipeline=npu.attention_pipeline)
        _, cycles = engine_run(case, [launch], case.iss.mem, rng, idle=0, stall=0)
        assert cycles == model, f"{launch.regs['AT_FLAGS']:#x}: RTL {cycles}, model {model}"
        _, slow = engine_run(case, [launch], case.iss.mem, rng, idle=0.3, stall=0.3)
        assert slow >= model, f"with idle/backpressure {slow} < {model}"
        print(f"flags {launch.regs['AT_FLAGS']:#x}: {cycles} cycles, {slow} with stalls")


def test_uses_follows_the_offered_configuration():
    """``uses`` (which read generators the chip starts) from the payload offered: K unless
    reduced, V unless partial."""
    npu = attention_npu()
    dut = AttentionEngine.for_npu(npu)
    case = SplitCase(np.random.default_rng(18), npu, queries=2, keys=2, shards=[8], d_model=8)
    base = cfg_payload(case.partials[0])
    seen = []

    async def bench(ctx):
        for split in (None, "partial", "reduced"):
            flags = flags_value(bidirectional=False, interleaved=False, split=split)
            ctx.set(dut.i_cfg.payload, {**base, "flags": flags})
            seen.append((ctx.get(dut.uses.k), ctx.get(dut.uses.v)))
        ctx.set(dut.i_cfg.payload, {**base, "flags": FLAG_PARTIAL | FLAG_REDUCED})
        seen.append((ctx.get(dut.uses.k), ctx.get(dut.uses.v)))

    run_sim(dut, [bench], max_cycles=10)
    assert seen == [(1, 1), (1, 0), (0, 1), (0, 1)]
