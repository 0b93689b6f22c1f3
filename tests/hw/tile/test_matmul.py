"""MatmulArray, Requantizer, MatmulUnit (hw.tile.matmul) against the golden sim.golden.matmul."""

import numpy as np
import pytest
from amaranth.back import verilog

from hw.spec import npu_preset
from hw.spec.formats import OutMode
from hw.spec.timing.matmul import REQUANT_LATENCY, array_row_delay
from hw.tile.matmul import MatmulArray, MatmulUnit, Requantizer
from sim.golden.matmul import matmul_unit
from sim.rtl.matmul_driver import MatmulJob, simulate_pysim
from sim.rtl.pysim import run_sim
from tests.helpers import exported_verilog, matmul_operands, seeded


def assert_equal_matrix(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = np.argwhere(got != want)
    assert not len(bad), (
        f"{what}: {len(bad)} mismatches, first at [row {bad[0][0]}, col {bad[0][1]}]: "
        f"got {got[tuple(bad[0])]}, expected {want[tuple(bad[0])]}")


def golden(job):
    return matmul_unit(job.a, job.b, job.bias, job.mult, job.shift, job.mode,
                       a_unsigned=job.a_unsigned)


def random_job(rng, m, k, n, size, mode, a_unsigned=False):
    a, b, bias, mult = matmul_operands(rng, m, k, n, a_unsigned=a_unsigned)
    # Shifts around where a K-term int8 sum times a 16-bit mult lands in range, plus extremes.
    shift = rng.integers(14, 31, n)
    shift[0] = 1
    if n > 1:
        shift[-1] = 47
    return MatmulJob(a, b, size, bias=bias, mult=mult, shift=shift, mode=mode,
                     a_unsigned=a_unsigned)


@pytest.mark.parametrize("seed, m, k, n, size, mode, a_unsigned", [
    (1, 4, 4, 4, 4, OutMode.RAW, False),
    (2, 5, 7, 6, 4, OutMode.INT8, False),     # ragged edges on M and N
    (3, 9, 3, 3, 4, OutMode.INT16, True),     # K < size: folds padded by the interlock
    (4, 3, 1, 5, 4, OutMode.INT8, False),     # K = 1
    (5, 7, 20, 5, 2, OutMode.INT16, True),    # 2x2 array
    (6, 6, 9, 7, 3, OutMode.RAW, True),       # odd array size
])
def test_random_shapes_with_backpressure(seed, m, k, n, size, mode, a_unsigned):
    rng = seeded(seed)
    job = random_job(rng, m, k, n, size, mode, a_unsigned)
    got = simulate_pysim(job, rng=rng, idle=0.3, stall=0.3)["result"]
    assert_equal_matrix(got, golden(job), f"{m}x{k}x{n} on {size}x{size}, {mode.name}")


def test_products_in_dsps_are_the_same():
    """``pe_dsp``: the PEs' products as multiplications (DSPs on the FPGA) give the golden
    integers and the same cycles as the LUT products."""
    rng = seeded(8)
    job = random_job(rng, 5, 9, 6, 4, OutMode.INT8, a_unsigned=True)
    lut, dsp = simulate_pysim(job), simulate_pysim(job, pe_dsp=True)
    assert_equal_matrix(dsp["result"], golden(job), "pe_dsp 5x9x6 on 4x4, INT8")
    assert dsp["cycles"] == lut["cycles"], (dsp["cycles"], lut["cycles"])


@pytest.mark.parametrize("a_val, b_val, a_unsigned", [
    (-128, -128, False),
    (127, 127, False),
    (-128, 127, False),
    (255, -128, True),
    (255, 127, True),
])
def test_extreme_values(a_val, b_val, a_unsigned):
    # K = 40: 40 * 255 * 128 > 2**20, so the accumulator grows far past 16 bits.
    m, k, n = 4, 40, 4
    job = MatmulJob(np.full((m, k), a_val), np.full((k, n), b_val), 4, a_unsigned=a_unsigned)
    got = simulate_pysim(job)["result"]
    assert_equal_matrix(got, golden(job), f"A={a_val} B={b_val}")
    assert int(got[0, 0]) == a_val * b_val * k


def test_bias_add_wraps_and_requant_saturates():
    rng = seeded(7)
    k, n = 6, 8
    a = rng.integers(-128, 128, (8, k))
    b = rng.integers(-128, 128, (k, n))
    # Bias at both ends of int32: the add wraps (the accumulator's modulo-2**32 semantics).
    bias = np.array([2**31 - 1, -2**31, 2**31 - 1, -2**31, 0, 0, 0, 0])
    mult = np.array([65535, 65535, 0, 1, 65535, 65535, 1, 40000])
    shift = np.array([1, 1, 1, 47, 1, 1, 47, 8])
    for mode in (OutMode.RAW, OutMode.INT8, OutMode.INT16):
        job = MatmulJob(a, b, 4, bias=bias, mult=mult, shift=shift, mode=mode)
        want = golden(job)
        assert_equal_matrix(simulate_pysim(job)["result"], want, mode.name)
        if mode is not OutMode.RAW:
            hi = 127 if mode is OutMode.INT8 else 32767
            # Columns 4 and 5 (mult 65535, shift 1) must hit both rails somewhere.
            assert (np.abs(want[:, 4:6]) >= hi).any(), "test does not reach saturation"


def test_fold_cycle_count_matches_formula():
    rng = np.random.default_rng(11)
    for size, k in [(4, 9), (4, 4), (3, 5)]:
        job = MatmulJob(rng.integers(-128, 128, (size, k)), rng.integers(-128, 128, (k, size)),
                        size)
        assert simulate_pysim(job)["cycles"] == MatmulUnit.latency(size, k), (size, k)


def test_back_to_back_folds_overlap():
    # F folds of K >= size beats: F*K + 3*size (+4 for the requantiser): no gap per fold.
    rng = np.random.default_rng(12)
    size, k, m, n = 4, 8, 8, 12
    job = MatmulJob(rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (k, n)), size)
    folds = len(job.tiles)
    assert folds == 6
    run = simulate_pysim(job)
    assert run["cycles"] == folds * k + 3 * size + REQUANT_LATENCY
    assert_equal_matrix(run["result"], golden(job), "back to back")


def test_short_folds_are_spaced_by_the_interlock():
    # K = 1 < size: each fold's last beat waits `size` cycles after the previous one.
    rng = np.random.default_rng(13)
    size, k = 4, 1
    job = MatmulJob(rng.integers(-128, 128, (12, k)), rng.integers(-128, 128, (k, 4)), size)
    run = simulate_pysim(job)
    folds = len(job.tiles)
    assert run["cycles"] == (folds - 1) * size + MatmulUnit.latency(size, k)
    assert_equal_matrix(run["result"], golden(job), "K=1")


@pytest.mark.parametrize("size, k", [(4, 4), (4, 9), (3, 5)])
def test_array_and_requantiser_latencies_apart(size, k):
    """The unit's latency split as the cycle model splits it (sim/iss/engines.MatmulModel):
    row r of a fold on the array's output ``array_row_delay`` + r cycles after its last beat;
    the requantiser's output REQUANT_LATENCY cycles after it takes a row, also when the row
    waited for its tile's parameters."""
    array = MatmulArray(size=size)
    seen = {}

    async def feed(ctx):
        ctx.set(array.o.ready, 1)
        ctx.set(array.i_b.valid, 1)
        for beat in range(k):
            ctx.set(array.i_a.valid, 1)
            ctx.set(array.i_a.payload.last, beat == k - 1)
            await ctx.tick()
        ctx.set(array.i_a.valid, 0)
        ctx.set(array.i_b.valid, 0)
        for cycle in range(k, k + 4 * size + 4):
            if ctx.get(array.o.valid):
                seen.setdefault("first", cycle)
                if ctx.get(array.o.payload.last):
                    seen["last"] = cycle
            await ctx.tick()

    run_sim(array, [feed], max_cycles=200)
    # Cycle 0 takes the first beat, cycle k - 1 the last.
    assert seen["first"] == k - 1 + array_row_delay(size)
    assert seen["last"] + 1 == MatmulArray.latency(size, k)

    for wait in (0, 3):
        requant = Requantizer(size=size)
        out = {}

        async def row(ctx, wait=wait, requant=requant, out=out):
            ctx.set(requant.o.ready, 1)
            ctx.set(requant.i.valid, 1)
            ctx.set(requant.i.payload.last, 1)
            for _ in range(wait):                 # the row waits for its parameter beat
                await ctx.tick()
            ctx.set(requant.i_param.valid, 1)
            ctx.set(requant.i_param.payload.mode, OutMode.RAW)
            await ctx.tick()
            ctx.set(requant.i.valid, 0)
            ctx.set(requant.i_param.valid, 0)
            for cycle in range(1, 3 * REQUANT_LATENCY):
                if ctx.get(requant.o.valid):
                    out.setdefault("cycle", cycle)
                await ctx.tick()

        run_sim(requant, [row], max_cycles=200)
        assert out["cycle"] == REQUANT_LATENCY, wait


@pytest.mark.parametrize("cls", [MatmulArray, Requantizer, MatmulUnit])
@pytest.mark.parametrize("size", [1, 0, -4, 2.0, "4", True])
def test_rejects_bad_size(cls, size):
    with pytest.raises(ValueError, match=r"Array size must be an integer of at least 2, not"):
        cls(size=size)


def test_verilog_exports():
    text = verilog.convert(MatmulUnit(size=2), name="npu_matmul")
    for port in ("i_a__valid", "i_b__ready", "i_param__payload", "o__payload", "clk", "rst"):
        assert port in text, port


@pytest.mark.slow
def test_accumulator_wraps_modulo_2_32():
    # 2**31 / (128*128) = 131072 beats of (-128) x (-128) overflow int32 by one product.
    k = 2**17 + 3
    job = MatmulJob(np.full((2, k), -128), np.full((k, 2), -128), 2)
    got = simulate_pysim(job, max_cycles=k + 1000)["result"]
    want = golden(job)
    assert int(want[0, 0]) == (k * 16384 + 2**31) % 2**32 - 2**31
    assert_equal_matrix(got, want, "wrap")


@pytest.mark.verilator
def test_verilator_matches_pysim(verilator_ok, tmp_path):
    """`npu export --top matmul` writes Verilog; cocotb + Verilator check it against the golden
    model and against Amaranth's simulator's cycle count."""
    from sim.rtl.cocotb_tb import run_cocotb

    text = exported_verilog(tmp_path, "matmul", npu_preset("tiny"))
    rng = seeded(21)
    job = random_job(rng, 6, 11, 7, 4, OutMode.INT8)
    data = {"a": job.a, "b": job.b, "bias": job.bias, "mult": job.mult, "shift": job.shift,
            "mode": int(job.mode), "size": job.size, "a_unsigned": int(job.a_unsigned)}
    out = run_cocotb(text, top="npu_matmul", test_module="tb_matmul", data=data)
    assert_equal_matrix(out["result"], golden(job), "verilator")
    pysim = simulate_pysim(job)
    assert out["cycles"] == pysim["cycles"], (out["cycles"], pysim["cycles"])
