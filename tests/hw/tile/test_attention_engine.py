"""AttentionEngine (hw.tile.attention_engine): one head per launch, RTL == ISS == golden, timing."""

import numpy as np
import pytest

from hw.spec.attention import softmax_lanes
from hw.spec.timing.attention import launch_cycles
from hw.spec.timing.chip import softmax_stages
from hw.tile.attention_engine import AttentionEngine
from sim.compiler.attention_launch import attention_launch, plan_schedule
from sim.golden.float_model import attention_mask
from sim.rtl.attention_engine_driver import run_attention_engine
from tests.helpers import (
    OUT_MULT,
    OUT_SHIFT,
    SCORE_MULT,
    SCORE_SHIFT,
    AttentionCase,
    assert_memories_equal,
    attention_npu,
    attention_reference,
    seeded,
)


def run_engine(case, rng, *, idle=0.2, stall=0.2, launches=None):
    """The engine's memory and cycles for the case's launch (or ``launches``)."""
    mem, cycles, _ = run_attention_engine(
        AttentionEngine.for_npu(case.npu), case.before, launches or [case.launch],
        addr_bits=case.iss.addr_bits, rng=rng, idle=idle, stall=stall, max_cycles=30_000)
    return mem, cycles


def check_rtl(case, rng, **kw):
    """Run the engine; its memory must equal the ISS's bit for bit."""
    mem, cycles = run_engine(case, rng, **kw)
    assert_memories_equal(mem, case.iss.mem)
    return cycles


def check_head(case, rng, visible):
    """The ISS's head output equals the reference for the ``visible`` matrix; the engine's
    memory equals the ISS's."""
    sl = case.sl
    want = attention_reference(case.q[:, sl], case.k[:, sl], case.v[:, sl], visible)
    case.check_against(case.run_iss(), want)
    check_rtl(case, rng)


# --- RTL + ISS + golden ---------------------------------------------------------------------

@pytest.mark.parametrize("seed, pos", [(1, 0), (2, 300)])
def test_causal_whole_sequence_preload(seed, pos):
    """seq <= W, preload schedule, head 1 of 2; `pos` is the sequence's position base."""
    rng = seeded(seed)
    npu = attention_npu()
    seq = 6
    case = AttentionCase(rng, npu, queries=seq, keys=seq, d_model=16, col=8, d_head=8,
                         q_pos=pos, k_pos=pos)
    check_head(case, rng, attention_mask(seq, 0, True, pos))


def test_bidirectional_narrow_head():
    """Bidirectional, a head of 4 lanes in an 8-lane buffer (zero-extended), L > W."""
    rng = seeded(3)
    npu = attention_npu(window=6, length=8)
    seq = 6
    case = AttentionCase(rng, npu, queries=seq, keys=seq, d_model=12, col=4, d_head=4,
                         bidirectional=True)
    check_head(case, rng, attention_mask(seq, 0, False))


def test_windowed_sequence_longer_than_ring():
    """Causal window W over 13 tokens: interleaved schedule, the ring wraps around."""
    rng = seeded(4)
    npu = attention_npu(window=4, length=4)
    seq = 13
    case = AttentionCase(rng, npu, queries=seq, keys=seq, d_model=8, col=0, d_head=8,
                         interleaved=True, window=4, q_pos=7, k_pos=7)
    check_head(case, rng, attention_mask(seq, 4, True, 7))


def test_chunk_with_halo_at_position_base():
    """A sequence chunk at position 40 with the W-1 previous tokens as halo keys (what a
    sequence-parallel chip runs): keys 35..44, queries 40..44, window W = 6 < L = 8."""
    rng = seeded(5)
    npu = attention_npu(window=6, length=8)
    base, chunk, halo = 40, 5, 5
    case = AttentionCase(rng, npu, queries=chunk, keys=halo + chunk, d_model=8, col=0,
                         d_head=8, interleaved=True, halo=halo, window=6, q_pos=base,
                         k_pos=base - halo)
    qpos = np.arange(chunk)[:, None] + base
    kpos = np.arange(halo + chunk)[None, :] + base - halo
    check_head(case, rng, (kpos <= qpos) & (kpos > qpos - 6))


@pytest.mark.parametrize("seed, seq, window, causal, npu_kw", [
    (20, 11, 3, True, {"window": 6, "length": 8}),     # causal window 3 < W = 6, interleaved
    (21, 12, 3, False, {"window": 5, "length": 8}),    # bidirectional window 3, halo 2
    (22, 6, 2, False, {}),                             # bidirectional window 2, preload
])
def test_window_narrower_than_ring(seed, seq, window, causal, npu_kw):
    """AT_WINDOW narrows the ring's mask: ISS = golden mask, RTL = ISS."""
    rng = seeded(seed)
    npu = attention_npu(**npu_kw)
    sched = plan_schedule(seq=seq, window=window, causal=causal, ring=npu.attn_window)
    case = AttentionCase(rng, npu, queries=seq, keys=seq, d_model=8, col=0, d_head=8,
                         q_pos=30, k_pos=30, bidirectional=not causal,
                         interleaved=sched.interleaved, halo=sched.halo, window=sched.window)
    check_head(case, rng, attention_mask(seq, window, causal, 30))


def test_launches_back_to_back():
    """Three launches in a row (the ring restarts, no state leaks): a bidirectional preload
    head, a causal windowed interleaved head over the other columns, then a narrow head."""
    rng = seeded(8)
    npu = attention_npu(window=4, length=4)
    seq, n = 7, npu.array_size
    case = AttentionCase(rng, npu, queries=seq, keys=seq, d_model=16, col=0, d_head=8)
    rw = case.rw
    common = {"size": n, "queries": seq, "keys": seq, "q_base": 0, "k_base": seq * rw,
              "v_base": 2 * seq * rw, "o_base": case.o_base, "q_row_words": rw,
              "k_row_words": rw, "v_row_words": rw, "o_row_words": rw,
              "score_mult": SCORE_MULT, "score_shift": SCORE_SHIFT, "out_mult": OUT_MULT,
              "out_shift": OUT_SHIFT}
    launches = [
        attention_launch(d_head=8, col=0, bidirectional=True, window=2, interleaved=True,
                         halo=1, **common),
        attention_launch(d_head=8, col=8, interleaved=True, window=3, q_pos=5, k_pos=5,
                         **common),
        attention_launch(d_head=4, col=4, bidirectional=True, window=2, interleaved=True,
                         halo=1, q_pos=9, k_pos=9, **common),
    ]
    got = case.run_iss(launches)
    # (head columns, mask, lanes of the head still in memory: launch 2 overwrites 4..7)
    heads = [(slice(0, 8), attention_mask(seq, 2, False), slice(0, 4)),
             (slice(8, 16), attention_mask(seq, 3, True), slice(0, 8)),
             (slice(4, 8), attention_mask(seq, 2, False), slice(0, 4))]
    for i, (cols, mask, kept) in enumerate(heads):
        want = attention_reference(case.q[:, cols], case.k[:, cols], case.v[:, cols], mask)[:, kept]
        bad = np.argwhere(got[:, cols][:, kept] != want)
        assert not len(bad), f"launch {i} query {bad[0][0]} lane {bad[0][1]} differs"
    mem, _ = run_engine(case, rng, launches=launches)
    assert_memories_equal(mem, case.iss.mem)


@pytest.mark.parametrize("seed, d_model, d_head, col, k_col, v_col, causal", [
    (30, 16, 6, 6, 10, 2, True),      # 6-lane heads on 4-lane words: rows of 2, 3, 2 words
    (31, 12, 3, 5, 0, 9, False),      # 3-lane heads: one and two words, every lane offset
    (32, 8, 2, 2, 6, 4, True),        # four heads to a word (d_model 8 holds 4 heads of 2)
])
def test_packed_heads(seed, d_model, d_head, col, k_col, v_col, causal):
    """A head narrower than a word, or not whole words, at any lane: Q, K and V each from
    their own lane offset (packed rows, grouped-query K/V heads), the output written into the
    head's lanes only (the other lanes of its words keep their garbage); ISS = golden, RTL =
    ISS."""
    rng = seeded(seed)
    npu = attention_npu()
    seq = 6
    case = AttentionCase(rng, npu, queries=seq, keys=seq, d_model=d_model, col=col,
                         d_head=d_head, k_col=k_col, v_col=v_col, bidirectional=not causal)
    q = case.q[:, col:col + d_head]
    k, v = case.k[:, k_col:k_col + d_head], case.v[:, v_col:v_col + d_head]
    want = attention_reference(q, k, v, attention_mask(seq, 0, causal))
    case.check_against(case.run_iss(), want)
    check_rtl(case, rng)


# --- timing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("npu_kw, queries, keys, d_head, kw, closed", [
    ({}, 6, 6, 8, {}, 121),                                                  # buffer-bound
    ({"window": 4, "length": 8}, 5, 3, 8, {"bidirectional": True}, 85),      # softmax-bound
    ({"window": 4, "length": 10}, 6, 6, 4, {"interleaved": True}, 266),      # P = 2, wraps
    ({"window": 6, "length": 8}, 5, 8, 8, {"interleaved": True, "halo": 3}, 175),
    ({"window": 4, "length": 8}, 6, 4, 4, {"interleaved": True, "halo": 2}, None),  # keys run out
    ({"size": 2, "window": 2, "length": 2, "dmax": 16}, 4, 4, 16, {}, None),  # w > W + 5
    ({}, 5, 5, 6, {"col": 2, "k_col": 1, "v_col": 3}, None),        # packed: 2, 2, 3, 2 words
    ({"window": 4, "length": 8}, 6, 6, 3, {"col": 1, "k_col": 3, "v_col": 0,
                                           "interleaved": True}, None),   # 1, 2, 1, 1 words
    # attention_pipeline = "deep": the output registers, 3 cycles a launch; the softmax's
    # sixth row stage, T = 2 cycles per query
    ({"pipeline": "deep"}, 6, 6, 8, {}, 126),
    ({"window": 6, "length": 8, "pipeline": "deep"}, 5, 8, 8, {"interleaved": True, "halo": 3},
     188),
    ({"pipeline": "deep"}, 5, 5, 6, {"col": 2, "k_col": 1, "v_col": 3}, None),
])
def test_cycles(npu_kw, queries, keys, d_head, kw, closed):
    """With every word available and ``o`` always ready the engine takes exactly
    ``launch_cycles`` (and the closed forms of docs/isa.md where they apply); with random idle
    and backpressure never fewer."""
    npu = attention_npu(**npu_kw)
    W, L, n = npu.attn_window, npu.softmax_len, npu.array_size
    rng = np.random.default_rng(7)
    kw = {"col": 0, **kw}
    case = AttentionCase(rng, npu, queries=queries, keys=keys,
                         d_model=d_head + max(kw["col"], kw.get("k_col", 0), kw.get("v_col", 0)),
                         d_head=d_head, **kw)
    case.run_iss()
    model = launch_cycles(case.launch.regs, window=W, length=L, size=n,
                          pipeline=npu.attention_pipeline)
    w, T = d_head // n, L // softmax_lanes(L)
    x = 3 if npu.attention_pipeline == "deep" else 0
    et = softmax_stages(npu.attention_pipeline) * T      # 5T, or 6T deep
    if closed is not None:
        if kw.get("interleaved"):
            formula = w * (kw.get("halo", 0) + 2) + queries * (2 * W + et + 11) + x
        else:
            formula = (w * (keys + 1) + 2 * W + et + 11 + x
                       + (queries - 1) * max(W + 6, et + 2))
        assert model == formula == closed, f"model {model}, closed form {formula}, {closed}"
    cycles = check_rtl(case, rng, idle=0, stall=0)
    assert cycles == model, f"RTL took {cycles} cycles, the model says {model}"
    slow = check_rtl(case, rng, idle=0.3, stall=0.3)
    assert slow >= model, f"RTL with idle/backpressure took {slow} < {model} cycles"
    print(f"cycles={cycles} with idle/backpressure {slow}")


# --- constructor -------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, exc, match", [
    ({"window": 8.0}, TypeError, "window must be an integer, not 8.0"),
    ({"size": True}, TypeError, "size must be an integer, not True"),
    ({"size": 1}, ValueError, "size must be at least 2, not 1"),
    ({"window": 0}, ValueError, "window must be at least 1, not 0"),
    ({"length": 6}, ValueError, r"length=6 must be at least max\(window=8, 2\)"),
    ({"d_head": 0}, ValueError, "d_head must be at least 1, not 0"),
    ({"window": 65537, "length": 65537}, ValueError, "window=65537 exceeds the 16-bit"),
    ({"pipeline": "fast"}, ValueError,
     r"^attention_pipeline='fast' is not one of 'short', 'deep'$"),
])
def test_constructor_rejects(kw, exc, match):
    args = {"window": 8, "d_head": 8, "length": 8, "size": 4, **kw}
    with pytest.raises(exc, match=match):
        AttentionEngine(**args)


def test_softmax_lanes():
    assert [softmax_lanes(x) for x in (2, 3, 5, 6, 8, 9, 16, 64)] == [2, 3, 1, 3, 4, 3, 4, 4]
    assert AttentionEngine.for_npu(attention_npu()).lanes_per_cycle == 4

