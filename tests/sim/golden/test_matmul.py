"""Golden matmul unit vs naive pure-Python integer loops (exact): wrap, rounding, saturation."""

import math
from fractions import Fraction

import numpy as np
import pytest

from hw.spec.formats import OutMode
from sim.golden.matmul import bias_add, matmul, matmul_unit, requant, wrap

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


# --- naive references: Python ints, one element at a time ----------------------------------------

def naive_wrap32(x):
    return (x + (1 << 31)) % (1 << 32) - (1 << 31)


def naive_matmul(a, b):
    a, b = np.asarray(a).tolist(), np.asarray(b).tolist()
    m, k, n = len(a), len(b), len(b[0]) if b else 0
    return [[naive_wrap32(sum(a[i][t] * b[t][j] for t in range(k))) for j in range(n)]
            for i in range(m)]


def naive_requant(acc, mult, shift, bits):
    # Round half up (towards +inf) of the exact rational acc * mult / 2**shift, then saturate.
    y = math.floor(Fraction(acc * mult, 1 << shift) + Fraction(1, 2))
    return min(max(y, -(1 << (bits - 1))), (1 << (bits - 1)) - 1)


def assert_same(got, want, what):
    got = np.asarray(got)
    want = np.asarray(want, dtype=object)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    for index in np.ndindex(got.shape):
        assert int(got[index]) == want[index], \
            f"{what}: at {index} got {int(got[index])}, expected {want[index]}"


# --- matmul -------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 2), (4, 4, 4), (7, 13, 5), (1, 64, 9),
                                   (16, 3, 1)])
@pytest.mark.parametrize("a_unsigned", [False, True])
def test_matmul_random(rng, shape, a_unsigned):
    m, k, n = shape
    a = rng.integers(0, 256, (m, k)) if a_unsigned else rng.integers(-128, 128, (m, k))
    b = rng.integers(-128, 128, (k, n))
    got = matmul(a, b, a_unsigned=a_unsigned)
    assert got.dtype == np.int64
    assert_same(got, naive_matmul(a, b), f"matmul {shape} unsigned={a_unsigned}")


@pytest.mark.parametrize("a_value, b_value, a_unsigned", [
    (-128, -128, False), (-128, 127, False), (127, 127, False), (127, -128, False),
    (255, 127, True), (255, -128, True), (0, -128, True),
])
def test_matmul_extremes(a_value, b_value, a_unsigned):
    k = 300
    a = np.full((3, k), a_value, dtype=np.int16 if a_unsigned else np.int8)
    b = np.full((k, 2), b_value, dtype=np.int8)
    want = naive_wrap32(a_value * b_value * k)
    assert_same(matmul(a, b, a_unsigned=a_unsigned), [[want] * 2] * 3,
                f"{a_value} x {b_value}, K={k}")


def test_matmul_accepts_dtypes():
    # uint8 A in unsigned mode, Python lists, int8 and int64 all give the same integers.
    a = np.array([[255, 0, 1]], dtype=np.uint8)
    b = np.array([[1], [-128], [127]], dtype=np.int8)
    assert matmul(a, b, a_unsigned=True).tolist() == [[255 + 127]]
    assert matmul([[1, 2]], [[3], [4]]).tolist() == [[11]]
    assert matmul(np.zeros((2, 0), dtype=np.int8), np.zeros((0, 3), dtype=np.int8)).tolist() == \
        [[0] * 3] * 2


def test_int32_wraparound_all_minus_128():
    # (-128)^2 = 2**14 per product: K = 2**17 + 3 products sum to 2**31 + 3 * 2**14, which
    # does not fit int32 and must wrap to -2**31 + 3 * 2**14.
    k = (1 << 17) + 3
    a = np.full((2, k), -128, dtype=np.int8)
    b = np.full((k, 3), -128, dtype=np.int8)
    exact = k * (1 << 14)
    assert exact > INT32_MAX
    want = INT32_MIN + 3 * (1 << 14)
    got = matmul(a, b)
    assert_same(got, [[want] * 3] * 2, "all -128, K=2**17+3")
    assert_same(got, naive_matmul(a, b), "all -128 vs naive")


@pytest.mark.parametrize("b_value, want", [
    # 255 * 127 * 140000 = 4,533,900,000 = 2**32 + 238,932,704
    (127, 238_932_704),
    # 255 * -128 * 140000 = -4,569,600,000 = -2**32 - 274,632,704
    (-128, -274_632_704),
])
def test_int32_wraparound_unsigned(b_value, want):
    k = 140_000
    a = np.full((1, k), 255)
    b = np.full((k, 2), b_value)
    b[::2, 1] = 0  # second column: half the products, 2,266,950,000 or -2,284,800,000
    got = matmul(a, b, a_unsigned=True)
    assert got[0, 0] == want, f"column 0: {got[0, 0]} != {want}"
    assert_same(got, naive_matmul(a, b), f"255 x {b_value}, K={k}")
    assert got[0, 1] == naive_wrap32(255 * b_value * (k // 2))


def test_wrapped_partial_sums_are_associative(rng):
    # Split K across 5 "chips": the wrapped partials, added with wrap, equal the single result.
    k = (1 << 17) + 1000
    a = rng.choice([-128, 127], size=(2, k))
    b = np.full((k, 2), -128)
    whole = matmul(a, b)
    total = np.zeros((2, 2), dtype=np.int64)
    for part in np.array_split(np.arange(k), 5):
        total = wrap(total + matmul(a[:, part], b[part]))
    assert_same(total, whole.tolist(), "sum of 5 wrapped partials")


# --- bias_add -----------------------------------------------------------------------------------

def test_bias_add_random(rng):
    acc = rng.integers(INT32_MIN, INT32_MAX, (6, 5), endpoint=True)
    bias = rng.integers(INT32_MIN, INT32_MAX, 5, endpoint=True)
    want = [[naive_wrap32(int(acc[i, j]) + int(bias[j])) for j in range(5)] for i in range(6)]
    assert_same(bias_add(acc, bias), want, "bias_add")


def test_bias_add_wraps():
    acc = np.array([[INT32_MAX, INT32_MIN, -1, 0]])
    bias = np.array([1, -1, INT32_MIN, INT32_MAX])
    assert bias_add(acc, bias).tolist() == [[INT32_MIN, INT32_MAX, INT32_MAX, INT32_MAX]]
    assert bias_add(acc, 0).tolist() == acc.tolist()  # a scalar bias broadcasts


# --- requant ------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 16])
def test_requant_random(rng, bits):
    # Per-column mult and shift; values drawn so that both in-range and saturated outputs occur.
    acc = rng.integers(INT32_MIN, INT32_MAX, (40, 6), endpoint=True)
    acc[::3] >>= rng.integers(0, 31, (1, 6))  # smaller magnitudes too
    mult = rng.integers(0, 1 << 16, 6)
    shift = rng.integers(1, 48, 6)
    shift[:3] = [20, 31, 40]  # some columns where most outputs are in range
    got = requant(acc, mult, shift, bits)
    want = [[naive_requant(int(acc[i, j]), int(mult[j]), int(shift[j]), bits) for j in range(6)]
            for i in range(40)]
    assert_same(got, want, f"requant bits={bits}")
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    assert ((got > lo) & (got < hi)).any() and ((got == lo) | (got == hi)).any()


@pytest.mark.parametrize("acc, want", [
    (1, 1), (-1, 0),      # +0.5 rounds up to 1, -0.5 rounds up to 0
    (3, 2), (-3, -1),     # +1.5 -> 2, -1.5 -> -1
    (2, 1), (-2, -1),     # exact
    (5, 3), (-5, -2),
])
def test_requant_rounds_half_up(acc, want):
    # mult 1, shift 1: acc / 2 rounded half up.
    assert requant(acc, 1, 1, 8) == want
    assert naive_requant(acc, 1, 1, 8) == want


@pytest.mark.parametrize("bits", [8, 16])
def test_requant_saturates(bits):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    acc = np.array([INT32_MAX, INT32_MIN, 2 * hi, 2 * hi + 1, 2 * hi + 2, 2 * lo, 2 * lo - 1,
                    2 * lo - 2])
    # mult 1, shift 1 halves: hi and lo are reached exactly, one step further saturates.
    assert requant(acc, 1, 1, bits).tolist() == [hi, lo, hi, hi, hi, lo, lo, lo]
    # The largest gain, 65535 / 2: +-1 give +32767.5 -> 32768 (rounding alone pushes it past
    # the int16 maximum) and -32767.5 -> -32767 (in range for int16).
    big = requant(np.array([INT32_MAX, INT32_MIN, 1, -1, 0]), 65535, 1, bits)
    assert big.tolist() == [hi, lo, hi, -32767 if bits == 16 else lo, 0]


@pytest.mark.parametrize("bits", [8, 16])
def test_requant_shift_and_mult_limits(bits):
    acc = np.array([INT32_MAX, INT32_MIN, 12345, -12345, 0])
    # shift 47, mult 65535: (2**31 - 1) * 65535 / 2**47 = 0.99998 -> 1; -2**31 gives -0.99998.
    assert requant(acc, 65535, 47, bits).tolist() == [1, -1, 0, 0, 0]
    # mult 0: the rounding term alone, (1 << (s-1)) >> s = 0, for every shift.
    for shift in (1, 2, 47):
        assert requant(acc, 0, shift, bits).tolist() == [0] * 5, f"mult 0 shift {shift}"
    # shift 1 with mult 1 halves.
    assert requant(np.array([100, -100, 101, -101]), 1, 1, bits).tolist() == [50, -50, 51, -50]
    for a in acc.tolist():
        for mult, shift in ((65535, 47), (0, 1), (65535, 1), (1, 1), (46341, 17)):
            assert requant(a, mult, shift, bits) == naive_requant(a, mult, shift, bits), \
                f"acc={a} mult={mult} shift={shift}"


def test_requant_per_column():
    acc = np.array([[1000, 1000, 1000], [-1000, -1000, -1000]])
    got = requant(acc, np.array([1, 3, 65535]), np.array([1, 4, 16]), 16)
    assert got.tolist() == [[500, 188, 1000], [-500, -187, -1000]]


# --- matmul_unit --------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [OutMode.RAW, OutMode.INT8, OutMode.INT16, 1])
@pytest.mark.parametrize("a_unsigned", [False, True])
def test_matmul_unit(rng, mode, a_unsigned):
    m, k, n = 5, 11, 4
    a = rng.integers(0, 256, (m, k)) if a_unsigned else rng.integers(-128, 128, (m, k))
    b = rng.integers(-128, 128, (k, n))
    bias = rng.integers(-(1 << 20), 1 << 20, n)
    bias[0] = INT32_MAX  # forces a wrap in column 0 for some rows
    mult = rng.integers(1 << 15, 1 << 16, n)
    shift = rng.integers(12, 24, n)
    got = matmul_unit(a, b, bias, mult, shift, mode, a_unsigned=a_unsigned)
    acc = [[naive_wrap32(v + int(bias[j])) for j, v in enumerate(row)]
           for row in naive_matmul(a, b)]
    mode = OutMode(mode)
    if mode is OutMode.RAW:
        want = acc
    else:
        bits = 8 if mode is OutMode.INT8 else 16
        want = [[naive_requant(v, int(mult[j]), int(shift[j]), bits) for j, v in enumerate(row)]
                for row in acc]
    assert_same(got, want, f"matmul_unit mode={mode.name} unsigned={a_unsigned}")


# --- wrap ---------------------------------------------------------------------------------------

def test_wrap():
    x = np.array([INT32_MAX + 1, INT32_MIN - 1, 1 << 40, -(1 << 40) - 5, 0])
    assert wrap(x).tolist() == [naive_wrap32(v) for v in x.tolist()]
    assert wrap(np.array([127, 128, 255, 256, -129]), 8).tolist() == [127, -128, -1, 0, 127]
    assert wrap(np.array([1, 2, 3]), 1).tolist() == [-1, 0, -1]
    assert wrap(np.array([-(1 << 63)]), 64).tolist() == [-(1 << 63)]
    assert wrap(np.array([(1 << 64) - 1], dtype=np.uint64)).tolist() == [-1]


# --- rejections ---------------------------------------------------------------------------------

A = np.zeros((2, 3), dtype=np.int64)
B = np.zeros((3, 4), dtype=np.int64)


@pytest.mark.parametrize("a, b, kwargs, error, message", [
    (A + 128, B, {}, ValueError, r"^a has values outside \[-128, 127\]: 128\.\.128$"),
    (A - 129, B, {}, ValueError, r"^a has values outside \[-128, 127\]"),
    (np.full((2, 3), 255), B, {}, ValueError, r"^a has values outside \[-128, 127\]"),
    (A - 1, B, {"a_unsigned": True}, ValueError, r"^a has values outside \[0, 255\]: -1\.\.-1$"),
    (A + 256, B, {"a_unsigned": True}, ValueError, r"^a has values outside \[0, 255\]"),
    (A, B + 128, {}, ValueError, r"^b has values outside \[-128, 127\]"),
    (A, np.full((3, 4), 255), {"a_unsigned": True}, ValueError, r"^b has values outside"),
    (A.astype(np.float64), B, {}, TypeError, r"^a must be an integer array, not float64$"),
    (A, B.astype(np.float32), {}, TypeError, r"^b must be an integer array, not float32$"),
    (A.astype(bool), B, {}, TypeError, r"^a must be an integer array, not bool$"),
    (A, np.zeros((4, 4), dtype=np.int8), {}, ValueError,
     r"^shapes \(2, 3\) and \(4, 4\) do not chain as \[M, K\] @ \[K, N\]$"),
    (A[0], B, {}, ValueError, r"^shapes \(3,\) and \(3, 4\) do not chain"),
    (A, B[None], {}, ValueError, r"^shapes \(2, 3\) and \(1, 3, 4\) do not chain"),
])
def test_matmul_rejects(a, b, kwargs, error, message):
    with pytest.raises(error, match=message):
        matmul(a, b, **kwargs)


ACC = np.zeros((2, 4), dtype=np.int64)


@pytest.mark.parametrize("acc, bias, error, message", [
    (ACC, np.zeros(4), TypeError, r"^bias must be an integer array, not float64$"),
    (ACC.astype(float), np.zeros(4, dtype=int), TypeError, r"^acc must be an integer array"),
    (ACC, np.array([0, 0, 0, 1 << 31]), ValueError,
     r"^bias has values outside \[-2147483648, 2147483647\]"),
    (ACC - (1 << 31) - 1, np.zeros(4, dtype=int), ValueError, r"^acc has values outside"),
    (ACC, np.zeros(3, dtype=int), ValueError,
     r"^bias of shape \(3,\) does not broadcast against the accumulator shape \(2, 4\)"),
    (ACC, np.zeros((3, 4), dtype=int), ValueError, r"^bias of shape \(3, 4\) does not broadcast"),
    (ACC, np.zeros((1, 2, 4), dtype=int), ValueError, r"^bias of shape \(1, 2, 4\)"),
])
def test_bias_add_rejects(acc, bias, error, message):
    with pytest.raises(error, match=message):
        bias_add(acc, bias)


@pytest.mark.parametrize("args, error, message", [
    ((ACC, -1, 8, 8), ValueError, r"^mult has values outside \[0, 65535\]: -1\.\.-1$"),
    ((ACC, 65536, 8, 8), ValueError, r"^mult has values outside \[0, 65535\]"),
    ((ACC, 1.5, 8, 8), TypeError, r"^mult must be an integer array, not float64$"),
    ((ACC, 1, 0, 8), ValueError, r"^shift has values outside \[1, 47\]: 0\.\.0$"),
    ((ACC, 1, 48, 8), ValueError, r"^shift has values outside \[1, 47\]"),
    ((ACC, 1, np.array([1, 2, 3, 48]), 8), ValueError, r"^shift has values outside \[1, 47\]"),
    ((ACC, 1, 8.0, 8), TypeError, r"^shift must be an integer array, not float64$"),
    ((ACC, np.ones(3, dtype=int), 8, 8), ValueError,
     r"^mult of shape \(3,\) does not broadcast against the accumulator shape \(2, 4\)"),
    ((ACC, 1, np.ones(5, dtype=int), 8), ValueError, r"^shift of shape \(5,\) does not"),
    ((ACC.astype(float), 1, 8, 8), TypeError, r"^acc must be an integer array, not float64$"),
    ((ACC + (1 << 31), 1, 8, 8), ValueError, r"^acc has values outside \[-2147483648, "),
    ((ACC, 1, 8, 1), ValueError, r"^bits=1 is outside \[2, 32\]$"),
    ((ACC, 1, 8, 33), ValueError, r"^bits=33 is outside \[2, 32\]$"),
    ((ACC, 1, 8, 8.0), TypeError, r"^bits must be an integer, not 8\.0$"),
    ((ACC, 1, 8, True), TypeError, r"^bits must be an integer, not True$"),
])
def test_requant_rejects(args, error, message):
    with pytest.raises(error, match=message):
        requant(*args)


@pytest.mark.parametrize("x, bits, error, message", [
    (np.zeros(2), 32, TypeError, r"^wrap needs an integer array, not float64$"),
    (np.zeros(2, dtype=int), 0, ValueError, r"^bits=0 is outside \[1, 64\]$"),
    (np.zeros(2, dtype=int), 65, ValueError, r"^bits=65 is outside \[1, 64\]$"),
    (np.zeros(2, dtype=int), 32.0, TypeError, r"^bits must be an integer, not 32\.0$"),
])
def test_wrap_rejects(x, bits, error, message):
    with pytest.raises(error, match=message):
        wrap(x, bits)


def test_matmul_unit_rejects_mode():
    with pytest.raises(ValueError, match="3 is not a valid OutMode"):
        matmul_unit(A, B, 0, 1, 1, 3)
    with pytest.raises(ValueError, match=r"^mult has values outside"):
        matmul_unit(A, B, 0, 65536, 1, OutMode.INT8)
