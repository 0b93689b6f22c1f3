"""The engines' cycle models (sim.timing.engines) alone, every word available: the closed forms
the gateware's own tests hold the engines to."""

import pytest

from hw.spec.attention import FLAG_PARTIAL, FLAG_REDUCED, FLAG_STATE_IN, FLAG_STATE_OUT
from hw.spec.formats import OutMode
from hw.spec.timing import attention as attn_timing
from hw.spec.timing import vector as vec_timing
from hw.spec.timing.matmul import REQUANT_LATENCY, unit_latency
from hw.spec.vector import VectorOp
from hw.spec.vector_engine import VecFlags
from sim.timing.engines import AttentionModel, MatmulModel, VectorModel


def cycles(model, step, regs, limit=100_000):
    """Cycles from the configuration beat to the engine's idle, with every read port offering
    a word and every write port taking one."""
    model.start(regs)
    for t in range(limit):
        if not model.active:
            return t
        step(model)
    raise AssertionError("never idle")


@pytest.mark.parametrize("flags, op, length", [
    (VecFlags(a_bytes=2, b_bytes=2, d_bytes=2), VectorOp.ADD, 32),
    (VecFlags(a_bytes=1, b_bytes=1, d_bytes=1), VectorOp.MUL, 32),
    (VecFlags(a_bytes=1, d_bytes=1), VectorOp.LUT, 20),
    (VecFlags(a_bytes=4, b_bytes=4, d_bytes=2, per_channel=True), VectorOp.REQUANT, 12),
    (VecFlags(a_bytes=4, b_bytes=4, d_bytes=2, per_channel=True), VectorOp.REQUANT, 9),
    (VecFlags(a_bytes=4, d_bytes=2), VectorOp.RELU, 13),
    (VecFlags(a_bytes=2, b_bytes=4, d_bytes=2, wr_q=True), VectorOp.LN, 32),
    (VecFlags(a_bytes=2, b_bytes=4, d_bytes=2, wr_q=True), VectorOp.RMS, 32),
    (VecFlags(a_bytes=2, b_bytes=4, d_bytes=2, wr_q=True), VectorOp.LN_APPLY, 24),
    (VecFlags(a_bytes=2, b_bytes=4, d_bytes=2, wr_q=True), VectorOp.RMS_APPLY, 24),
    (VecFlags(a_bytes=1, wr_data=False), VectorOp.LOAD_LUT, 256),
    (VecFlags(a_bytes=2, wr_data=False, wr_q=True), VectorOp.LN_STATS, 13),
    (VecFlags(a_bytes=1, wr_data=False, wr_q=True), VectorOp.LN_STATS, 1),
    (VecFlags(a_bytes=2, wr_data=False, wr_q=True), VectorOp.ARGMAX, 13),
    (VecFlags(a_bytes=1, wr_data=False, wr_q=True), VectorOp.ARGMAX, 1),
    (VecFlags(d_bytes=1), VectorOp.ONEHOT, 13),
    (VecFlags(d_bytes=2), VectorOp.ONEHOT, 5),
    (VecFlags(d_bytes=4), VectorOp.ONEHOT, 9),
    (VecFlags(d_bytes=1), VectorOp.ONEHOT, 1),
    (VecFlags(wr_data=False, wr_q=True, pairs=True), VectorOp.ARGMAX, 3),
    (VecFlags(wr_data=False, wr_q=True, pairs=True), VectorOp.ARGMAX, 1),
])
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("pipeline", vec_timing.PIPELINES)
def test_vector_model_is_the_engines_closed_form(flags, op, length, rows, pipeline):
    regs = {"VU_OP": int(op), "VU_ROWS": rows, "VU_LEN": length, "VU_FLAGS": flags.encode()}

    def step(m):
        d, q = m.out_valid()
        m.step(True, True, True, d, q)

    got = cycles(VectorModel(lanes=4, pipeline=pipeline), step, regs)
    assert got == vec_timing.launch_cycles(op, rows=rows, length=length, lanes=4, flags=flags,
                                           pipeline=pipeline)


@pytest.mark.parametrize("queries, keys, flags", [
    (6, 6, 0), (8, 8, 0), (10, 10, 2), (12, 15, 2 | 3 << 8),
    # The split-score passes: partial (bit 2) and reduced (bit 3), preload and interleaved.
    (6, 6, FLAG_PARTIAL), (8, 8, FLAG_REDUCED), (10, 10, 2 | FLAG_PARTIAL),
    (12, 15, 2 | 3 << 8 | FLAG_PARTIAL), (12, 15, 2 | 3 << 8 | FLAG_REDUCED),
    (1, 1, FLAG_PARTIAL), (1, 1, FLAG_REDUCED),
])
@pytest.mark.parametrize("words", [1, 2])
@pytest.mark.parametrize("pipeline", ["short", "deep"])
def test_attention_model_is_the_engines_closed_form(queries, keys, flags, words, pipeline):
    regs = {"AT_QUERIES": queries, "AT_KEYS": keys, "AT_FLAGS": flags, "AT_D_HEAD": 4 * words}

    def step(m):
        m.step(True, True, True, m.out_valid())

    got = cycles(AttentionModel(window=16, length=16, size=4, pipeline=pipeline), step, regs)
    assert got == attn_timing.launch_cycles(regs, window=16, length=16, size=4,
                                            pipeline=pipeline)


@pytest.mark.parametrize("queries, keys, flags", [
    (6, 6, FLAG_STATE_OUT), (8, 8, FLAG_STATE_OUT | FLAG_STATE_IN), (8, 8, FLAG_STATE_IN),
    (12, 16, FLAG_STATE_IN | 1), (1, 1, FLAG_STATE_IN), (20, 10, FLAG_STATE_OUT),
])
@pytest.mark.parametrize("d_head, window", [(4, 16), (8, 16), (8, 4), (16, 3)])
@pytest.mark.parametrize("pipeline", ["short", "deep"])
def test_attention_model_with_state_rows(queries, keys, flags, d_head, window, pipeline):
    """State rows: the merge factors, the state FIFO's rows (which bind with a small ring)
    and the rows' output, as the recurrence of ``launch_cycles``."""
    regs = {"AT_QUERIES": queries, "AT_KEYS": min(keys, window), "AT_FLAGS": flags,
            "AT_D_HEAD": d_head}

    def step(m):
        pops = m.step(True, True, True, m.out_valid())
        # The chip model counts its FIFOs' levels with them: one word at most each.
        assert all(type(p) is bool for p in pops), f"pops {pops}"

    got = cycles(AttentionModel(window=window, length=16, size=4, d_head=16, pipeline=pipeline),
                 step, regs)
    assert got == attn_timing.launch_cycles(regs, window=window, length=16, size=4, d_head=16,
                                            pipeline=pipeline)


@pytest.mark.parametrize("mode", list(OutMode))
@pytest.mark.parametrize("size, k, folds", [(4, 32, 6), (8, 64, 3), (4, 16, 1)])
def test_matmul_model_streams_one_beat_per_cycle(mode, size, k, folds):
    """Every word at once: the array's fill, one beat per cycle, its drain
    (``hw.spec.timing.matmul.unit_latency``), and the packer's words per row."""
    regs = {"MM_K": k, "MM_FOLDS": folds, "MM_MODE": int(mode)}

    def step(m):
        m.step(True, True, True, m.out_valid())

    got = cycles(MatmulModel(size), step, regs)
    ow = {OutMode.INT8: 1, OutMode.INT16: 2, OutMode.RAW: 4}[mode]
    # The requantiser's stages absorb REQUANT_LATENCY rows of a tile while the packer writes
    # a row's words; the other rows stall the array ow - 1 cycles each.
    stall = max(0, size - REQUANT_LATENCY) * (ow - 1)
    # The first beat after the transposer fills (N words), then the closed form's terms.
    assert got == folds * (k + stall) + size + unit_latency(size, 0) + \
        min(size, REQUANT_LATENCY) * (ow - 1)
