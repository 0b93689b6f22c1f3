"""VectorUnit (hw.tile.vector) vs the golden model (sim.golden.vector), bit for bit.

Every test drives all six streams with seeded random idle cycles and backpressure (except the
cycle-count test, which measures the ideal case), and compares each lane of each beat, naming
the command, beat and lane on a mismatch (sim.rtl.vector_driver). Configurations are small
(lanes = 4, vectors <= 24 elements) because Amaranth's simulator is slow, except one
full-scale LayerNorm at each preset's d_model_max (64 on 4 lanes, 512 on 8 lanes). The
bit-exact and cycle tests run both pipelines (``pipeline``: the NPU file's
``vector_pipeline``, short and deep).
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.back import rtlil
from amaranth.hdl import Fragment

from hw.spec import npu_preset
from hw.spec.timing.vector import PIPELINES, op_cycles
from hw.spec.vector import (
    GELU16_KNOTS,
    LUT_ENTRIES,
    VectorCmd,
    VectorOp,
    beats,
    lut16_beats,
    lut_beats,
    pack_gamma_beta,
    pack_requant,
)
from hw.tile.vector import VectorUnit, cmd_layout
from sim.golden.vector import gelu_table, ln_stats, residual_add
from sim.rtl.pysim import run_sim, send_all, stream_put
from sim.rtl.vector_driver import check_outputs, command_beats, prepare, simulate_pysim
from tests.helpers import beat_rows, exported_verilog, seeded, vector_size_rejections

LANES = 4
IDLE = 0.3
STALL = 0.3


@pytest.fixture(params=PIPELINES)
def pipeline(request):
    """The unit's pipeline: every test that takes it runs on both."""
    return request.param


@pytest.fixture(params=["short", pytest.param("deep", marks=pytest.mark.slow)])
def pipeline_s(request):
    """Both pipelines, the deep one behind ``slow`` (the default suite's deep runs cover every
    op: the element-wise, MUL, LUT, LayerNorm, ARGMAX/ONEHOT and cycle tests)."""
    return request.param


def run_program(program, *, lanes=LANES, d_model_max=32, rng=None, idle=IDLE, stall=STALL,
                max_cycles=20_000, pipeline="short"):
    """Run ``program`` = [(cmd, a, b, stats)] on the RTL with random idle and backpressure;
    every output lane is checked against golden. Returns the golden outputs and figures."""
    run = simulate_pysim(program, lanes=lanes, d_model_max=d_model_max, rng=rng, idle=idle,
                         stall=stall, max_cycles=max_cycles, pipeline=pipeline)
    return run["expected"], run


def _ln_params(rng, length):
    gamma = rng.integers(-(1 << 15), 1 << 15, length)
    beta = rng.integers(-(1 << 12), 1 << 12, length)
    return pack_gamma_beta(gamma, beta)


# ---- constructor -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, match", vector_size_rejections(1))
def test_init_rejects(kwargs, error, match):
    with pytest.raises(error, match=match):
        VectorUnit(**kwargs)


def test_init_positional_rejected():
    with pytest.raises(TypeError):
        VectorUnit(4, 64)


def test_properties():
    unit = VectorUnit(lanes=3, d_model_max=10)
    Fragment.get(unit, None)  # elaborates (and so is not reported as unused)
    assert (unit.lanes, unit.d_model_max, unit.buffer_depth) == (3, 10, 4)
    assert unit.pipeline == "short"
    deep = VectorUnit(lanes=3, d_model_max=10, pipeline="deep")
    Fragment.get(deep, None)
    assert deep.pipeline == "deep"


def test_deep_products_are_registered_multipliers():
    """With ``ecp5_dsp`` every product of the deep pipeline is a MULT18X18D instance (none
    left to Yosys' mapping of ``*``): 11 per lane (step 0's two partial products, t * Y's four,
    GELU16's, z * gamma's two, the q8 requantiser's, a square) and the rsqrt's 20; the short
    pipeline has no registered product, so the flag leaves it as it is."""
    def cells(**kwargs):
        text = rtlil.convert(VectorUnit(lanes=2, d_model_max=8, **kwargs))
        return text.count("cell \\MULT18X18D "), text.count("cell $mul ")
    assert cells(pipeline="deep", ecp5_dsp=True) == (11 * 2 + 20, 0)
    assert cells(pipeline="short", ecp5_dsp=True)[0] == 0
    with pytest.raises(TypeError, match=r"^ecp5_dsp must be a bool, not 1$"):
        VectorUnit(lanes=2, d_model_max=8, ecp5_dsp=1)


def test_init_rejects_pipeline():
    with pytest.raises(ValueError, match=r"^vector_pipeline='fast' is not one of 'short', "
                                         r"'deep'$"):
        VectorUnit(lanes=4, d_model_max=16, pipeline="fast")


# ---- element-wise ops ------------------------------------------------------------------------

def test_elementwise_random(rng, pipeline):
    i16 = (-(1 << 15), 1 << 15)
    i32 = (-(1 << 31), 1 << 31)
    program = []
    for length in (1, 4, 7, 13):
        a16, b16 = rng.integers(*i16, length), rng.integers(*i16, length)
        program.append((VectorCmd(VectorOp.ADD, length), a16, b16, None))
        program.append((VectorCmd(VectorOp.BIAS, length), rng.integers(*i32, length),
                        rng.integers(*i32, length), None))
        program.append((VectorCmd(VectorOp.REQUANT, length, mult=int(rng.integers(1, 1 << 16)),
                                  shift=int(rng.integers(8, 24))), a16, None, None))
        program.append((VectorCmd(VectorOp.REQUANT, length, out16=True,
                                  mult=int(rng.integers(1, 1 << 16)),
                                  shift=int(rng.integers(14, 30))),
                        rng.integers(*i32, length), None, None))
        program.append((VectorCmd(VectorOp.REQUANT, length, per_channel=True, out16=bool(
            length % 2)), rng.integers(*i32, length),
            pack_requant(rng.integers(0, 1 << 16, length), rng.integers(1, 48, length)), None))
        program.append((VectorCmd(VectorOp.RELU, length), rng.integers(*i32, length), None,
                        None))
        program.append((VectorCmd(VectorOp.LUT, length), rng.integers(-128, 128, length), None,
                        None))
    run_program(program, rng=rng, pipeline=pipeline)


def test_saturation(rng, pipeline_s):
    """The residual add and every requantisation saturate at both ends, never wrap."""
    big = np.array([32767, -32768, 30000, -30000, 1, -1, 32767, -32768])
    program = [
        (VectorCmd(VectorOp.ADD, 8), big, big, None),
        (VectorCmd(VectorOp.ADD, 8), big, -big, None),
        # int16 -> int8 with gain 4: everything beyond +-32 saturates.
        (VectorCmd(VectorOp.REQUANT, 8, mult=1 << 15, shift=13), big, None, None),
        # int32 -> int16 with gain 1 (mult 2**15, shift 15).
        (VectorCmd(VectorOp.REQUANT, 6, mult=1 << 15, shift=15, out16=True),
         np.array([2**31 - 1, -2**31, 40000, -40000, 32767, -32768]), None, None),
        # int8 -> int16 with gain 65535 / 2: int8 extremes saturate int16.
        (VectorCmd(VectorOp.REQUANT, 4, mult=65535, shift=1, out16=True),
         np.array([127, -128, 1, -1]), None, None),
        (VectorCmd(VectorOp.REQUANT, 4, per_channel=True),
         np.array([2**31 - 1, -2**31, 1000, -1000]),
         pack_requant([65535, 65535, 1, 1], [1, 1, 47, 47]), None),
    ]
    expected, _ = run_program(program, rng=rng, pipeline=pipeline_s)
    assert list(expected[0]["data"]) == [32767, -32768, 32767, -32768, 2, -2, 32767, -32768]
    assert list(expected[2]["data"][:2]) == [127, -128]
    assert list(expected[3]["data"][:4]) == [32767, -32768, 32767, -32768]
    assert list(expected[4]["data"][:2]) == [32767, -32768]
    assert list(expected[5]["data"]) == [127, -128, 0, 0]


# ---- MUL (the gated FFN's product) ---------------------------------------------------------

def test_mul_random_and_saturating(rng, pipeline):
    """MUL: the int8 product of the operands' low bytes, requantised per tensor (int8, or
    int16 with out16), on random vectors (operands wider than int8 too: only the low byte
    counts), interleaved with ADD back to back, and at the extremes: (-128)^2 with a gain
    saturates int8 and int16 at both ends, and a small gain rounds half up."""
    program = []
    for length in (1, 5, 8, 13):
        a8, b8 = rng.integers(-128, 128, length), rng.integers(-128, 128, length)
        program.append((VectorCmd(VectorOp.MUL, length, mult=int(rng.integers(1, 1 << 16)),
                                  shift=int(rng.integers(14, 24))), a8, b8, None))
        program.append((VectorCmd(VectorOp.ADD, length), a8, b8, None))
        program.append((VectorCmd(VectorOp.MUL, length, out16=True,
                                  mult=int(rng.integers(1, 1 << 16)),
                                  shift=int(rng.integers(8, 16))),
                        rng.integers(-(1 << 31), 1 << 31, length),
                        rng.integers(-(1 << 15), 1 << 15, length), None))
    ext = np.array([-128, -128, 127, 127, -128, 1, 0, -1])
    other = np.array([-128, 127, 127, -128, 1, -1, -128, -1])
    program += [
        (VectorCmd(VectorOp.MUL, 8, mult=1 << 15, shift=15), ext, other, None),   # gain 1
        (VectorCmd(VectorOp.MUL, 8, mult=65535, shift=1, out16=True), ext, other, None),
        (VectorCmd(VectorOp.MUL, 8, mult=1, shift=1), ext, other, None),          # a*b/2
    ]
    expected, _ = run_program(program, rng=rng, pipeline=pipeline)
    products = ext * other
    assert list(expected[-3]["data"]) == list(np.clip(products, -128, 127))
    assert set(expected[-2]["data"][:5]) <= {-32768, 32767}
    assert list(expected[-1]["data"]) == list(np.clip((products + 1) >> 1, -128, 127))


def test_lut_load_then_apply(rng, pipeline):
    """The LUT resets to ReLU, is reloaded at run time (GELU), and applies per lane."""
    x = rng.integers(-128, 128, 11)
    gelu = gelu_table(4.0 / 128, 4.0 / 128)
    program = [
        (VectorCmd(VectorOp.LUT, 11), x, None, None),
        (VectorCmd(VectorOp.LOAD_LUT, 0), gelu, None, None),
        (VectorCmd(VectorOp.LUT, 11), x, None, None),
        (VectorCmd(VectorOp.LUT, 8), np.arange(-128, 128, 32), None, None),
    ]
    expected, _ = run_program(program, rng=rng, pipeline=pipeline)
    assert list(expected[0]["data"]) == list(np.maximum(x, 0))
    assert list(expected[2]["data"]) == list(gelu[x & 0xFF])
    assert len(gelu) == LUT_ENTRIES


# ---- LayerNorm ---------------------------------------------------------------------------

def test_layernorm_random_and_edges(rng, pipeline):
    program = []
    for length, x in [
        (5, rng.integers(-(1 << 15), 1 << 15, 5)),
        (8, rng.integers(-300, 300, 8)),
        (13, np.full(13, -1234)),                                    # variance 0
        (16, rng.choice([-(1 << 15), (1 << 15) - 1], 16)),           # full scale
        (3, np.array([0, 0, 1])),                                    # smallest variance
    ]:
        program.append((VectorCmd(VectorOp.LN, length, gshift=int(rng.integers(16, 22)),
                                  mult=int(rng.integers(1 << 14, 1 << 16)), shift=23),
                        x, _ln_params(rng, length), None))
    expected, _ = run_program(program, rng=rng, pipeline=pipeline)
    beta = program[2][2] >> 16
    assert np.array_equal(expected[2]["data"], beta), "constant vector: y16 must equal beta"


@pytest.mark.parametrize("cuts", [[0, 7, 18], [0, 7, 9, 18], [0, 1, 6, 14, 18]])
@pytest.mark.parametrize("full, apply", [(VectorOp.LN, VectorOp.LN_APPLY),
                                         (VectorOp.RMS, VectorOp.RMS_APPLY)])
def test_partial_statistics_uneven_shards(rng, cuts, full, apply, pipeline_s):
    """LN_STATS on 2, 3 and 4 uneven shards, summed, then LN_APPLY (RMS_APPLY) == the full LN
    (RMS) bit for bit; RMSNorm's parameters have no beta."""
    x = rng.integers(-(1 << 15), 1 << 15, 18)
    params = _ln_params(rng, 18) if full is VectorOp.LN else \
        pack_gamma_beta(rng.integers(-(1 << 15), 1 << 15, 18), 0)
    knobs = {"gshift": 18, "mult": 40000, "shift": 24}
    shards = [slice(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]
    stats = [ln_stats(x[s]) for s in shards]
    total = (sum(s for s, _ in stats), sum(s for _, s in stats))
    program = [(VectorCmd(full, 18, **knobs), x, params, None)]
    program += [(VectorCmd(VectorOp.LN_STATS, s.stop - s.start), x[s], None, None)
                for s in shards]
    program += [(VectorCmd(apply, s.stop - s.start, n=18, **knobs), x[s], params[s], total)
                for s in shards]
    expected, _ = run_program(program, rng=rng, pipeline=pipeline_s)
    k = len(shards)
    for i in range(k):
        assert tuple(expected[1 + i]["stats"]) == stats[i]
    for key in ("data", "q"):
        merged = np.concatenate([expected[1 + k + i][key] for i in range(k)])
        assert np.array_equal(merged, expected[0][key]), (apply.name, key)


# ---- RMSNorm -------------------------------------------------------------------------------

def test_rmsnorm_random_and_edges(rng, pipeline_s):
    """RMS and RMS_APPLY (S1 taken as 0) on random vectors, an all-zero vector, full-scale and
    saturating values, interleaved with LN and LN_APPLY back to back (the flag must not leak
    into the next command: a LayerNorm of a vector with a large mean differs from its RMSNorm)."""
    program = []
    cases = [
        (5, rng.integers(-(1 << 15), 1 << 15, 5)),
        (8, rng.integers(-300, 300, 8) + 20000),                    # large mean
        (13, np.zeros(13, dtype=np.int64)),                         # D = 0: y16 = beta
        (16, rng.choice([-(1 << 15), (1 << 15) - 1], 16)),          # full scale
        (11, np.full(11, -(1 << 15))),                              # constant: z = -1
        (1, np.array([7])),
    ]
    for length, x in cases:
        knobs = {"gshift": int(rng.integers(14, 22)), "mult": int(rng.integers(1 << 14, 1 << 16)),
                 "shift": 23}
        params = _ln_params(rng, length)
        program.append((VectorCmd(VectorOp.RMS, length, **knobs), x, params, None))
        program.append((VectorCmd(VectorOp.LN, length, **knobs), x, params, None))
        # Global statistics whose sum x RMS_APPLY must ignore (LN_APPLY uses it).
        stats = ln_stats(x)
        program.append((VectorCmd(VectorOp.RMS_APPLY, length, n=length, **knobs), x, params,
                        stats))
        program.append((VectorCmd(VectorOp.LN_APPLY, length, n=length, **knobs), x, params,
                        stats))
    # gamma = 2**15 - 1, gshift 12: |y| up to 8 * 32767 * sqrt(n): saturates int16 and int8.
    x = rng.choice([-(1 << 15), (1 << 15) - 1], 9)
    program.append((VectorCmd(VectorOp.RMS, 9, gshift=12, mult=65535, shift=8), x,
                    pack_gamma_beta(np.full(9, (1 << 15) - 1), 0), None))
    expected, _ = run_program(program, rng=rng, pipeline=pipeline_s)
    for k in range(len(cases)):
        rms, ln, rms_apply, ln_apply = expected[4 * k:4 * k + 4]
        for key in ("data", "q"):
            assert np.array_equal(rms[key], rms_apply[key])
            assert np.array_equal(ln[key], ln_apply[key])
    assert not np.array_equal(expected[4]["data"], expected[5]["data"]), "mean must matter"
    beta = program[8][2] >> 16
    assert np.array_equal(expected[8]["data"], beta), "zero vector: y16 must equal beta"
    assert set(expected[-1]["data"]) <= {-32768, 32767}, "int16 saturates"
    assert set(expected[-1]["q"]) <= {-128, 127}


def test_layernorm_tiny_preset_full_scale(rng, pipeline_s):
    """Full-scale int16 at the tiny preset's d_model_max (64), its lanes, back to back with a
    post-norm residual add: ADD then LN emitting the int16 residual and the int8 input."""
    npu = npu_preset("tiny")
    n = npu.d_model_max
    x = rng.choice([-(1 << 15), (1 << 15) - 1], n)
    r = rng.integers(-(1 << 15), 1 << 15, n)
    program = [
        (VectorCmd(VectorOp.LN, n, gshift=19, mult=1 << 15, shift=23), x, _ln_params(rng, n),
         None),
        (VectorCmd(VectorOp.ADD, n), x, r, None),
        (VectorCmd(VectorOp.LN, n, gshift=17, mult=1 << 15, shift=24), residual_add(x, r),
         _ln_params(rng, n), None),
    ]
    run_program(program, lanes=npu.vector_lanes, d_model_max=n, rng=rng, pipeline=pipeline_s)


def argmax_rows(rng, lanes):
    """int16 rows for ARGMAX: random, ties, the maximum at lane 0, at the last lane, at a beat
    boundary, all equal, all -32768, all negative; lengths not a multiple of ``lanes``."""
    i16 = (-(1 << 15), 1 << 15)
    rows = [rng.integers(*i16, 13), rng.integers(-3, 3, 11), rng.integers(-50, -1, 9)]
    tie = rng.integers(-100, 100, 10)
    tie[[3, 7]] = 500                       # a tie across beats: index 3 wins
    first = rng.integers(-100, 100, 7)
    first[0] = 32767
    last = rng.integers(-100, 100, 9)
    last[-1] = 1000                         # the last, lone lane of the last beat
    edge = rng.integers(-100, 100, 12)
    edge[lanes] = 999                       # lane 0 of the second beat
    edge[lanes - 1] = 999                   # ... tied with the lane before it: it wins
    rows += [tie, first, last, edge, np.full(6, 42), np.full(5, -(1 << 15)), np.array([-7])]
    return rows


def test_argmax_onehot_random_and_edges(rng, pipeline):
    """ARGMAX (index + n, maximum) and ONEHOT (1 at index - n, in and outside the row) against
    the golden model, random idle and backpressure."""
    program = []
    for k, x in enumerate(argmax_rows(rng, LANES)):
        program.append((VectorCmd(VectorOp.ARGMAX, len(x), n=[0, 5, 65535][k % 3]), x, None,
                        None))
    for index, n, length in [(0, 0, 9), (8, 0, 9), (4, 0, 9), (107, 100, 13), (99, 100, 13),
                             (113, 100, 13), (-1, 0, 4), (131069, 65535, 5), (3, 3, 1)]:
        program.append((VectorCmd(VectorOp.ONEHOT, length, n=n), None, None,
                        (index, int(rng.integers(-100, 100)))))
    # Pair mode: the largest value, then the lowest (signed) index, wherever it sits.
    for recs in ([(500, 9), (3, 9), (77, -4)], [(5, -32768)], [(-2, 1), (7, 1), (-9, 0)],
                 [(int(i), int(v)) for i, v in zip(rng.integers(0, 1 << 17, 7),
                                                   rng.integers(-3, 3, 7), strict=True)]):
        program.append((VectorCmd(VectorOp.ARGMAX, len(recs), pairs=True), None, None, recs))
    run_program(program, rng=rng, pipeline=pipeline)


# ---- timing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("op, length, repeat", [
    (VectorOp.ADD, 13, 1), (VectorOp.REQUANT, 8, 1), (VectorOp.LUT, 3, 1), (VectorOp.LN, 10, 1),
    (VectorOp.LN_STATS, 9, 1), (VectorOp.LN_APPLY, 10, 1), (VectorOp.LOAD_LUT, 0, 1),
    (VectorOp.RMS, 10, 1), (VectorOp.RMS_APPLY, 10, 1), (VectorOp.MUL, 13, 1),
    (VectorOp.MUL, 8, 3), (VectorOp.ADD, 8, 3), (VectorOp.RELU, 1, 4), (VectorOp.GELU16, 13, 1),
    (VectorOp.GELU16, 8, 3), (VectorOp.LOAD_LUT16, 0, 1), (VectorOp.LOAD_LUT16, 0, 2),
    (VectorOp.ARGMAX, 9, 1), (VectorOp.ONEHOT, 10, 1), ("pairs", 5, 1),
])
def test_cycles_match_formula(rng, op, length, repeat, pipeline):
    """Cycles from the first i_cmd transfer to the last output transfer (a table load: its last
    input transfer) equal :func:`op_cycles`, plus B + 1 per further back-to-back command of B
    beats; ideal streams."""
    dut = VectorUnit(lanes=LANES, d_model_max=16, pipeline=pipeline)
    pairs = op == "pairs"
    op = VectorOp.ARGMAX if pairs else op
    cmd = VectorCmd(op, length, n=0 if pairs else length, shift=4, pairs=pairs)
    size = {VectorOp.LOAD_LUT: LUT_ENTRIES, VectorOp.LOAD_LUT16: GELU16_KNOTS}.get(op, length)
    loads = op in (VectorOp.LOAD_LUT, VectorOp.LOAD_LUT16)
    a = None if op is VectorOp.ONEHOT or pairs else rng.integers(-100, 100, size)
    stats = [(k, -k) for k in range(length)] if pairs else (1, 1000)
    a_beats, b_beats, s_beats = command_beats(cmd, a,
                                        pack_gamma_beta(rng.integers(1, 100, size), 0),
                                        stats, LANES)
    stamps = {}
    cycle = [0]

    async def counter(ctx):
        async for _ in ctx.tick():
            cycle[0] += 1

    async def drive(ctx):
        for _ in range(repeat):
            await stream_put(ctx, dut.i_cmd, cmd_layout().const(cmd.fields()))
            stamps.setdefault("cmd", cycle[0])

    async def watch(ctx):
        ctx.set(dut.o_data.ready, 1)
        ctx.set(dut.o_stats.ready, 1)
        records = op in (VectorOp.LN_STATS, VectorOp.ARGMAX)
        wanted = 0 if loads else (1 if records else beats(length, LANES))
        stream = dut.o_stats if records else dut.o_data
        for _ in range(wanted * repeat):
            await ctx.tick().until(stream.valid & stream.ready)
        stamps["out"] = cycle[0]

    async def a_src(ctx):
        await send_all(ctx, dut.i_a, a_beats * repeat)
        stamps["a"] = cycle[0]

    async def b_src(ctx):
        await send_all(ctx, dut.i_b, b_beats * repeat)

    async def s_src(ctx):
        await send_all(ctx, dut.i_stats, s_beats * repeat)

    run_sim(dut, [drive, a_src, b_src, s_src, watch], processes=[counter], max_cycles=2000)
    end = stamps["a"] if loads else stamps["out"]
    measured = end - stamps["cmd"]
    formula = op_cycles(op, length, LANES, pairs=pairs, pipeline=pipeline) + (repeat - 1) * (
        beats(size, LANES) + 1)
    assert measured == formula, (f"{op.name} length {length} x{repeat}, {pipeline} pipeline: "
                                 f"measured {measured} cycles, formula {formula}")
    assert (lut_beats(LANES), lut16_beats(LANES)) == (64, 65)


# ---- exported Verilog ------------------------------------------------------------------------

@pytest.mark.verilator
def test_verilator_matches_golden(verilator_ok, tmp_path):
    """`npu export --top vector` (tiny preset) under cocotb + Verilator: every op (RMSNorm's
    and MUL too), golden-exact;
    a lone LayerNorm takes the documented number of cycles, the whole program as many cycles
    as in Amaranth's simulator."""
    from sim.rtl.cocotb_tb import run_cocotb

    npu = npu_preset("tiny")
    lanes = npu.vector_lanes
    text = exported_verilog(tmp_path, "vector", npu)
    rng = seeded(33)
    x = rng.integers(-(1 << 15), 1 << 15, npu.d_model_max)
    params = _ln_params(rng, npu.d_model_max)
    knobs = {"gshift": 19, "mult": 50000, "shift": 24}
    lone = [(VectorCmd(VectorOp.LN, npu.d_model_max, **knobs), x, params, None)]
    half = npu.d_model_max // 2 + 3
    total = tuple(sum(v) for v in zip(ln_stats(x[:half]), ln_stats(x[half:]), strict=True))
    program = lone + [
        (VectorCmd(VectorOp.ADD, 10), rng.integers(-(1 << 15), 1 << 15, 10),
         rng.integers(-(1 << 15), 1 << 15, 10), None),
        (VectorCmd(VectorOp.BIAS, 5), rng.integers(-(1 << 31), 1 << 31, 5),
         rng.integers(-(1 << 31), 1 << 31, 5), None),
        (VectorCmd(VectorOp.REQUANT, 7, mult=40000, shift=12), rng.integers(-(1 << 15), 1 << 15,
                                                                              7), None, None),
        (VectorCmd(VectorOp.REQUANT, 6, per_channel=True, out16=True),
         rng.integers(-(1 << 31), 1 << 31, 6),
         pack_requant(rng.integers(0, 1 << 16, 6), rng.integers(1, 48, 6)), None),
        (VectorCmd(VectorOp.RELU, 3), rng.integers(-100, 100, 3), None, None),
        (VectorCmd(VectorOp.MUL, 11, mult=30000, shift=14), rng.integers(-128, 128, 11),
         rng.integers(-128, 128, 11), None),
        (VectorCmd(VectorOp.LOAD_LUT, 0), gelu_table(0.04, 0.03), None, None),
        (VectorCmd(VectorOp.LUT, 9), rng.integers(-128, 128, 9), None, None),
        (VectorCmd(VectorOp.LN_STATS, half), x[:half], None, None),
        (VectorCmd(VectorOp.LN_STATS, len(x) - half), x[half:], None, None),
        (VectorCmd(VectorOp.LN_APPLY, half, n=len(x), **knobs), x[:half], params[:half], total),
        (VectorCmd(VectorOp.LN_APPLY, len(x) - half, n=len(x), **knobs), x[half:],
         params[half:], total),
        (VectorCmd(VectorOp.RMS, npu.d_model_max, **knobs), x, params, None),
        (VectorCmd(VectorOp.RMS_APPLY, half, n=len(x), **knobs), x[:half], params[:half],
         total),
        (VectorCmd(VectorOp.RMS_APPLY, len(x) - half, n=len(x), **knobs), x[half:],
         params[half:], total),
    ]
    results = {}
    for name, prog in (("lone", lone), ("program", program)):
        job = prepare(prog, lanes)
        data = {"lanes": lanes, "n_data": job["n_data"], "n_stats": job["n_stats"],
                "cmds": np.array([[c[f] for f in ("op", "length", "n", "mult", "shift",
                                                   "gshift", "out16", "per_channel")]
                                  for c in job["cmds"]], dtype=np.int64),
                "a": beat_rows(job["a"], lanes), "b": beat_rows(job["b"], lanes),
                "stats": beat_rows(job["stats"], 2)}
        out = run_cocotb(text, top="npu_vector", test_module="tb_vector", data=data)
        check_outputs(prog, job["expected"], [tuple(b) for b in out["data"]],
              [tuple(s) for s in out["stats"]], lanes, label=f"verilator {name}")
        results[name] = out
    assert results["lone"]["cycles"] == op_cycles(VectorOp.LN, npu.d_model_max, lanes)
    pysim = simulate_pysim(program, lanes=lanes, d_model_max=npu.d_model_max)
    assert results["program"]["cycles"] == pysim["cycles"], (
        f"verilator {results['program']['cycles']} cycles, pysim {pysim['cycles']}")


def test_layernorm_fpga_preset_full_scale_512(rng):
    """Full-scale int16 LayerNorm at d_model 512 (the largest simulable d_model_max) on the
    fpga preset's 8 lanes and pipeline, plus partial statistics over 3 uneven shards of it."""
    npu = npu_preset("fpga")
    n = npu.d_model_max
    x = rng.choice([-(1 << 15), (1 << 15) - 1], n)
    params = _ln_params(rng, n)
    knobs = {"gshift": 20, "mult": 1 << 15, "shift": 24}
    cuts = [0, 100, 101, n]
    shards = [slice(cuts[i], cuts[i + 1]) for i in range(3)]
    stats = [ln_stats(x[s]) for s in shards]
    total = (sum(s for s, _ in stats), sum(s for _, s in stats))
    program = [(VectorCmd(VectorOp.LN, n, **knobs), x, params, None)]
    program += [(VectorCmd(VectorOp.LN_APPLY, s.stop - s.start, n=n, **knobs), x[s], params[s],
                 total) for s in shards]
    expected, _ = run_program(program, lanes=npu.vector_lanes, d_model_max=n, rng=rng,
                              idle=0.1, stall=0.1, pipeline=npu.vector_pipeline)
    merged = np.concatenate([expected[1 + i]["data"] for i in range(3)])
    assert np.array_equal(merged, expected[0]["data"])
