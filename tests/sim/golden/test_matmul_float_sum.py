"""The golden matmul sums in float64 (BLAS) and must still give the integer sum: extreme
operands (every product at its largest, signed and unsigned A), long K, and the int32 wrap."""

import numpy as np

from sim.golden.matmul import matmul, wrap


def _int64(a, b):
    return wrap(np.asarray(a, np.int64) @ np.asarray(b, np.int64))


def test_float_sum_is_the_integer_sum():
    rng = np.random.default_rng(3)
    for k in (1, 7, 576, 1536, 20000):
        a = rng.integers(-128, 128, (5, k))
        b = rng.integers(-128, 128, (k, 6))
        assert (matmul(a, b) == _int64(a, b)).all()
        au = rng.integers(0, 256, (5, k))
        assert (matmul(au, b, a_unsigned=True) == _int64(au, b)).all()
    # Every product at -128 * -128 over K = 2**17 wraps the int32 sum exactly like hardware.
    k = 1 << 17
    a, b = np.full((1, k), -128), np.full((k, 2), -128)
    assert matmul(a, b)[0, 0] == _int64(a, b)[0, 0] == wrap(np.int64(k) << 14)
    au = np.full((1, k), 255)
    assert matmul(au, b, a_unsigned=True)[0, 0] == wrap(np.int64(k) * 255 * -128)
