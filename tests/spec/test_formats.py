"""Number formats: quantize_multiplier's precision, range and rejections."""

import math
from fractions import Fraction

import numpy as np
import pytest

from hw.spec.formats import (
    ACC_BITS,
    MULT_BITS,
    OUT_BITS,
    SHIFT_BITS,
    SHIFT_MAX,
    SHIFT_MIN,
    OutMode,
    quantize_multiplier,
)

# Below this scale the shift is capped at SHIFT_MAX and mult cannot be normalised to 16 bits.
FULL_PRECISION_MIN = Fraction(1 << (MULT_BITS - 1), 1 << SHIFT_MAX)  # 2**-32


def _sweep(rng):
    """Log-spaced scales 2**-40 .. 2**14, plus powers of two and their float neighbours."""
    scales = list(np.logspace(-40, 14, 1501, base=2.0))
    scales += list(2.0 ** rng.uniform(-40, 14, size=500))
    for e in range(-40, 15):
        scales += [2.0 ** e, math.nextafter(2.0 ** e, 0), math.nextafter(2.0 ** e, math.inf)]
    return [float(s) for s in scales if 2.0 ** -40 <= s <= 2.0 ** 14]


def test_sweep_precision(rng):
    worst = 0.0
    for i, scale in enumerate(_sweep(rng)):
        mult, shift = quantize_multiplier(scale)
        assert type(mult) is int and type(shift) is int, f"#{i} scale={scale!r}"
        assert 1 <= mult < 1 << MULT_BITS, f"#{i} scale={scale!r}: mult={mult}"
        assert SHIFT_MIN <= shift <= SHIFT_MAX, f"#{i} scale={scale!r}: shift={shift}"
        exact = Fraction(scale)
        error = abs(Fraction(mult, 1 << shift) - exact)
        # Round to nearest: within half a unit of the last place of mult.
        assert error <= Fraction(1, 1 << (shift + 1)), f"#{i} scale={scale!r}: {mult}/2**{shift}"
        if exact >= FULL_PRECISION_MIN:
            # Normalised mult (2**15 <= mult < 2**16): relative error at most 2**-16.
            assert mult >= 1 << (MULT_BITS - 1), f"#{i} scale={scale!r}: mult={mult} shift={shift}"
            assert error <= exact / (1 << 16), f"#{i} scale={scale!r}: {mult}/2**{shift}"
            worst = max(worst, float(error / exact))
        else:
            # Shift capped: absolute error at most 2**-48, and any int32 accumulator times such
            # a scale requantises to 0, exactly as the real-valued product rounds to 0.
            assert shift == SHIFT_MAX, f"#{i} scale={scale!r}: shift={shift}"
            assert error <= Fraction(1, 1 << (SHIFT_MAX + 1))
            for acc in (-(1 << (ACC_BITS - 1)), (1 << (ACC_BITS - 1)) - 1):
                assert (acc * mult + (1 << (shift - 1))) >> shift == 0, f"#{i} acc={acc}"
    print(f"worst relative error {worst:.3g} (bound {2.0 ** -16:.3g})")
    assert worst > 2.0 ** -18  # the sweep does reach the bound's order: the check can fail


@pytest.mark.parametrize("scale, expected", [
    (1.0, (1 << 15, 15)),
    (0.5, (1 << 15, 16)),
    (0.75, (3 << 14, 16)),
    (2.0 ** 14, (1 << 15, 1)),
    (32767.5, (65535, 1)),
    (2.0 ** -32, (1 << 15, 47)),
    (2.0 ** -40, (1 << 7, 47)),
    (2.0 ** -47, (1, 47)),
    # 65535.75 / 2**20 rounds to mult 2**16 at shift 20: one shift less gives 2**15 exactly.
    (65535.75 / 2 ** 20, (1 << 15, 19)),
    (1, (1 << 15, 15)),
    (np.float32(0.25), (1 << 15, 17)),
    (np.float64(3.0), (3 << 14, 14)),
])
def test_exact_cases(scale, expected):
    assert quantize_multiplier(scale) == expected


@pytest.mark.parametrize("scale, message", [
    (0.0, "must be finite and positive"),
    (-0.0, "must be finite and positive"),
    (0, "must be finite and positive"),
    (-1.0, "must be finite and positive"),
    (-2.0 ** -20, "must be finite and positive"),
    (math.nan, "must be finite and positive"),
    (math.inf, "must be finite and positive"),
    (-math.inf, "must be finite and positive"),
    (10 ** 400, "must be finite and positive"),
    (2.0 ** 15, "exceeds the largest representable 32767.5"),
    (32767.75, "exceeds the largest representable 32767.5"),
    (1e300, "exceeds the largest representable"),
    (2.0 ** -48, r"too small: it rounds to mult 0 at shift 47 \(the scale must exceed 2\*\*-48\)"),
    (2.0 ** -60, "too small"),
    (5e-324, "too small"),
])
def test_rejects_value(scale, message):
    with pytest.raises(ValueError, match=rf"^requantisation scale .* {message}"):
        quantize_multiplier(scale)


@pytest.mark.parametrize("scale", ["1.0", None, True, False, 1 + 0j, [1.0]])
def test_rejects_type(scale):
    with pytest.raises(TypeError, match="requantisation scale must be a real number, not "):
        quantize_multiplier(scale)


def test_smallest_and_largest_accepted():
    assert quantize_multiplier(math.nextafter(2.0 ** -48, 1)) == (1, SHIFT_MAX)
    assert quantize_multiplier(math.nextafter(32767.75, 0)) == (65535, SHIFT_MIN)


def test_format_constants():
    assert SHIFT_MAX < 1 << SHIFT_BITS  # the shift field holds every legal shift
    assert OUT_BITS == {OutMode.RAW: ACC_BITS, OutMode.INT8: 8, OutMode.INT16: 16}
    assert [m.value for m in OutMode] == [0, 1, 2]
