"""SoftmaxUnit (hw.tile.softmax) vs the golden integer softmax, bit for bit.

Random and edge rows under random idle and backpressure, cycle timing vs the documented formula,
constructor checks, Verilator."""

import numpy as np
import pytest
from amaranth.back import verilog

from hw.spec import npu_preset
from hw.spec.softmax import D_MAX, LOG2E_MULT, LOG2E_SHIFT
from hw.tile.softmax import LOG2E_HALF, SoftmaxUnit, log2e_tables
from hw.tops import build_top
from sim.golden.softmax import partial_softmax, softmax
from sim.rtl.softmax_driver import simulate_rows
from tests.helpers import edge_rows, random_rows


def assert_rows_equal(got, want, what="row"):
    bad = np.argwhere(got != want)
    if bad.size:
        r, j = bad[0]
        raise AssertionError(f"{len(bad)} mismatches; first at {what} {r} lane {j}: "
                             f"got {got[r, j]}, expected {want[r, j]}; row got {got[r].tolist()}, "
                             f"expected {want[r].tolist()}")


def check(dut, scores, mask, rng, *, idle=0.3, stall=0.3):
    """Random rows in, random idle on ``i`` and backpressure on ``o``; exact golden match."""
    lasts = (rng.random(len(scores)) < 0.3).astype(np.int64)
    res = simulate_rows(dut, scores, mask, lasts, rng=rng, idle=idle, stall=stall)
    assert_rows_equal(res["rows"], softmax(scores, mask).astype(np.int64))
    bad = np.flatnonzero(res["last"] != lasts)
    assert bad.size == 0, f"row {bad[0]}: last {res['last'][bad[0]]}, expected {lasts[bad[0]]}"


def test_random_rows(rng):
    """Rows over every score range, then many rows of logits within +-2 and mostly visible
    lanes, where every lane's exp and the reciprocal's low bits show in the result."""
    dut = SoftmaxUnit(length=16)
    scores, mask = random_rows(rng, 40, 16)
    narrow = rng.integers(-512, 512, size=(80, 16))
    check(dut, np.concatenate([scores, narrow]),
          np.concatenate([mask, rng.random((80, 16)) < 0.9]), rng)


def test_edge_rows(rng):
    dut = SoftmaxUnit(length=16)
    scores, mask = edge_rows(16)
    check(dut, scores, mask, rng)


def test_heavy_backpressure(rng):
    """A consumer slower than the unit: the output register is still full at slot ends, so the
    whole pipeline waits (visible as input gaps longer than a slot) and loses nothing."""
    dut = SoftmaxUnit(length=8)
    scores, mask = random_rows(rng, 14, 8)
    lasts = (rng.random(14) < 0.5).astype(np.int64)
    res = simulate_rows(dut, scores, mask, lasts, rng=rng, stall=0.97)
    assert_rows_equal(res["rows"], softmax(scores, mask).astype(np.int64))
    assert res["last"].tolist() == lasts.tolist()
    gaps = np.diff(res["t_in"])
    assert gaps.max() > dut.slot_cycles, f"no pipeline stall seen; input gaps {gaps.tolist()}"


@pytest.mark.parametrize("length, lanes", [(8, 1), (12, 3), (64, 4)])
def test_other_sizes(rng, length, lanes):
    """Parametric: fewer beats than the divider's 16 quotient bits (L=8: 2 bits per cycle),
    several lanes per cycle (L=12, P=3: 4 beats, 4 bits per cycle) and the fpga preset's length
    (L=64, P=4)."""
    dut = SoftmaxUnit(length=length, lanes_per_cycle=lanes)
    es, em = edge_rows(length)
    rs, rm = random_rows(rng, 12, length)
    check(dut, np.concatenate([es, rs]), np.concatenate([em, rm]), rng)


@pytest.mark.parametrize("length, lanes, pipeline", [(16, 4, "short"), (12, 3, "short"),
                                                     (16, 4, "deep"), (8, 1, "deep"),
                                                     (4, 4, "deep")])
def test_partial_mode(rng, length, lanes, pipeline):
    """Rows in partial mode mixed with normal rows, under random idle and backpressure:
    partial rows give the golden ``partial_softmax`` (u, max, sum), normal rows the softmax
    and their max (sum 0), in the same cycles. The deep pipeline's divider over two stages:
    the ulx3s preset's 2 quotient bits a cycle (L = 16, P = 4), 1 (L = 8, P = 1), and the 12
    after the first in one cycle (L = P = 4); narrow logits, where the reciprocal's low bits
    show; the edge rows' sums that are powers of two (one visible lane, half the lanes or
    all of them at the maximum), whose first quotient bit is 1."""
    dut = SoftmaxUnit(length=length, lanes_per_cycle=lanes, pipeline=pipeline)
    es, em = edge_rows(length)
    rs, rm = random_rows(rng, 30, length)
    if pipeline == "deep":
        narrow = rng.integers(-512, 512, size=(30, length))
        rs = np.concatenate([rs, narrow])
        rm = np.concatenate([rm, rng.random((30, length)) < 0.9])
    scores, mask = np.concatenate([es, rs]), np.concatenate([em, rm])
    partial = (rng.random(len(scores)) < 0.6).astype(np.int64)
    res = simulate_rows(dut, scores, mask, partial=partial, rng=rng, idle=0.3, stall=0.3)
    part = partial_softmax(scores, mask)
    full = part["max"]
    want = np.where(partial[:, None] == 1, part["u"], softmax(scores, mask))
    assert_rows_equal(res["rows"], want)
    for r in range(len(scores)):
        assert res["max"][r] == full[r], f"row {r}: max {res['max'][r]}, expected {full[r]}"
        want_sum = part["sum"][r] if partial[r] else 0
        assert res["sum"][r] == want_sum, f"row {r}: sum {res['sum'][r]}, expected {want_sum}"


@pytest.mark.parametrize("length, lanes, pipeline", [(16, 1, "short"), (8, 1, "short"),
                                                     (16, 4, "short"), (16, 16, "short"),
                                                     (16, 4, "deep"), (16, 16, "deep")])
def test_cycles_per_row_and_latency(length, lanes, pipeline):
    """Back-to-back rows without stalls: one row per ``slot_cycles``, ``latency`` in between
    (5 row stages, the deep pipeline's 6)."""
    dut = SoftmaxUnit(length=length, lanes_per_cycle=lanes, pipeline=pipeline)
    assert dut.slot_cycles == length // lanes
    stages = {"short": 5, "deep": 6}[pipeline]
    assert dut.latency == stages * length // lanes + 1
    n = 6
    scores, mask = random_rows(np.random.default_rng(7), n, length)
    res = simulate_rows(dut, scores, mask)
    assert_rows_equal(res["rows"], softmax(scores, mask).astype(np.int64))
    t_in, t_out = res["t_in"], res["t_out"]
    for r in range(n):
        assert t_out[r] - t_in[r] == dut.latency, (
            f"row {r}: accepted at cycle {t_in[r]}, out at {t_out[r]}, latency {dut.latency}")
    for r in range(1, n):
        assert t_in[r] - t_in[r - 1] == dut.slot_cycles, f"row {r} accepted at {t_in}"
        assert t_out[r] - t_out[r - 1] == dut.slot_cycles, (
            f"row {r}: {t_out[r] - t_out[r - 1]} cycles after row {r - 1}, "
            f"expected {dut.slot_cycles}")


def test_log2e_tables_are_the_product():
    """The deep pipeline's two tables add up to ``d * LOG2E_MULT + 2**(LOG2E_SHIFT - 1)`` for
    every clamped distance ``d`` (so its ``y`` is the short pipeline's)."""
    hi, lo = log2e_tables()
    half = 1 << LOG2E_HALF
    for d in range(D_MAX + 1):
        got = hi[d // half] + lo[d % half]
        want = d * LOG2E_MULT + (1 << (LOG2E_SHIFT - 1))
        assert got == want, f"d={d}: tables give {got}, expected {want}"
    assert len(hi) * len(lo) == D_MAX + 1


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"length": 16.0}, TypeError, r"length must be an integer, not 16\.0"),
    ({"length": "16"}, TypeError, r"length must be an integer, not '16'"),
    ({"length": True}, TypeError, r"length must be an integer, not True"),
    ({"length": 1}, ValueError, r"length must be at least 2, not 1"),
    ({"length": -4}, ValueError, r"length must be at least 2, not -4"),
    ({"length": 16, "lanes_per_cycle": 2.0}, TypeError, r"lanes_per_cycle must be an integer"),
    ({"length": 16, "lanes_per_cycle": 0}, ValueError,
     r"lanes_per_cycle must be a positive divisor of length 16, not 0"),
    ({"length": 16, "lanes_per_cycle": 3}, ValueError,
     r"lanes_per_cycle must be a positive divisor of length 16, not 3"),
    ({"length": 16, "pipeline": "fast"}, ValueError,
     r"^attention_pipeline='fast' is not one of 'short', 'deep'$"),
])
def test_constructor_rejects(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SoftmaxUnit(**kwargs)


def test_constructor_requires_keywords():
    with pytest.raises(TypeError):
        SoftmaxUnit(16)


def stimulus(length: int, seed: int):
    """A deterministic row sequence with fixed idle and stall gaps (cycles before each row is
    offered / accepted), the same for pysim and Verilator."""
    rng = np.random.default_rng(seed)
    es, em = edge_rows(length)
    rs, rm = random_rows(rng, 24, length)
    scores, mask = np.concatenate([es, rs]), np.concatenate([em, rm])
    n = len(scores)
    return {
        "scores": scores.astype(np.int64), "mask": mask.astype(np.int64),
        "last": (rng.random(n) < 0.3).astype(np.int64),
        "idle": np.where(rng.random(n) < 0.4, rng.integers(1, 20, n), 0),
        "stall": np.where(rng.random(n) < 0.4, rng.integers(1, 40, n), 0),
    }


# The softmax unit runs under Verilator in make test inside the chip (every attention of the
# Verilator backend's runs and of the cocotb chip test); this cocotb build of the exported
# softmax top alone is in the slow suite.
@pytest.mark.slow
@pytest.mark.verilator
def test_verilator_matches_golden_and_pysim(verilator_ok):
    from sim.rtl.cocotb_tb import run_cocotb

    npu = npu_preset("tiny")
    dut = build_top("softmax", npu)
    length = npu.softmax_len
    stim = stimulus(length, seed=11)
    text = verilog.convert(dut, name="softmax")
    result = run_cocotb(text, top="softmax", test_module="tb_softmax", data=stim)

    want = softmax(stim["scores"], stim["mask"]).astype(np.int64)
    assert_rows_equal(np.array(result["rows"]), want)
    assert result["last"] == stim["last"].tolist()
    # The same unit as the Verilated top (its lanes per cycle and pipeline), in pysim.
    ref = simulate_rows(build_top("softmax", npu), stim["scores"], stim["mask"], stim["last"],
                        idle_gaps=stim["idle"], stall_gaps=stim["stall"])
    assert_rows_equal(np.array(ref["rows"]), want)
    # Compare transfer cycles relative to the first accepted row (reset lengths differ).
    v_out = [t - result["t_in"][0] for t in result["t_out"]]
    p_out = [t - ref["t_in"][0] for t in ref["t_out"]]
    v_in = [t - result["t_in"][0] for t in result["t_in"]]
    p_in = [t - ref["t_in"][0] for t in ref["t_in"]]
    for r, (a, b) in enumerate(zip(v_in, p_in, strict=True)):
        assert a == b, f"row {r} accepted at relative cycle {a} on Verilator, {b} on pysim"
    for r, (a, b) in enumerate(zip(v_out, p_out, strict=True)):
        assert a == b, f"row {r} delivered at relative cycle {a} on Verilator, {b} on pysim"
    assert result["cycles"] == v_out[-1] + 1
    print(f"Verilator: {result['cycles']} cycles for {len(want)} rows, same as pysim")
