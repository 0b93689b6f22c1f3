"""GELU16 and LOAD_LUT16 through the VectorEngine (words in, words out): the ISS against the
golden model, the engine against the ISS (whole memories, random idle and backpressure), the
engine's cycles against hw.spec.timing.vector.launch_cycles, and the rejections of the ISS and
of the launch builders."""

from __future__ import annotations

import numpy as np
import pytest

from hw.spec.isa import Op
from hw.spec.memory import pack_rows, row_words, unpack_rows
from hw.spec.timing.vector import PIPELINES, launch_cycles
from hw.spec.vector import GELU16_KNOTS, VectorOp
from hw.spec.vector_engine import VecFlags, table_entries
from hw.tile.vector_engine import VectorEngine
from sim.compiler.assembler import Assembler
from sim.compiler.vector_launch import (
    Rows,
    emit,
    gelu16_launch,
    load_lut16_launch,
    vector_launch,
)
from sim.golden.vector import gelu16_apply, gelu16_knot_shift, gelu16_table, split16
from sim.iss import IssError
from sim.rtl.vector_engine_driver import run_vector_engine
from tests.helpers import assemble, engine_equals_iss, vector_iss

I16 = (-(1 << 15), 1 << 15)


def place(iss, base, x, eb):
    iss.write_words(base, pack_rows(x, eb, iss.n))
    return Rows(base, x.shape[0], row_words(x.shape[1], eb, iss.n), eb)


def read(iss, t: Rows, cols, signed=True):
    """The first ``cols`` elements of each row of ``t`` (rows may have spare words)."""
    return unpack_rows(iss.read_words(t.base, t.rows * t.row_words), t.rows,
                       t.row_words * iss.n // t.eb, t.eb, signed=signed)[:, :cols]


@pytest.mark.parametrize("pipeline", ["short", pytest.param("deep", marks=pytest.mark.slow)])
@pytest.mark.parametrize("seed, size, rows, length, scale", [
    (1, 4, 3, 10, 1e-3), (2, 2, 2, 7, 3e-4), (3, 8, 2, 19, 0.02)])
def test_gelu16_planes(seed, size, rows, length, scale, pipeline):
    """LOAD_LUT16 from memory, then GELU16 writing the hi (WR1) and lo (WR2) planes, then
    GELU16 writing int16 y: ISS == golden, engine == ISS; memory outside the outputs kept."""
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    iss = vector_iss(size)
    iss.mem[:] = rng.integers(0, 256, iss.mem.shape, dtype=np.uint8)
    g = gelu16_knot_shift(scale)
    table = gelu16_table(scale, g)
    place(iss, 0, table[None, :], 2)
    x = rng.integers(*I16, (rows, length))
    x[0, :3] = [I16[0], I16[1] - 1, 0]
    ta = place(iss, 260, x, 2)          # after the table (257 words when N = 2)
    hi = Rows(300, rows, row_words(length, 1, size), 1)
    lo = Rows(340, rows, row_words(length, 1, size) + 1, 1)
    y = Rows(400, rows, row_words(length, 2, size), 2)
    launches = [load_lut16_launch(size=size, base=0),
                gelu16_launch(size=size, length=length, a=ta, g=g, hi=hi, lo=lo),
                gelu16_launch(size=size, length=length, a=ta, g=g, y=y)]
    before = iss.mem.copy()
    iss.run(assemble(emit, launches))
    want = gelu16_apply(table, x, g)
    want_hi, want_lo = split16(want)
    assert np.array_equal(read(iss, hi, length), want_hi)
    assert np.array_equal(read(iss, lo, length, signed=False), want_lo)
    assert np.array_equal(read(iss, y, length), want)
    # The lo rows' spare word (row_words + 1) is not written.
    spare = [lo.base + r * lo.row_words + lo.row_words - 1 for r in range(rows)]
    assert np.array_equal(iss.mem[spare], before[spare])
    engine_equals_iss(iss, before, launches, rng, pipeline=pipeline)


def test_only_lo_plane_and_in_place_hi():
    """GELU16 may write only q (WR2), and hi over its own int16 input rows' first bytes."""
    rng = np.random.default_rng(4)
    size, rows, length = 4, 2, 9
    iss = vector_iss(size)
    iss.mem[:] = rng.integers(0, 256, iss.mem.shape, dtype=np.uint8)
    table = gelu16_table(5e-4, 8)
    place(iss, 0, table[None, :], 2)
    x = rng.integers(*I16, (rows, length))
    ta = place(iss, 200, x, 2)
    lo = Rows(300, rows, row_words(length, 1, size), 1)
    hi_in_place = Rows(ta.base, rows, ta.row_words, 1)
    launches = [load_lut16_launch(size=size, base=0),
                gelu16_launch(size=size, length=length, a=ta, g=8, lo=lo),
                gelu16_launch(size=size, length=length, a=ta, g=8, hi=hi_in_place)]
    assert launches[1].wr1 is None and launches[1].wr2 is not None
    before = iss.mem.copy()
    iss.run(assemble(emit, launches))
    want_hi, want_lo = split16(gelu16_apply(table, x, 8))
    assert np.array_equal(read(iss, lo, length, signed=False), want_lo)
    assert np.array_equal(read(iss, hi_in_place, length), want_hi)
    engine_equals_iss(iss, before, launches, rng)


# ---- timing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("size, rows, length, a_eb, outs", [
    (4, 3, 10, 2, "hi+lo"), (4, 2, 16, 2, "y"), (8, 3, 11, 2, "hi"), (2, 2, 5, 2, "lo"),
    (4, 4, 7, 4, "hi+lo"), (8, 2, 20, 2, "y+lo"),
])
def test_gelu16_cycles_match_formula(size, rows, length, a_eb, outs, pipeline):
    """With every input valid and every output ready a GELU16 launch takes exactly
    ``launch_cycles`` (the element-wise formula) from its configuration to its last word."""
    rng = np.random.default_rng(size * 100 + rows * 10 + length)
    iss = vector_iss(size)
    iss.mem[:] = rng.integers(0, 256, iss.mem.shape, dtype=np.uint8)
    ta = place(iss, 0, rng.integers(*I16, (rows, length)), a_eb)
    kinds = outs.split("+")
    t = {k: Rows(100 + 60 * i, rows, row_words(length, 2 if k == "y" else 1, size),
                 2 if k == "y" else 1) for i, k in enumerate(kinds)}
    launch = gelu16_launch(size=size, length=length, a=ta, g=6, hi=t.get("hi"), lo=t.get("lo"),
                           y=t.get("y"))
    before = iss.mem.copy()
    iss.run(assemble(emit, [launch]))
    (cycles,) = engine_equals_iss(iss, before, [launch], rng, idle=0, stall=0,
                                  pipeline=pipeline)
    want = launch_cycles(VectorOp.GELU16, rows=rows, length=length, lanes=size,
                         flags=launch.flags, pipeline=pipeline)
    print(f"GELU16 {outs} rows={rows} length={length} N={size}: {cycles} cycles (formula {want})")
    assert cycles == want


@pytest.mark.parametrize("size", [2, 4, 8])
@pytest.mark.parametrize("op, a_eb, rows", [
    (VectorOp.LOAD_LUT16, 2, 1), (VectorOp.LOAD_LUT16, 2, 3), (VectorOp.LOAD_LUT16, 4, 2),
    (VectorOp.LOAD_LUT16, 1, 2), (VectorOp.LOAD_LUT, 1, 2), (VectorOp.LOAD_LUT, 2, 2)])
def test_table_load_cycles_match_formula(size, op, a_eb, rows):
    """Loading a table (any element width, any rows) takes ``launch_cycles`` until idle."""
    rng = np.random.default_rng(size + rows)
    entries = table_entries(op)
    launch = vector_launch(size=size, op=op, length=entries,
                           a=Rows(0, rows, row_words(entries, a_eb, size), a_eb))
    mem = rng.integers(0, 256, (2048, size), dtype=np.uint8)
    _, (cycles,), _ = run_vector_engine(VectorEngine(lanes=size, d_model_max=16), mem,
                                        [launch], addr_bits=11)
    assert cycles == launch_cycles(op, rows=rows, length=entries, lanes=size,
                                   flags=launch.flags)


# ---- rejections --------------------------------------------------------------------------------

def _iss_run(regs, size=4):
    iss = vector_iss(size)
    asm = Assembler()
    for name, value in regs.items():
        asm.set(name, value)
    asm.launch(Op.VEC)
    asm.halt()
    return lambda: iss.run(asm.words())


@pytest.mark.parametrize("op, regs, match", [
    (VectorOp.GELU16, {"VU_SHIFT": 0}, r"GELU16 with VU_SHIFT=0: the knot spacing g must be in "
                                       r"1\.\.8"),
    (VectorOp.GELU16, {"VU_SHIFT": 9}, r"GELU16 with VU_SHIFT=9"),
    (VectorOp.LOAD_LUT16, {"VU_LEN": 256}, r"LOAD_LUT16 with VU_LEN=256: must be 257"),
    (VectorOp.LOAD_LUT16, {"VU_FLAGS": VecFlags(a_bytes=2, wr_q=True, wr_data=False).encode()},
     r"LOAD_LUT16 writes nothing: clear wr_data and wr_q"),
    (VectorOp.GELU16, {"VU_FLAGS": VecFlags(a_bytes=2, wr_data=False).encode()},
     r"GELU16 writes nothing: set wr_data and/or wr_q"),
])
def test_iss_rejects(op, regs, match):
    base = {"VU_OP": int(op), "VU_ROWS": 1, "VU_LEN": GELU16_KNOTS if op is VectorOp.LOAD_LUT16
            else 4, "VU_N": 4, "VU_MULT": 1, "VU_SHIFT": 4, "VU_GSHIFT": 16,
            "VU_FLAGS": VecFlags(a_bytes=2, d_bytes=1,
                                 wr_data=op is not VectorOp.LOAD_LUT16).encode()}
    with pytest.raises(IssError, match=match):
        _iss_run(dict(base, **regs))()


@pytest.mark.parametrize("kwargs, match", [
    ({"g": 0}, r"GELU16 knot spacing g \(shift\) must be in 1\.\.8, not 0"),
    ({"g": 9}, r"not 9"),
    ({"hi": Rows(50, 2, 1, 1), "y": Rows(60, 2, 2, 2)}, r"GELU16 writes hi or y through WR1, "
                                                        r"not both"),
    ({"hi": Rows(50, 2, 2, 2)}, r"GELU16 hi is int8 \(eb=1\), not eb=2"),
    ({"y": Rows(50, 2, 1, 1)}, r"GELU16 y is int16 \(eb=2\), not eb=1"),
    ({"lo": Rows(50, 2, 2, 2)}, r"q is LN's int8 output: only for LN, LN_APPLY, RMS, "
                                r"RMS_APPLY \(and GELU16's low byte\), with eb=1"),
    ({}, r"GELU16 needs an output \(data and/or q\)"),
])
def test_builder_rejects(kwargs, match):
    args = {"size": 4, "length": 4, "a": Rows(0, 2, 2, 2), "g": 4}
    with pytest.raises(ValueError, match=match):
        gelu16_launch(**dict(args, **kwargs))


def test_builder_rejects_table_loads():
    with pytest.raises(ValueError, match=r"LOAD_LUT16 length must be 257, not 256"):
        vector_launch(size=4, op=VectorOp.LOAD_LUT16, length=256, a=Rows(0, 1, 128, 2))
    with pytest.raises(ValueError, match=r"LOAD_LUT16 takes only a \(the 257 table entries\)"):
        vector_launch(size=4, op=VectorOp.LOAD_LUT16, length=257, a=Rows(0, 1, 129, 2),
                      data=Rows(200, 1, 129, 2))
    with pytest.raises(ValueError, match=r"GELU16 data must be int8 \(eb=1\) or int16"):
        vector_launch(size=4, op=VectorOp.GELU16, length=4, a=Rows(0, 1, 2, 2),
                      data=Rows(10, 1, 4, 4), shift=3)
    launch = load_lut16_launch(size=4, base=7)
    assert (launch.rd3.base, launch.rd3.n[0], launch.length) == (7, 129, 257)
    assert launch.flags.a_bytes == 2 and not (launch.flags.wr_data or launch.flags.wr_q)
