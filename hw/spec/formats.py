"""Number formats shared by gateware, golden models and compiler (``docs/formats.md``).

- Matmul operands are int8; the A operand may instead be unsigned 8-bit (softmax probabilities).
- Accumulators are int32 and wrap modulo 2**32 (two's complement), so partial sums computed on
  different chips add up to the single-chip result bit for bit.
- Biases are int32 and are added to the accumulator with the same wrap-around.
- Requantisation to ``bits`` in {8, 16}::

      requant(acc, mult, shift) = clamp((acc * mult + (1 << (shift - 1))) >> shift,
                                        -2**(bits-1), 2**(bits-1) - 1)

  with ``>>`` an arithmetic (floor) shift, ``mult`` unsigned 16-bit and ``1 <= shift <= 47``.
  The product is exact (49 bits); the result saturates, never wraps.
- The residual stream and LayerNorm inputs are int16; softmax probabilities are unsigned 8-bit
  (p / 256).
"""

import enum
import math
import numbers

__all__ = [
    "OPERAND_BITS", "ACC_BITS", "BIAS_BITS", "MULT_BITS", "SHIFT_BITS", "SHIFT_MIN", "SHIFT_MAX",
    "RESIDUAL_BITS", "PROB_BITS", "OutMode", "OUT_BITS", "OUT_BYTES", "out_words",
    "quantize_multiplier", "SCORE_BITS", "SCORE_FRAC_BITS",
]

OPERAND_BITS = 8
ACC_BITS = 32
BIAS_BITS = 32
MULT_BITS = 16
SHIFT_BITS = 6
SHIFT_MIN = 1
SHIFT_MAX = 47
RESIDUAL_BITS = 16
PROB_BITS = 8


class OutMode(enum.IntEnum):
    """What the requantiser emits for an output tile."""

    RAW = 0    #: int32 accumulator + bias (wrapped), for partial sums that are reduced elsewhere
    INT8 = 1   #: requantised and saturated to int8
    INT16 = 2  #: requantised and saturated to int16 (the residual stream)


#: Output bit width of each mode.
OUT_BITS = {OutMode.RAW: ACC_BITS, OutMode.INT8: 8, OutMode.INT16: 16}
#: Output bytes per element of each mode.
OUT_BYTES = {mode: bits // 8 for mode, bits in OUT_BITS.items()}


def out_words(mode) -> int:
    """Scratchpad words per output row of an N-column tile (a word is N bytes): the element
    bytes of ``mode``."""
    return OUT_BYTES[OutMode(mode)]


def quantize_multiplier(scale: float) -> tuple[int, int]:
    """Return ``(mult, shift)`` with ``mult / 2**shift`` the closest to ``scale``.

    ``1 <= mult < 2**MULT_BITS`` and ``SHIFT_MIN <= shift <= SHIFT_MAX``; ``mult`` is normalised
    to ``2**15 <= mult < 2**16`` where the shift range allows, so the relative error is at most
    ``2**-16`` for ``2**-32 <= scale <= 65535 / 2``. Below ``2**-32`` the shift is capped at 47
    and the error is at most ``2**-48`` absolute; that loss is invisible, because any int32
    accumulator times such a scale requantises to 0 either way.

    Raises :class:`TypeError` for a scale that is not a real number (``bool`` included) and
    :class:`ValueError` for one that is not finite, not positive, or outside what the pair can
    represent (above ``2**-48``, up to about ``65535 / 2``).
    """
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"requantisation scale must be a real number, not {scale!r}")
    try:
        value = float(scale)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"requantisation scale {scale!r} must be finite and positive")
    # frexp is exact (log2 may round up just below a power of two): value = m * 2**e with
    # 0.5 <= m < 1, so value * 2**(MULT_BITS - e) lands in [2**15, 2**16).
    _, exponent = math.frexp(value)
    shift = min(max(MULT_BITS - exponent, SHIFT_MIN), SHIFT_MAX)
    mult = round(value * (1 << shift))
    if mult >= 1 << MULT_BITS:
        # Rounded up to 2**16: one bit less of shift (or the scale is too large for any pair).
        if shift == SHIFT_MIN:
            raise ValueError(f"requantisation scale {scale!r} exceeds the largest representable "
                             f"{((1 << MULT_BITS) - 1) / (1 << SHIFT_MIN)}")
        shift -= 1
        mult = round(value * (1 << shift))
    if mult == 0:
        raise ValueError(f"requantisation scale {scale!r} is too small: it rounds to mult 0 at "
                         f"shift {SHIFT_MAX} (the scale must exceed 2**-{SHIFT_MAX + 1})")
    return int(mult), int(shift)


#: Softmax input: scores are signed 16-bit fixed point with this many fraction bits (1.0 = 256).
#: The attention buffer scales Q.K (including 1/sqrt(d_head)) into this format.
SCORE_BITS = 16
SCORE_FRAC_BITS = 8
