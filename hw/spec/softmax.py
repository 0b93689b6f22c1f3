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

**Partial mode** (one chunk of a row's keys; long context, ``docs/architecture.md``): steps 1-4
as above, then no reciprocal: each lane's *unnormalised* probability, relative to the chunk's
own maximum, ``u = min((e + 2**(PARTIAL_SHIFT-1)) >> PARTIAL_SHIFT, 2**PROB_BITS - 1)`` (the
maximum lane gets 256/256, saturated to 255), with the row's maximum ``M`` (int16) and the sum
``l = sum(u)`` (``partial_sum_bits(L)`` bits, unsigned). The attention buffer's P.V of ``u``
is the chunk's ``o = sum_j u_j v_j`` (int32).

**State and merge.** A partial result of a query row is its *state* ``(m, l, o[0..h-1])``:
``m`` the int16 maximum of the scores seen, ``l`` and ``o`` int32. Two states merge exactly as
the online softmax does, in integers::

    m  = max(m_a, m_b)
    f  = exp_factor(|m_a - m_b|)                  # steps 2-4 for d = |m_a - m_b|, Q0.15
    fa = 2**MERGE_BITS if m_a >= m_b else f       # the side holding the maximum keeps 1.0
    fb = 2**MERGE_BITS if m_b >= m_a else f
    l  = scale(l_a, fa) + scale(l_b, fb)
    o  = wrap32(scale(o_a, fa) + scale(o_b, fb))
    scale(x, f) = (x * f + 2**(MERGE_BITS-1)) >> MERGE_BITS     (arithmetic shift)

``exp_factor(d) = EXP_LUT[y mod 256] >> (y div 256)`` with ``y`` from ``min(d, D_MAX)`` as in
step 3: the very exp of the softmax. The side with the larger maximum is not rounded (its
factor is exactly 1.0); the **empty state** (``m = -2**15``, ``l = 0``, ``o = 0``: no visible
key) merges as the identity, so a chunk whose keys a query cannot see changes nothing. The
merge is commutative but, because of the rounding, not associative: a schedule fixes the order
of the chunks.

**Final normalisation** of a state: ``z = bitlen(l) - 1``, ``R = 2**(z + NORM_BITS) // l``
(``NORM_BITS + 1`` significant bits; 0 when ``l <= 0``), ``sh = z + NORM_BITS - PROB_BITS``,
``acc = wrap32((o * R + 2**(sh-1)) >> sh)``: ``o / l`` in the scale of a P.V of probabilities
that sum to 256, which the attention's output requantiser takes as it takes P.V.
"""

from .formats import PROB_BITS, SCORE_BITS, SCORE_FRAC_BITS

__all__ = ["EXP_BITS", "EXP_FRAC_BITS", "LOG2E_MULT", "LOG2E_SHIFT", "D_MAX", "Y_MASKED",
           "RECIP_BITS", "EXP_LUT", "sum_bits", "max_sum_exponent", "PARTIAL_SHIFT",
           "partial_sum_bits", "MERGE_BITS", "EMPTY_MAX", "NORM_BITS", "NORM_QUOTIENT_BITS"]

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


#: Partial mode: ``u = e >> PARTIAL_SHIFT`` rounded, 8 bits (the maximum lane's ``2**EXP_BITS``
#: is 256/256).
PARTIAL_SHIFT = EXP_BITS - PROB_BITS
#: Fraction bits of a merge factor (``2**MERGE_BITS`` = 1.0 = ``exp_factor(0)``).
MERGE_BITS = EXP_BITS
#: ``m`` of the empty state (no visible key): the int16 minimum, the softmax's maximum of a
#: fully masked row.
EMPTY_MAX = -(1 << (SCORE_BITS - 1))
#: Bits of the final normalisation's reciprocal: ``2**(NORM_BITS-1) < R <= 2**NORM_BITS``.
NORM_BITS = 16
#: Quotient bits of ``2**(z + NORM_BITS) // l`` with ``l`` normalised to its top bit.
NORM_QUOTIENT_BITS = NORM_BITS + 1


def partial_sum_bits(length: int) -> int:
    """Bits of the partial mode's ``l = sum(u)`` over ``length`` lanes (``u <= 255``)."""
    return (length * ((1 << PROB_BITS) - 1)).bit_length()


def sum_bits(length: int) -> int:
    """Bits of ``S`` for a row of ``length`` lanes (``S <= length * 2**EXP_BITS``)."""
    return (length << EXP_BITS).bit_length()


def max_sum_exponent(length: int) -> int:
    """Largest ``z - EXP_BITS`` for a row of ``length`` lanes (``floor(log2(length))``)."""
    return length.bit_length() - 1
