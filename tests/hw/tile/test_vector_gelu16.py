"""GELU16 and LOAD_LUT16 in the VectorUnit RTL: bit-exact with the golden model under random
idle cycles and backpressure on every stream (sim.rtl.vector_driver), and the cycle counts of
hw.spec.timing.vector.op_cycles with ideal streams."""

from __future__ import annotations

import numpy as np
import pytest

from hw.spec import npu_preset
from hw.spec.timing.vector import PIPELINES
from hw.spec.vector import GELU16_KNOTS, VectorCmd, VectorOp
from sim.golden.vector import gelu16_apply, gelu16_knot_shift, gelu16_table, gelu_table
from sim.rtl.vector_driver import check_outputs, prepare, simulate_pysim
from tests.helpers import beat_rows

I16 = (-(1 << 15), 1 << 15)


def _edges(g):
    edge = 128 << g
    x = np.array([-(1 << 15), (1 << 15) - 1, edge - 1, edge, -edge, -edge - 1, 0, -1,
                  (1 << g) - 1, 1 << (g - 1)])
    return x[(x >= I16[0]) & (x < I16[1])]


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("lanes", [4, 3])
def test_gelu16_random_and_edges(rng, lanes, pipeline):
    """The reset table (zeros), then two loaded tables (a real GELU, random knots), every knot
    spacing class, int8 and int16 outputs, lengths that leave partial last beats."""
    scale = 1e-3
    g = gelu16_knot_shift(scale)
    program = [(VectorCmd(VectorOp.GELU16, 6, shift=3), rng.integers(*I16, 6), None, None),
               (VectorCmd(VectorOp.LOAD_LUT16, 0), gelu16_table(scale, g), None, None)]
    for length, shift, out16 in ((13, g, False), (7, g, True), (1, g, False)):
        x = np.concatenate([_edges(shift), rng.integers(*I16, length)])
        program.append((VectorCmd(VectorOp.GELU16, len(x), shift=shift, out16=out16), x, None,
                        None))
    program.append((VectorCmd(VectorOp.LOAD_LUT16, 0), rng.integers(*I16, GELU16_KNOTS), None,
                    None))
    for shift in (1, 4, 8):
        x = np.concatenate([_edges(shift), rng.integers(*I16, 5)])
        for out16 in (False, True):
            program.append((VectorCmd(VectorOp.GELU16, len(x), shift=shift, out16=out16), x,
                            None, None))
    run = simulate_pysim(program, lanes=lanes, d_model_max=16, rng=rng, idle=0.3, stall=0.3,
                         pipeline=pipeline)
    # The golden model behind the check is the documented formula.
    table = program[-7][1]
    x = program[-1][1]
    assert np.array_equal(run["expected"][-1]["data"], gelu16_apply(table, x, 8))


def test_gelu16_beside_the_int8_lut(rng):
    """LOAD_LUT16 does not touch the int8 LUT and LOAD_LUT not the GELU16 table; GELU16 reads
    the low 16 bits of 32-bit lanes."""
    lut = gelu_table(0.05, 0.04)
    knots = gelu16_table(2e-3, 5)
    x8 = rng.integers(-128, 128, 9)
    x16 = rng.integers(*I16, 9) + (rng.integers(-3, 3, 9) << 16)
    program = [(VectorCmd(VectorOp.LOAD_LUT, 0), lut, None, None),
               (VectorCmd(VectorOp.LOAD_LUT16, 0), knots, None, None),
               (VectorCmd(VectorOp.LUT, 9), x8, None, None),
               (VectorCmd(VectorOp.GELU16, 9, shift=5), x16, None, None),
               (VectorCmd(VectorOp.LOAD_LUT, 0), lut[::-1].copy(), None, None),
               (VectorCmd(VectorOp.GELU16, 9, shift=5, out16=True), x16, None, None),
               (VectorCmd(VectorOp.ADD, 5), rng.integers(*I16, 5), rng.integers(*I16, 5), None)]
    expected = simulate_pysim(program, lanes=4, d_model_max=16, rng=rng, idle=0.2,
                              stall=0.2)["expected"]
    assert np.array_equal(expected[2]["data"], lut[x8 & 0xFF])


@pytest.mark.verilator
def test_verilator_matches_golden(verilator_ok, tmp_path):
    """`npu export --top vector` (tiny preset) under cocotb + Verilator: LOAD_LUT16 and GELU16
    golden-exact, in as many cycles as in Amaranth's simulator."""
    from sim.cli import main
    from sim.rtl.cocotb_tb import run_cocotb

    npu = npu_preset("tiny")
    lanes = npu.vector_lanes
    assert main(["export", "--top", "vector", "--npu", str(npu.path), "-o", str(tmp_path)]) == 0
    rng = np.random.default_rng(44)
    print("seed=44")
    program = [(VectorCmd(VectorOp.LOAD_LUT16, 0), gelu16_table(6e-4, 7), None, None)]
    for shift, out16 in ((7, False), (7, True), (2, False), (8, True)):
        x = np.concatenate([_edges(shift), rng.integers(*I16, 11)])
        program.append((VectorCmd(VectorOp.GELU16, len(x), shift=shift, out16=out16), x, None,
                        None))
    program.append((VectorCmd(VectorOp.LOAD_LUT16, 0), rng.integers(*I16, GELU16_KNOTS), None,
                    None))
    program.append((VectorCmd(VectorOp.GELU16, 9, shift=3), rng.integers(*I16, 9), None, None))
    job = prepare(program, lanes)
    data = {"lanes": lanes, "n_data": job["n_data"], "n_stats": job["n_stats"],
            "cmds": np.array([[c[f] for f in ("op", "length", "n", "mult", "shift", "gshift",
                                              "out16", "per_channel")] for c in job["cmds"]],
                             dtype=np.int64),
            "a": beat_rows(job["a"], lanes), "b": beat_rows(job["b"], lanes),
            "stats": beat_rows(job["stats"], 2)}
    out = run_cocotb((tmp_path / "npu_vector.v").read_text(), top="npu_vector",
                     test_module="tb_vector", data=data)
    check_outputs(program, job["expected"], [tuple(b) for b in out["data"]], [], lanes,
                  label="verilator")
    pysim = simulate_pysim(program, lanes=lanes, d_model_max=npu.d_model_max)
    assert out["cycles"] == pysim["cycles"]
