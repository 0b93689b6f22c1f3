"""The softmax unit's integer algorithm: constants and tables shared by gateware and golden model.

Plain Python (no Amaranth, no NumPy), so that ``hw.tile.softmax`` and ``sim.golden.softmax``
build the very same exp table. The algorithm, for one row of ``L`` scores ``s`` (int16, real
logit ``s / 2**SCORE_FRAC_BITS``) with visibility mask ``m``:

1. ``M = max(s[j] for visible j)`` (``-2**15`` when no lane is visible).
2. ``d = min(M - s, D_MAX)``, the distance below the maximum in score units (``d >= 0``).
3. ``y = (d * LOG2E_MULT + 2**(LOG2E_SHIFT-1)) >> LOG2E_SHIFT``: ``d * log2(e)`` with
   ``EXP_FRAC_BITS`` fraction bits, so that ``exp(-d/256) = 2**(-y / 2**EXP_FRAC_BITS)``.
4. ``e = EXP_LUT[y & (2**EXP_FRAC_BITS - 1)] >> (y >> EXP_FRAC_BITS)`` for visible lanes, ``0``
   for masked lanes; ``EXP_LUT[f] = round(2**(EXP_BITS - f / 2**EXP_FRAC_BITS))``, so the maximum
   lane gets exactly ``2**EXP_BITS`` and ``e`` fits ``EXP_BITS + 1`` bits unsigned. ``D_MAX`` is
   large enough that ``e`` is already 0 there (``y >> 8 >= 16``).
5. ``S = sum(e)``; ``S >= 2**EXP_BITS`` when any lane is visible, ``S == 0`` otherwise.
6. ``z = S.bit_length() - 1``, ``R = 2**(z + RECIP_BITS) // S`` (``2**(RECIP_BITS-1) <= R <=
   2**RECIP_BITS``): one reciprocal per row, normalised so that it keeps ``RECIP_BITS`` bits
   whatever ``L`` is. When ``S == 0`` every ``e`` is 0 and so is every ``p``, whatever ``R``
   (the golden model takes ``R = 0``).
7. ``sh = z + RECIP_BITS - PROB_BITS``, ``p = min((e * R + 2**(sh-1)) >> sh, 2**PROB_BITS - 1)``:
   round half up to ``p / 256``; a lane whose probability rounds to 256/256 saturates to 255.

Masked lanes have ``e = 0`` and therefore ``p = 0`` exactly; a fully masked row is all zeros.
"""

from .formats import PROB_BITS, SCORE_BITS, SCORE_FRAC_BITS

__all__ = ["EXP_BITS", "EXP_FRAC_BITS", "LOG2E_MULT", "LOG2E_SHIFT", "D_MAX", "Y_MASKED",
           "RECIP_BITS", "EXP_LUT", "sum_bits", "max_sum_exponent"]

#: ``e`` of the maximum lane is ``2**EXP_BITS`` (exp(0) = 1.0).
EXP_BITS = 15
#: Fraction bits of the base-2 exponent ``y`` (and index bits of ``EXP_LUT``).
EXP_FRAC_BITS = 8
#: ``log2(e) * 2**LOG2E_SHIFT``, rounded: 1.4426950 * 16384 = 23637.3.
LOG2E_SHIFT = 14
LOG2E_MULT = 23637
#: Distances ``d`` are clamped to this (12 bits): ``y(D_MAX) >> 8 = 23 >= EXP_BITS + 1``, so
#: ``e`` is 0 from well below it on, and the clamp changes no result.
D_MAX = 4095
#: What the gateware writes in place of ``y`` for a masked lane: its exp is 0 (``>> 31``), the
#: same as masking ``e``, so the mask need not travel past the ``y`` stage.
Y_MASKED = (1 << 13) - 1
#: Bits of the normalised reciprocal (``R`` has ``RECIP_BITS + 1`` bits, one long-division step
#: each).
RECIP_BITS = 12

#: ``2**(EXP_BITS - f / 2**EXP_FRAC_BITS)`` rounded to an integer, for ``f`` in ``0..255``.
EXP_LUT = tuple(round(2.0 ** (EXP_BITS - f / (1 << EXP_FRAC_BITS)))
                for f in range(1 << EXP_FRAC_BITS))

assert SCORE_BITS == 16 and SCORE_FRAC_BITS == 8, "LOG2E_MULT assumes Q8.8 scores"
assert PROB_BITS == 8
assert (((D_MAX * LOG2E_MULT + (1 << (LOG2E_SHIFT - 1))) >> LOG2E_SHIFT) >> EXP_FRAC_BITS
        > EXP_BITS)
assert (D_MAX * LOG2E_MULT + (1 << (LOG2E_SHIFT - 1))) >> LOG2E_SHIFT < Y_MASKED


def sum_bits(length: int) -> int:
    """Bits of ``S`` for a row of ``length`` lanes (``S <= length * 2**EXP_BITS``)."""
    return (length << EXP_BITS).bit_length()


def max_sum_exponent(length: int) -> int:
    """Largest ``z - EXP_BITS`` for a row of ``length`` lanes (``floor(log2(length))``)."""
    return length.bit_length() - 1
