"""Number formats shared by gateware, golden models and compiler (DESIGN.md §3).

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

__all__ = [
    "OPERAND_BITS", "ACC_BITS", "BIAS_BITS", "MULT_BITS", "SHIFT_BITS", "SHIFT_MIN", "SHIFT_MAX",
    "RESIDUAL_BITS", "PROB_BITS", "OutMode", "OUT_BITS", "quantize_multiplier", "SCORE_BITS",
    "SCORE_FRAC_BITS",
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


def quantize_multiplier(scale: float) -> tuple[int, int]:
    """Return ``(mult, shift)`` with ``mult / 2**shift`` the closest to ``scale``.

    ``mult`` is the largest-precision unsigned 16-bit value (``2**15 <= mult < 2**16`` where the
    range allows), ``SHIFT_MIN <= shift <= SHIFT_MAX``. Raises :class:`ValueError` for a scale
    that is not finite, not positive, or outside what the pair can represent
    (``2**-47 .. 65535 / 2``).
    """
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"requantisation scale {scale!r} must be finite and positive")
    # Pick shift so that mult lands in [2**15, 2**16).
    shift = MULT_BITS - 1 - math.floor(math.log2(scale))
    shift = min(max(shift, SHIFT_MIN), SHIFT_MAX)
    mult = round(scale * (1 << shift))
    if mult >= 1 << MULT_BITS:
        if shift == SHIFT_MIN:
            raise ValueError(f"requantisation scale {scale!r} exceeds the largest representable "
                             f"{((1 << MULT_BITS) - 1) / (1 << SHIFT_MIN)}")
        shift -= 1
        mult = round(scale * (1 << shift))
    if mult == 0:
        raise ValueError(f"requantisation scale {scale!r} is below the smallest representable "
                         f"2**-{SHIFT_MAX}")
    return int(mult), int(shift)

#: Softmax input: scores are signed 16-bit fixed point with this many fraction bits (1.0 = 256).
#: The attention buffer scales Q.K (including 1/sqrt(d_head)) into this format.
SCORE_BITS = 16
SCORE_FRAC_BITS = 8
