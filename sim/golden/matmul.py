"""Golden model of the matmul unit: int8 matmul, int32 bias, per-column requantisation.

Bit-exact with ``hw.tile.matmul`` (DESIGN.md §3, ``hw.spec.formats``):

- ``A`` is int8, or unsigned 8-bit when ``a_unsigned``; ``B`` is int8.
- Products are summed in int32 and **wrap modulo 2**32** (two's complement); so does the bias
  add. Wrapping keeps partial sums associative: split K across chips, add the int32 partials
  (wrapping too), and the result equals the single-chip one bit for bit.
- ``requant(acc, mult, shift, bits)`` rounds half up (adds ``1 << (shift-1)`` then floors) and
  saturates to ``bits``; it never wraps.
"""

import numpy as np

from hw.spec.formats import ACC_BITS, MULT_BITS, SHIFT_MAX, SHIFT_MIN, OutMode

__all__ = ["wrap", "matmul", "bias_add", "requant", "matmul_unit"]


def wrap(x, bits: int = ACC_BITS) -> np.ndarray:
    """Reduce integers modulo ``2**bits`` into the two's-complement range."""
    x = np.asarray(x, dtype=np.int64)
    half = np.int64(1) << np.int64(bits - 1)
    if bits == 64:
        return x
    mask = (np.int64(1) << np.int64(bits)) - 1
    return ((x + half) & mask) - half


def _check_operand(x, name, lo, hi):
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, not {x.dtype}")
    if x.size and (x.min() < lo or x.max() > hi):
        raise ValueError(f"{name} has values outside [{lo}, {hi}]: {x.min()}..{x.max()}")
    return x.astype(np.int64)


def matmul(a, b, *, a_unsigned: bool = False) -> np.ndarray:
    """``a @ b`` with int32 wrap-around; ``a`` is [M, K] int8 (or uint8), ``b`` [K, N] int8."""
    a = _check_operand(a, "a", 0, 255) if a_unsigned else _check_operand(a, "a", -128, 127)
    b = _check_operand(b, "b", -128, 127)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"shapes {a.shape} and {b.shape} do not chain")
    # Each product fits 17 bits; int64 sums of up to 2**46 products cannot overflow before the
    # wrap, so wrapping once at the end equals wrapping after every add.
    return wrap(a @ b)


def bias_add(acc, bias) -> np.ndarray:
    """Per-column int32 bias add, wrapping modulo 2**32."""
    return wrap(np.asarray(acc, dtype=np.int64) + np.asarray(bias, dtype=np.int64))


def requant(acc, mult, shift, bits: int) -> np.ndarray:
    """``clamp((acc * mult + (1 << (shift-1))) >> shift)`` to ``bits``; broadcasts per column."""
    acc = np.asarray(acc, dtype=np.int64)
    mult = np.asarray(mult, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    if np.any((mult < 0) | (mult >= 1 << MULT_BITS)):
        raise ValueError(f"mult must be unsigned {MULT_BITS}-bit")
    if np.any((shift < SHIFT_MIN) | (shift > SHIFT_MAX)):
        raise ValueError(f"shift must be in [{SHIFT_MIN}, {SHIFT_MAX}]")
    # |acc * mult| < 2**47 and the rounding term is at most 2**46: exact in int64.
    y = (acc * mult + (np.int64(1) << (shift - 1))) >> shift
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return np.clip(y, lo, hi)


def matmul_unit(a, b, bias, mult, shift, mode: OutMode, *, a_unsigned: bool = False):
    """The whole unit: ``requant(wrap(a @ b + bias))`` per output column, or the raw sum."""
    acc = bias_add(matmul(a, b, a_unsigned=a_unsigned), bias)
    mode = OutMode(mode)
    if mode is OutMode.RAW:
        return acc
    return requant(acc, mult, shift, 8 if mode is OutMode.INT8 else 16)
