"""Golden vector-unit model: integer semantics, edge cases and error bounds against float64.

Error bounds asserted here (measured values in the comments, from the fixed seeds below):

- GELU via the LUT: within 1 LSB of float64 GELU re-quantised (measured: 0 LSB, the table
  *is* the re-quantised float GELU), for int8 inputs at several input/output scales.
- rsqrt: relative error <= 2**-22 (measured 1.44e-7 = 2**-22.7).
- LayerNorm: int16 output within 2 LSB of float64 LayerNorm re-quantised (measured: 1 LSB),
  for int16 inputs x anywhere in [-32768, 32767] (uniform, narrow +-100 around a random offset,
  two-valued full scale, Gaussian with outliers), d_model 2..512, gamma any int16, beta in
  [-4096, 4095] and gshift in [16, 24] (a gain gamma * 2**(16 - gshift) of at most 2**15 output
  LSBs per standard deviation). The float reference uses the same integer gamma and beta, eps=0.
- SiLU via the LUT: the same construction as GELU's (measured: 0 LSB from float64 SiLU
  re-quantised).
- RMSNorm (the same datapath with sum x taken as 0): the same bound on the same inputs against
  float64 RMSNorm re-quantised (measured: 1 LSB).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hw.spec.vector import (
    LN_Z_FRAC_BITS,
    VectorCmd,
    VectorOp,
    pack_gamma_beta,
    pack_requant,
    rsqrt_seed_table,
)
from sim.golden.matmul import requant
from sim.golden.vector import (
    VectorUnitModel,
    bias_add,
    gated_mul,
    gelu_float,
    gelu_table,
    layernorm,
    layernorm_float,
    ln_normalise,
    ln_stats,
    lut_apply,
    relu,
    relu_table,
    residual_add,
    rmsnorm,
    rmsnorm_float,
    rsqrt_fixed,
    silu_float,
    silu_table,
    unpack_gamma_beta,
    unpack_requant,
)

I16 = (-(1 << 15), (1 << 15) - 1)


def _requantised(y):
    return np.clip(np.floor(y + 0.5), *I16).astype(np.int64)


# ---- element-wise -------------------------------------------------------------------------

def test_residual_add_saturates_never_wraps():
    a = np.array([32767, -32768, 32767, -32768, 20000, -20000, 5, 0])
    b = np.array([1, -1, 32767, -32768, 20000, -20000, -7, 0])
    assert list(residual_add(a, b)) == [32767, -32768, 32767, -32768, 32767, -32768, -2, 0]


def test_bias_add_wraps_int32():
    assert list(bias_add([2**31 - 1, -2**31], [1, -1])) == [-2**31, 2**31 - 1]


def test_requant_saturates_both_ends():
    # int16 -> int8, int32 -> int16 and int8 -> int16, at the largest gain each.
    assert list(requant([32767, -32768], 65535, 1, 8)) == [127, -128]
    assert list(requant([2**31 - 1, -2**31], 65535, 1, 16)) == [32767, -32768]
    assert list(requant([127, -128], 65535, 1, 16)) == [32767, -32768]
    assert list(requant([127, -128, 3], 1, 1, 16)) == [64, -64, 2]   # rounds half up


def test_pack_roundtrip(rng):
    mult = rng.integers(0, 1 << 16, 50)
    shift = rng.integers(1, 48, 50)
    assert all(np.array_equal(u, v) for u, v in zip(unpack_requant(pack_requant(mult, shift)),
                                                     (mult, shift), strict=True))
    gamma = rng.integers(*I16, 50, endpoint=True)
    beta = rng.integers(*I16, 50, endpoint=True)
    words = pack_gamma_beta(gamma, beta)
    assert words.min() >= -2**31 and words.max() < 2**31
    assert all(np.array_equal(u, v) for u, v in zip(unpack_gamma_beta(words), (gamma, beta),
                                                     strict=True))


def test_relu():
    assert list(relu([-5, 0, 7, -2**31])) == [0, 0, 7, 0]
    table = relu_table(1.0, 1.0)
    assert list(lut_apply(table, [-128, -1, 0, 1, 127])) == [0, 0, 0, 1, 127]
    assert list(lut_apply(relu_table(1.0, 2.0), [-4, 3, 127])) == [0, 2, 64]


@pytest.mark.parametrize("in_scale, out_scale", [
    (4 / 128, 4 / 128), (8 / 128, 6 / 128), (2 / 128, 1 / 128), (6 / 128, 1 / 64)])
def test_gelu_within_one_lsb(in_scale, out_scale):
    """Every int8 input: LUT GELU vs float64 GELU re-quantised, <= 1 LSB (measured 0)."""
    x = np.arange(-128, 128)
    got = lut_apply(gelu_table(in_scale, out_scale), x)
    ref = np.clip(np.floor(gelu_float(x * in_scale) / out_scale + 0.5), -128, 127)
    err = np.abs(got - ref)
    assert err.max() <= 1, f"GELU error {err.max()} LSB at x={x[err.argmax()]}"
    # Before re-quantisation the table is within half an LSB wherever it does not saturate.
    exact = gelu_float(x * in_scale) / out_scale
    inside = (exact > -128) & (exact < 127)
    assert np.abs(got - exact)[inside].max() <= 0.5


@pytest.mark.parametrize("in_scale, out_scale", [(4 / 128, 4 / 128), (8 / 128, 6 / 128)])
def test_silu_table_is_silu_requantised(in_scale, out_scale):
    """Every int8 input: the SiLU LUT is float64 SiLU re-quantised (0 LSB), within half an
    LSB of the exact value wherever it does not saturate."""
    x = np.arange(-128, 128)
    got = lut_apply(silu_table(in_scale, out_scale), x)
    exact = silu_float(x * in_scale) / out_scale
    assert np.array_equal(got, np.clip(np.floor(exact + 0.5), -128, 127))
    inside = (exact > -128) & (exact < 127)
    assert np.abs(got - exact)[inside].max() <= 0.5
    assert silu_float([0.0])[0] == 0.0
    assert abs(silu_float([1.0])[0] - 1 / (1 + math.exp(-1))) < 1e-15


def test_gated_mul_is_requantised_product(rng):
    """MUL: requant(int8(a) * int8(b)) with round-half-up and saturation, only low bytes."""
    a, b = rng.integers(-128, 128, 50), rng.integers(-128, 128, 50)
    assert np.array_equal(gated_mul(a, b, 20000, 15), requant(a * b, 20000, 15, 8))
    assert np.array_equal(gated_mul(a + 256, b - 512, 20000, 15), gated_mul(a, b, 20000, 15))
    assert list(gated_mul([-128, -128, 3], [-128, 127, 1], 1, 1)) == [127, -128, 2]
    assert list(gated_mul([-128, -128], [-128, 127], 65535, 1, 16)) == [32767, -32768]
    out = VectorUnitModel().execute(VectorCmd(VectorOp.MUL, 3, mult=1 << 15, shift=15),
                                    [5, -7, 127], [3, 3, -128])
    assert list(out["data"]) == [15, -21, -128] and list(out["q"]) == [0, 0, 0]


def test_gelu_float_reference():
    assert gelu_float([0.0])[0] == 0.0
    assert abs(gelu_float([1.0])[0] - 0.8413447460685429) < 1e-15


# ---- rsqrt --------------------------------------------------------------------------------

def test_rsqrt_relative_error(rng):
    ds = (list(range(1, 5000)) + [int(v) for v in rng.integers(1, 2**62, 20000)]
          + [(1 << k) + o for k in range(62) for o in (-1, 0, 1) if (1 << k) + o > 0]
          + [((i + 32) << 25) + o for i in range(96) for o in (0, (1 << 25) - 1)])
    worst = 0.0
    for d in ds:
        y, h = rsqrt_fixed(d)
        err = abs(y * 2.0 ** -(39 + h) * math.sqrt(d) - 1)
        worst = max(worst, err)
    assert worst <= 2**-22, f"rsqrt relative error {worst} > 2**-22"


def test_rsqrt_zero_and_seed_table():
    assert rsqrt_fixed(0) == (0, 0)
    assert rsqrt_fixed(-5) == (0, 0)
    table = rsqrt_seed_table()
    assert len(table) == 96 and max(table) < 1 << 24 and min(table) > 1 << 23


# ---- LayerNorm ----------------------------------------------------------------------------

def _ln_case(rng, length, kind):
    if kind == "uniform":
        x = rng.integers(*I16, length, endpoint=True)
    elif kind == "narrow":
        x = rng.integers(-100, 101, length) + int(rng.integers(-32000, 32000))
    elif kind == "two-valued":
        x = rng.choice(list(I16), length)
    else:
        x = np.clip(np.round(rng.normal(0, 500, length)), *I16).astype(np.int64)
        x[rng.integers(0, length, max(1, length // 50))] = rng.choice([-32768, 32767])
    gamma = rng.integers(*I16, length, endpoint=True)
    beta = rng.integers(-4096, 4096, length)
    gshift = int(rng.integers(16, 25))
    return x, gamma, beta, gshift


@pytest.mark.parametrize("kind", ["uniform", "narrow", "two-valued", "outliers"])
@pytest.mark.parametrize("name, norm, reference", [("LayerNorm", layernorm, layernorm_float),
                                                   ("RMSNorm", rmsnorm, rmsnorm_float)])
def test_norm_error_within_two_lsb(rng, kind, name, norm, reference):
    """Against float64 requantised (LayerNorm of a constant vector is beta alone: skipped)."""
    worst = 0
    for _ in range(60):
        length = int(rng.integers(1 if norm is rmsnorm else 2, 513))
        x, gamma, beta, gshift = _ln_case(rng, length, kind)
        if norm is layernorm and np.all(x == x[0]):
            continue
        y16, q8 = norm(x, gamma, beta, gshift, 1 << 15, 23)
        ref = _requantised(reference(x, gamma, beta, gshift))
        err = np.abs(y16 - ref)
        worst = max(worst, int(err.max()))
        assert err.max() <= 2, (f"length {length}: {name} error {err.max()} LSB at element "
                                f"{err.argmax()} (x={x[err.argmax()]})")
        assert np.array_equal(q8, requant(y16, 1 << 15, 23, 8))
    print(f"{kind}: max {name} error {worst} LSB")


@pytest.mark.parametrize("value", [-32768, -1, 0, 1, 12345, 32767])
@pytest.mark.parametrize("length", [1, 2, 7, 512])
def test_layernorm_constant_vector_gives_beta(rng, value, length):
    """Variance 0: D = 0, rsqrt defined as 0, so the output is exactly beta."""
    x = np.full(length, value)
    gamma = rng.integers(*I16, length, endpoint=True)
    beta = rng.integers(*I16, length, endpoint=True)
    y16, q8 = layernorm(x, gamma, beta, 16, 40000, 22)
    assert np.array_equal(y16, beta)
    assert np.array_equal(q8, requant(beta, 40000, 22, 8))


@pytest.mark.parametrize("pattern", ["alternating", "one-high", "random-extremes"])
def test_layernorm_full_scale_512(rng, pattern):
    """Full-scale int16 at d_model 512 (the largest d_model_max of the simulable presets)."""
    n = 512
    if pattern == "alternating":
        x = np.where(np.arange(n) % 2, 32767, -32768)
    elif pattern == "one-high":   # largest |z| = sqrt(n - 1): the widest normalised value
        x = np.full(n, -32768)
        x[17] = 32767
    else:
        x = rng.choice(list(I16), n)
    s1, s2 = ln_stats(x)
    assert -2**31 <= s1 < 2**31 and 0 <= s2 < 2**63
    gamma = np.full(n, 1 << 14)
    beta = rng.integers(-100, 100, n)
    for gshift in (16, 20):
        y16, _ = layernorm(x, gamma, beta, gshift, 1 << 15, 23)
        ref = _requantised(layernorm_float(x, gamma, beta, gshift))
        assert np.abs(y16 - ref).max() <= 2
    if pattern == "one-high":
        # z = sqrt(511) * 2**14 * 2**(16 - 20) ~ 22881 output LSBs, unsaturated.
        y16, _ = layernorm(x, gamma, np.zeros(n, dtype=np.int64), 20, 1 << 15, 23)
        assert abs(int(y16[17]) - round(math.sqrt(511) * 2**10)) <= 1


def test_stats_widths_at_largest_count():
    """sum x fits int32 and sum x^2 int64 for the largest count (n < 2**16) at full scale."""
    x = np.full((1 << 16) - 1, -32768)
    s1, s2 = ln_stats(x)
    assert s1 == -32768 * ((1 << 16) - 1) and s1 >= -2**31
    assert s2 == 2**30 * ((1 << 16) - 1) < 2**63


@pytest.mark.parametrize("shards", [2, 3, 4])
@pytest.mark.parametrize("length", [37, 512])
def test_partial_statistics_equal_full_layernorm(rng, shards, length):
    """Local stats on uneven shards, summed, then normalised: the full LayerNorm bit for bit."""
    for trial in range(5):
        x = rng.integers(*I16, length, endpoint=True) if trial % 2 else (
            rng.integers(-50, 50, length) + 20000)
        gamma = rng.integers(*I16, length, endpoint=True)
        beta = rng.integers(-4096, 4096, length)
        cuts = np.sort(rng.choice(np.arange(1, length), shards - 1, replace=False))
        parts = np.split(np.arange(length), cuts)
        assert len({len(p) for p in parts}) > 1 or shards == 1
        stats = [ln_stats(x[p]) for p in parts]
        s1 = sum(s for s, _ in stats)
        s2 = sum(s for _, s in stats)
        full = layernorm(x, gamma, beta, 18, 30000, 22)
        for key in range(2):
            merged = np.concatenate([
                ln_normalise(x[p], s1, s2, length, gamma[p], beta[p], 18, 30000, 22)[key]
                for p in parts])
            assert np.array_equal(merged, full[key]), f"cuts {cuts}: output {key} differs"


def test_layernorm_z_format():
    """gamma = 2**14, gshift = 16: y = z * 2**14 where z = (x - mean) / std."""
    x = np.array([0, 0, 0, 10])   # z = [-1, -1, -1, 3] / sqrt(3)
    y16, _ = layernorm(x, np.full(4, 1 << 14), np.zeros(4), LN_Z_FRAC_BITS, 1, 1)
    assert list(y16) == [round(-2**14 / math.sqrt(3))] * 3 + [round(math.sqrt(3) * 2**14)]


# ---- RMSNorm ------------------------------------------------------------------------------

def test_rmsnorm_is_layernorm_datapath_without_sum():
    """RMSNorm is ln_normalise with s1 taken as 0 (whatever is passed), not a copy: on a
    zero-mean vector LayerNorm and RMSNorm agree bit for bit."""
    x = np.array([-300, -100, 100, 300, -7, 7])
    gamma, beta = np.full(6, 12345), np.arange(6) - 3
    s1, s2 = ln_stats(x)
    assert s1 == 0
    for key in range(2):
        assert np.array_equal(rmsnorm(x, gamma, beta, 17, 30000, 22)[key],
                              layernorm(x, gamma, beta, 17, 30000, 22)[key])
    shifted = x + 1000
    s1, s2 = ln_stats(shifted)
    for key in range(2):
        assert np.array_equal(
            ln_normalise(shifted, 123456, s2, 6, gamma, beta, 17, 30000, 22, rms=True)[key],
            rmsnorm(shifted, gamma, beta, 17, 30000, 22)[key])


@pytest.mark.parametrize("length", [1, 2, 7, 512])
def test_rmsnorm_zero_vector_gives_beta(rng, length):
    """mean(x^2) = 0: D = 0, rsqrt defined as 0, so the output is beta (0 in the compiler)."""
    x = np.zeros(length, dtype=np.int64)
    gamma = rng.integers(*I16, length, endpoint=True)
    beta = rng.integers(*I16, length, endpoint=True)
    y16, q8 = rmsnorm(x, gamma, beta, 16, 40000, 22)
    assert np.array_equal(y16, beta)
    assert np.array_equal(q8, requant(beta, 40000, 22, 8))
    assert np.array_equal(rmsnorm_float(x, gamma, beta, 16), beta)


def test_rmsnorm_constant_vector_is_sign():
    """A constant vector's RMS is |x|: z = sign(x), exactly representable (no centring)."""
    for value in (-32768, -3, 5, 32767):
        y16, _ = rmsnorm(np.full(9, value), np.full(9, 1 << 14), np.zeros(9), 16, 1, 1)
        assert list(y16) == [int(np.sign(value)) << 14] * 9


@pytest.mark.parametrize("length", [512, (1 << 16) - 1])
def test_rmsnorm_widest_z_at_extreme_counts(length):
    """One full-scale element among zeros: z = sqrt(n), the widest RMSNorm value, below the
    25-bit z's 256 even at the largest count (n < 2**16); D = n * S2 stays below 2**62."""
    x = np.zeros(length, dtype=np.int64)
    x[3] = -32768
    s1, s2 = ln_stats(x)
    assert length * s2 <= (1 << 62) - 1
    gamma = np.full(length, 1 << 7)
    y16, _ = rmsnorm(x, gamma, np.zeros(length), 16, 1 << 15, 23)
    assert abs(int(y16[3]) + round(math.sqrt(length) * 2**7)) <= 1
    assert not y16[np.arange(length) != 3].any()
    ref = _requantised(rmsnorm_float(x, gamma, np.zeros(length), 16))
    assert np.abs(y16 - ref).max() <= 1
    full = np.full(length, -32768)
    assert length * ln_stats(full)[1] <= (1 << 62) - 1
    y16, _ = rmsnorm(full, gamma, np.zeros(length), 16, 1 << 15, 23)
    assert (y16 == -(1 << 7)).all()


@pytest.mark.parametrize("shards", [2, 3, 4])
def test_partial_statistics_equal_full_rmsnorm(rng, shards):
    """LN_STATS on uneven shards, summed, then normalised with rms: RMS bit for bit."""
    length = 97
    for trial in range(4):
        x = rng.integers(*I16, length, endpoint=True) if trial % 2 else (
            rng.integers(-50, 50, length) + 20000)
        gamma = rng.integers(*I16, length, endpoint=True)
        beta = np.zeros(length, dtype=np.int64)
        cuts = np.sort(rng.choice(np.arange(1, length), shards - 1, replace=False))
        parts = np.split(np.arange(length), cuts)
        stats = [ln_stats(x[p]) for p in parts]
        s1, s2 = sum(s for s, _ in stats), sum(s for _, s in stats)
        full = rmsnorm(x, gamma, beta, 18, 30000, 22)
        for key in range(2):
            merged = np.concatenate([
                ln_normalise(x[p], s1, s2, length, gamma[p], beta[p], 18, 30000, 22,
                             rms=True)[key] for p in parts])
            assert np.array_equal(merged, full[key]), f"cuts {cuts}: output {key} differs"


# ---- the command interpreter --------------------------------------------------------------

def test_model_executes_every_op(rng):
    unit = VectorUnitModel()
    a = rng.integers(-128, 128, 9)
    assert np.array_equal(unit.execute(VectorCmd(VectorOp.LUT, 9), a)["data"], np.maximum(a, 0))
    table = gelu_table(0.05, 0.04)
    assert unit.execute(VectorCmd(VectorOp.LOAD_LUT, 0), table) == {}
    assert np.array_equal(unit.execute(VectorCmd(VectorOp.LUT, 9), a)["data"], table[a & 0xFF])
    out = unit.execute(VectorCmd(VectorOp.REQUANT, 3, per_channel=True, out16=True),
                       [1000, 1000, -1000], pack_requant([1, 2, 3], [1, 2, 3]))
    assert list(out["data"]) == [500, 500, -375] and list(out["q"]) == [0, 0, 0]
    x = rng.integers(*I16, 20, endpoint=True)
    words = pack_gamma_beta(rng.integers(*I16, 20), rng.integers(-99, 99, 20))
    full = unit.execute(VectorCmd(VectorOp.LN, 20, gshift=17, mult=30000, shift=22), x, words)
    stats = unit.execute(VectorCmd(VectorOp.LN_STATS, 20), x)["stats"]
    applied = unit.execute(VectorCmd(VectorOp.LN_APPLY, 20, n=20, gshift=17, mult=30000,
                                     shift=22), x, words, stats)
    assert all(np.array_equal(full[k], applied[k]) for k in ("data", "q"))
    full = unit.execute(VectorCmd(VectorOp.RMS, 20, gshift=17, mult=30000, shift=22), x, words)
    assert np.array_equal(full["data"], rmsnorm(x, *unpack_gamma_beta(words), 17, 30000, 22)[0])
    applied = unit.execute(VectorCmd(VectorOp.RMS_APPLY, 20, n=20, gshift=17, mult=30000,
                                     shift=22), x, words, stats)
    assert all(np.array_equal(full[k], applied[k]) for k in ("data", "q"))
