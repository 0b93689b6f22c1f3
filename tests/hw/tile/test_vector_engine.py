"""VectorEngine (hw.tile.vector_engine): VEC launches, RTL memory == ISS == golden, cycle counts."""

import dataclasses

import numpy as np
import pytest

from hw.spec.memory import pack_rows, row_words, unpack_rows
from hw.spec.timing.vector import PIPELINES, launch_cycles
from hw.spec.vector import LUT_ENTRIES, VectorCmd, VectorOp, pack_gamma_beta, pack_requant
from hw.spec.vector_engine import FLAG_BITS, STATS_IN_OPS, VecFlags
from hw.tile.vector_engine import VectorEngine
from sim.compiler.vector_launch import (
    Rows,
    add_launch,
    bias_launch,
    emit,
    ln_launch,
    load_lut_launch,
    lut_launch,
    relu_launch,
    requant_launch,
    vector_launch,
)
from sim.golden.vector import VectorUnitModel, gelu_table
from sim.rtl.vector_engine_driver import run_vector_engine
from tests.helpers import (
    assemble,
    assert_memories_equal,
    seeded,
    vector_iss,
    vector_size_rejections,
)

IDLE = 0.25
STALL = 0.25
#: Both pipelines, the deep one behind ``slow`` (the cycle tests run it in the default suite).
SHORT_DEEP_SLOW = ["short", pytest.param("deep", marks=pytest.mark.slow)]


def run_engine(launches, before, *, size, d_model_max, addr_bits, rng, idle=IDLE, stall=STALL,
               max_cycles=20_000, pipeline="short"):
    """Run ``launches`` one after the other on a VectorEngine (``sim.rtl.vector_engine_driver``)
    with the unit's ``pipeline``; return the final memory and, per launch, the cycles from its
    ``i_cfg`` transfer to its end."""
    dut = VectorEngine(lanes=size, d_model_max=d_model_max, pipeline=pipeline)
    mem, cycles, _ = run_vector_engine(dut, before, launches, addr_bits=addr_bits, rng=rng,
                                       idle=idle, stall=stall, max_cycles=max_cycles)
    return mem, cycles


def check_case(iss, launches, expect, rng, *, d_model_max=64, **kw):
    """Run the program on the ISS, check ``expect`` (``[(Rows, cols, want)]``) against golden,
    then run the engine and compare whole memories."""
    before = iss.mem.copy()
    iss.run(assemble(emit, launches))
    for t, cols, want in expect:
        got = unpack_rows(iss.read_words(t.base, t.rows * t.row_words), t.rows,
                          t.row_words * iss.n // t.eb, t.eb)[:, :cols]
        bad = np.argwhere(got != want)
        assert not len(bad), (f"ISS tensor at {t.base}: row {bad[0][0]} element {bad[0][1]} "
                              f"is {got[tuple(bad[0])]}, golden {want[tuple(bad[0])]}")
    mem, cycles = run_engine(launches, before, size=iss.n, d_model_max=d_model_max,
                             addr_bits=iss.addr_bits, rng=rng, **kw)
    assert_memories_equal(mem, iss.mem)
    return cycles


def golden_rows(op, a, b=None, **cmd):
    unit = VectorUnitModel()
    outs = [unit.execute(VectorCmd(op, a.shape[1], **cmd), a[r], None if b is None else b[r])
            for r in range(a.shape[0])]
    return np.stack([o["data"] for o in outs]), np.stack([o["q"] for o in outs])


def place(iss, base, x, eb, row_words_=None):
    """Write int matrix ``x`` at ``base`` (rows padded to ``row_words_``); return its Rows."""
    n = iss.n
    rw = row_words(x.shape[1], eb, n)
    rwp = row_words_ or rw
    padded = np.zeros((x.shape[0], rwp * n // eb), np.int64)
    padded[:, :x.shape[1]] = x
    iss.write_words(base, pack_rows(padded, eb, n))
    return Rows(base, x.shape[0], rwp, eb)


def fill(iss, rng):
    """Random bytes everywhere: words a launch must not write stay visible."""
    iss.mem[:] = rng.integers(0, 256, iss.mem.shape, dtype=np.uint8)


# ---- random cases: RTL == ISS == golden -------------------------------------------------------

@pytest.mark.parametrize("seed, size, rows, length", [(1, 4, 3, 6), (2, 2, 2, 5)])
def test_add_in_place(seed, size, rows, length):
    rng = seeded(seed)
    iss = vector_iss(size)
    fill(iss, rng)
    a = rng.integers(-(1 << 15), 1 << 15, (rows, length))
    b = rng.integers(-(1 << 15), 1 << 15, (rows, length))
    ta = place(iss, 0, a, 2, row_words(length, 2, size) + 1)
    tb = place(iss, 40, b, 2)
    launch = add_launch(size=size, length=length, a=ta, b=tb, out=ta)
    want, _ = golden_rows(VectorOp.ADD, a, b)
    check_case(iss, [launch], [(ta, length, want)], rng)


@pytest.mark.parametrize("pipeline", SHORT_DEEP_SLOW)
@pytest.mark.parametrize("seed, rows, length, with_y, rms", [
    (3, 2, 10, True, False), (4, 3, 7, False, False), (13, 2, 10, True, True)])
def test_layernorm_y_and_q(seed, rows, length, with_y, rms, pipeline):
    """LN (``rms``: RMS, its gamma/beta words with beta = 0 as the compiler stores them)."""
    rng = seeded(seed)
    size = 4
    iss = vector_iss(size)
    fill(iss, rng)
    x = rng.integers(-3000, 3000, (rows, length))
    gamma = rng.integers(-(1 << 15), 1 << 15, length)
    beta = 0 if rms else rng.integers(-(1 << 12), 1 << 12, length)
    tx = place(iss, 0, x, 2)
    gb = pack_gamma_beta(gamma, beta)[None, :]
    place(iss, 30, gb, 4)
    tq = Rows(60, rows, row_words(length, 1, size), 1)
    ty = Rows(80, rows, row_words(length, 2, size) + 1, 2) if with_y else None
    launch = ln_launch(size=size, length=length, x=tx, gamma_beta_base=30, q=tq, y=ty,
                       gshift=17, mult=20000, shift=20, rms=rms)
    assert launch.op is (VectorOp.RMS if rms else VectorOp.LN)
    y, q = golden_rows(launch.op, x, np.repeat(gb, rows, 0), gshift=17, mult=20000, shift=20)
    expect = [(tq, length, q)] + ([(ty, length, y)] if with_y else [])
    check_case(iss, [launch], expect, rng, pipeline=pipeline)


def test_load_lut_then_lut():
    rng = seeded(5)
    size, rows, length = 4, 2, 9
    iss = vector_iss(size)
    fill(iss, rng)
    table = gelu_table(0.05, 0.03)
    place(iss, 0, table[None, :], 1)
    x = rng.integers(-128, 128, (rows, length))
    tx = place(iss, 70, x, 1)
    tout = Rows(80, rows, row_words(length, 1, size), 1)
    launches = [load_lut_launch(size=size, base=0),
                lut_launch(size=size, length=length, a=tx, out=tout)]
    check_case(iss, launches, [(tout, length, table[x & 0xFF])], rng, max_cycles=30_000)


@pytest.mark.parametrize("seed, size, out_eb, per_channel, a_eb, keep", [
    (6, 4, 1, False, 2, False), (7, 4, 2, True, 4, False), (8, 2, 1, True, 4, False),
    (10, 4, 1, True, 2, True), (11, 4, 2, False, 2, True)])
def test_requant(seed, size, out_eb, per_channel, a_eb, keep):
    """REQUANT per tensor or per channel; with ``keep`` the bytes of each row's last word past
    the row keep what was there (the memory is random garbage)."""
    rng = seeded(seed)
    rows, length = 3, 5
    iss = vector_iss(size)
    fill(iss, rng)
    hi = 1 << (8 * a_eb - 1)
    a = rng.integers(-hi, hi, (rows, length))
    ta = place(iss, 0, a, a_eb)
    tout = Rows(50, rows, row_words(length, out_eb, size), out_eb)
    cmd = {"out16": out_eb == 2, "per_channel": per_channel}
    if per_channel:
        mult, shift = rng.integers(0, 1 << 16, length), rng.integers(10, 30, length)
        words = pack_requant(mult, shift)[None, :]
        place(iss, 30, words, 4)
        launch = requant_launch(size=size, length=length, a=ta, out=tout, params_base=30,
                                keep=keep)
        want, _ = golden_rows(VectorOp.REQUANT, a, np.repeat(words, rows, 0), **cmd)
    else:
        launch = requant_launch(size=size, length=length, a=ta, out=tout, mult=40000, shift=20,
                                keep=keep)
        want, _ = golden_rows(VectorOp.REQUANT, a, mult=40000, shift=20, **cmd)
    before = iss.mem.copy()
    check_case(iss, [launch], [(tout, length, want)], rng)
    rw = tout.row_words
    tail = (before if keep else np.zeros_like(before))[50:50 + rows * rw].reshape(
        rows, rw * size)[:, length * out_eb:]
    got = iss.mem[50:50 + rows * rw].reshape(rows, rw * size)[:, length * out_eb:]
    assert (got == tail).all(), f"keep={keep}: the bytes past each row are {got}, want {tail}"


def test_bias_and_relu():
    rng = seeded(9)
    size, rows, length = 4, 3, 3
    iss = vector_iss(size)
    fill(iss, rng)
    a = rng.integers(-(1 << 31), 1 << 31, (rows, length))
    bias = rng.integers(-(1 << 31), 1 << 31, (1, length))
    ta = place(iss, 0, a, 4)
    place(iss, 20, bias, 4)
    tb = Rows(30, rows, 3, 4)
    tr = Rows(40, rows, 1, 1)
    launches = [bias_launch(size=size, length=length, a=ta, bias_base=20, out=tb),
                relu_launch(size=size, length=length, a=tb, out=tr)]
    biased, _ = golden_rows(VectorOp.BIAS, a, np.repeat(bias, rows, 0))
    relu8 = np.maximum(biased, 0) & 0xFF
    relu8 = np.where(relu8 > 127, relu8 - 256, relu8)
    check_case(iss, launches, [(tb, length, biased), (tr, length, relu8)], rng)


def test_post_norm_residual_block():
    """Post-norm: h = clamp16(h + x) in place, then one LN launch writes the new int16
    residual over h and the int8 matmul input q: both outputs of one launch, in place."""
    rng = seeded(10)
    size, rows, length = 4, 3, 12
    iss = vector_iss(size)
    fill(iss, rng)
    h = rng.integers(-20000, 20000, (rows, length))
    x = rng.integers(-20000, 20000, (rows, length))
    gamma = rng.integers(1 << 12, 1 << 15, length)
    beta = rng.integers(-(1 << 10), 1 << 10, length)
    th = place(iss, 0, h, 2)
    tx = place(iss, 20, x, 2)
    gb = pack_gamma_beta(gamma, beta)[None, :]
    place(iss, 40, gb, 4)
    tq = Rows(60, rows, row_words(length, 1, size), 1)
    launches = [add_launch(size=size, length=length, a=th, b=tx, out=th),
                ln_launch(size=size, length=length, x=th, gamma_beta_base=40, q=tq, y=th,
                          gshift=18, mult=30000, shift=22)]
    added, _ = golden_rows(VectorOp.ADD, h, x)
    y, q = golden_rows(VectorOp.LN, added, np.repeat(gb, rows, 0), gshift=18, mult=30000,
                       shift=22)
    check_case(iss, launches, [(th, length, y), (tq, length, q)], rng, max_cycles=30_000)


@pytest.mark.parametrize("pipeline", SHORT_DEEP_SLOW)
@pytest.mark.parametrize("seed, size, cut, rms", [(11, 4, 5, False), (12, 2, 8, False),
                                                  (14, 4, 5, True)])
def test_distributed_layernorm_equals_full(seed, size, cut, rms, pipeline):
    """Hidden-dimension LayerNorm: each "chip" (a column slice of x) runs LN_STATS, the
    records are summed as an int64 all-reduce would, then LN_APPLY with the global count gives
    exactly the full LN's y and q, on the ISS and on the engine; ``rms``: RMS_APPLY and RMS."""
    from hw.spec.vector_engine import stats_words
    from sim.compiler.vector_launch import ln_apply_launch, ln_stats_launch
    rng = seeded(seed)
    rows, length = 3, 13
    x = rng.integers(-(1 << 15), 1 << 15, (rows, length))
    gamma = rng.integers(-(1 << 15), 1 << 15, length)
    beta = rng.integers(-(1 << 12), 1 << 12, length)
    gb = pack_gamma_beta(gamma, beta)[None, :]
    parts = [(0, cut), (cut, length)]
    rec = stats_words(size)
    iss = vector_iss(size)
    fill(iss, rng)
    xs, stats, launches = [], [], []
    for k, (lo, hi) in enumerate(parts):
        xs.append(place(iss, 200 * k, x[:, lo:hi], 2))
        place(iss, 200 * k + 50, gb[:, lo:hi], 4)
        stats.append(200 * k + 80)
        launches.append(ln_stats_launch(size=size, length=hi - lo, x=xs[k],
                                        stats_base=stats[k]))
    check_case(iss, launches, [], rng, pipeline=pipeline)
    # The all-reduce: int64 sums of the records, written back for both chips.
    recs = [iss.read_words(base, rows * rec).reshape(rows, -1)[:, :16] for base in stats]
    total = sum(np.ascontiguousarray(r).view("<i8") for r in recs)
    words = np.zeros((rows, rec * size), np.uint8)
    words[:, :16] = total.view(np.uint8)
    for base in stats:
        iss.write_words(base, words.reshape(-1, size))
    launches, expect = [], []
    y_full, q_full = golden_rows(VectorOp.RMS if rms else VectorOp.LN, x,
                                 np.repeat(gb, rows, 0), gshift=16, mult=9000, shift=18)
    for k, (lo, hi) in enumerate(parts):
        ty = Rows(200 * k + 110, rows, row_words(hi - lo, 2, size), 2)
        tq = Rows(200 * k + 140, rows, row_words(hi - lo, 1, size), 1)
        launches.append(ln_apply_launch(size=size, length=hi - lo, n=length, x=xs[k],
                                        gamma_beta_base=200 * k + 50, stats_base=stats[k],
                                        q=tq, y=ty, gshift=16, mult=9000, shift=18, rms=rms))
        expect += [(ty, hi - lo, y_full[:, lo:hi]), (tq, hi - lo, q_full[:, lo:hi])]
    check_case(iss, launches, expect, rng)


# ---- rejections --------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, match", vector_size_rejections(2))
def test_init_rejects(kwargs, error, match):
    with pytest.raises(error, match=match):
        VectorEngine(**kwargs)


def test_init_positional_rejected():
    with pytest.raises(TypeError):
        VectorEngine(4, 64)


def test_flags_layout_matches_spec():
    """The gateware's flags struct and hw.spec.vector_engine.VecFlags put each field at the
    same bits."""
    from hw.tile.vector_engine import flags_layout
    layout = flags_layout()
    flags = VecFlags(out16=True, per_channel=False, a_bytes=4, b_bytes=2, d_bytes=1,
                     wr_data=False, wr_q=True, pairs=True)
    value = flags.encode()
    fields = {"out16": 1, "per_channel": 0, "a_bytes": 2, "b_bytes": 1, "d_bytes": 0,
              "wr_data": 0, "wr_q": 1, "pairs": 1}
    for name, want in fields.items():
        f = layout[name]
        assert (value >> f.offset) & ((1 << f.width) - 1) == want, name
    assert VecFlags.decode(value) == flags
    assert layout.size == FLAG_BITS


# ---- timing ------------------------------------------------------------------------------------

def random_launch(iss, rng, op, rows, length, a_eb, b_eb, d_eb, q):
    """Random operands for ``op`` in a fresh memory; the launch writes data (``d_eb``) and/or
    q (or statistics records). Tensors at words 0, 100, 200, 300, 400: no overlaps."""
    size = iss.n
    fill(iss, rng)
    hi = 1 << (8 * a_eb - 1)
    ta = place(iss, 0, rng.integers(-hi, hi, (rows, length)), a_eb)
    b = None
    if op in (VectorOp.ADD, VectorOp.MUL):
        hb = 1 << (8 * b_eb - 1)
        b = place(iss, 100, rng.integers(-hb, hb, (rows, length)), b_eb)
    elif b_eb:
        if op is VectorOp.REQUANT:
            words = pack_requant(rng.integers(0, 1 << 16, length), rng.integers(1, 48, length))
        else:
            words = rng.integers(-(1 << 31), 1 << 31, length)
        b = place(iss, 100, words[None, :], b_eb)
    data = Rows(200, rows, row_words(length, d_eb, size), d_eb) if d_eb else None
    tq = Rows(300, rows, row_words(length, 1, size), 1) if q else None
    stats_ops = (VectorOp.LN_STATS, *STATS_IN_OPS)
    return vector_launch(size=size, op=op, length=length, a=ta, b=b, data=data, q=tq,
                         mult=int(rng.integers(0, 1 << 16)), shift=int(rng.integers(8, 30)),
                         gshift=16, per_channel=op is VectorOp.REQUANT and b is not None,
                         stats_base=400 if op in stats_ops else None,
                         n=3 * length if op in STATS_IN_OPS else None)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("seed, size, op, rows, length, a_eb, b_eb, d_eb, q", [
    (20, 4, VectorOp.ADD, 5, 7, 2, 2, 2, False),
    (21, 4, VectorOp.LN, 4, 16, 2, 4, 2, True),
    (22, 4, VectorOp.LN, 2, 6, 2, 4, 0, True),
    (23, 8, VectorOp.REQUANT, 3, 11, 4, 4, 1, False),
    (24, 4, VectorOp.RELU, 4, 10, 1, 0, 4, False),
    (25, 2, VectorOp.BIAS, 3, 3, 4, 4, 4, False),
    (26, 4, VectorOp.LUT, 6, 12, 1, 0, 1, False),
    (27, 8, VectorOp.LN, 2, 20, 2, 4, 2, True),
    (28, 4, VectorOp.REQUANT, 5, 6, 2, 0, 2, False),
    (30, 4, VectorOp.LN_STATS, 4, 11, 2, 0, 0, False),
    (31, 8, VectorOp.LN_STATS, 3, 40, 2, 0, 0, False),
    (32, 4, VectorOp.LN_APPLY, 3, 11, 2, 4, 2, True),
    (33, 8, VectorOp.LN_APPLY, 2, 20, 2, 4, 0, True),
    (34, 4, VectorOp.RMS, 4, 16, 2, 4, 2, True),
    (35, 4, VectorOp.RMS_APPLY, 3, 11, 2, 4, 2, True),
    (36, 4, VectorOp.MUL, 5, 7, 1, 1, 1, False),
    (37, 8, VectorOp.MUL, 3, 20, 1, 1, 2, False),
    # int32 in, int16 out, a last beat of one word: the writer's backlog of the beat before.
    (38, 4, VectorOp.REQUANT, 2, 9, 4, 4, 2, False),
])
def test_cycles_match_formula(seed, size, op, rows, length, a_eb, b_eb, d_eb, q, pipeline):
    """With every input valid and every output ready, a launch takes exactly
    ``launch_cycles`` from its configuration to its last word (and is still bit-exact), with
    either pipeline of the unit."""
    rng = seeded(seed)
    iss = vector_iss(size)
    launch = random_launch(iss, rng, op, rows, length, a_eb, b_eb, d_eb, q)
    (cycles,) = check_case(iss, [launch], [], rng, idle=0, stall=0, pipeline=pipeline)
    want = launch_cycles(op, rows=rows, length=length, lanes=size, flags=launch.flags,
                         pipeline=pipeline)
    print(f"{op.name} rows={rows} length={length} {pipeline}: {cycles} cycles "
          f"(formula {want})")
    assert cycles == want


@pytest.mark.parametrize("size, rows", [(4, 1), (4, 2)])
def test_load_lut_cycles_match_formula(size, rows):
    iss = vector_iss(size)
    fill(iss, np.random.default_rng(29))
    launch = load_lut_launch(size=size, base=0)
    launch = dataclasses.replace(
        launch, rows=rows, rd3=dataclasses.replace(launch.rd3, n=(launch.rd3.n[0], rows, 1, 1)),
        regs=dict(launch.regs, VU_ROWS=rows))
    (cycles,) = check_case(iss, [launch], [], np.random.default_rng(29), idle=0, stall=0)
    assert cycles == launch_cycles(VectorOp.LOAD_LUT, rows=rows, length=LUT_ENTRIES,
                                   lanes=size, flags=launch.flags)

