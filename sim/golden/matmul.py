"""Golden model of the matmul unit: int8 matmul, int32 bias, per-column requantisation.

Bit-exact with ``hw.tile.matmul`` (``hw.spec.formats``, ``docs/formats.md``):

- ``A`` is int8, or unsigned 8-bit when ``a_unsigned``; ``B`` is int8.
- Products are summed in int32 and **wrap modulo 2**32** (two's complement); so does the bias
  add. Wrapping keeps partial sums associative: split K across chips, add the int32 partials
  (wrapping too), and the result equals the single-chip one bit for bit.
- ``requant(acc, mult, shift, bits)`` rounds half up (adds ``1 << (shift-1)`` then floors) and
  saturates to ``bits``; it never wraps.
"""

import numbers

import numpy as np

from hw.spec.formats import ACC_BITS, MULT_BITS, SHIFT_MAX, SHIFT_MIN, OutMode

__all__ = ["wrap", "matmul", "bias_add", "requant", "matmul_unit"]


def wrap(x, bits: int = ACC_BITS) -> np.ndarray:
    """Reduce integers modulo ``2**bits`` into the two's-complement range (``1 <= bits <= 64``)."""
    bits = _bits(bits, "bits", 1, 64)
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.integer):
        raise TypeError(f"wrap needs an integer array, not {x.dtype}")
    # uint64 -> int64 is itself a wrap modulo 2**64, so it commutes with the one below.
    x = x.astype(np.int64)
    if bits == 64:
        return x
    half = np.int64(1) << np.int64(bits - 1)
    mask = (np.int64(1) << np.int64(bits)) - 1
    return ((x + half) & mask) - half


def _bits(value, name, lo, hi):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value} is outside [{lo}, {hi}]")
    return int(value)


def _check_operand(x, name, lo, hi):
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, not {x.dtype}")
    if x.size and (x.min() < lo or x.max() > hi):
        raise ValueError(f"{name} has values outside [{lo}, {hi}]: {x.min()}..{x.max()}")
    return x.astype(np.int64)


def _check_per_column(x, name, lo, hi, shape):
    """An integer operand that broadcasts against ``shape`` without growing it."""
    x = _check_operand(x, name, lo, hi)
    try:
        ok = np.broadcast_shapes(shape, x.shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name} of shape {x.shape} does not broadcast against the "
                         f"accumulator shape {shape} (one value per output column: "
                         f"shape ({shape[-1] if shape else 1},))")
    return x


_INT32 = (-(1 << (ACC_BITS - 1)), (1 << (ACC_BITS - 1)) - 1)


def matmul(a, b, *, a_unsigned: bool = False) -> np.ndarray:
    """``a @ b`` with int32 wrap-around; ``a`` is [M, K] int8 (or uint8), ``b`` [K, N] int8."""
    a = _check_operand(a, "a", 0, 255) if a_unsigned else _check_operand(a, "a", -128, 127)
    b = _check_operand(b, "b", -128, 127)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"shapes {a.shape} and {b.shape} do not chain as [M, K] @ [K, N]")
    # Each product fits 17 bits; int64 sums of up to 2**46 products cannot overflow before the
    # wrap, so wrapping once at the end equals wrapping after every add.
    return wrap(a @ b)


def bias_add(acc, bias) -> np.ndarray:
    """Per-column int32 bias add, wrapping modulo 2**32.

    ``acc`` is an int32 array [..., N]; ``bias`` is int32, one value per column ([N]) or anything
    else that broadcasts against ``acc`` without changing its shape.
    """
    acc = _check_operand(acc, "acc", *_INT32)
    bias = _check_per_column(bias, "bias", *_INT32, acc.shape)
    return wrap(acc + bias)


def requant(acc, mult, shift, bits: int) -> np.ndarray:
    """``clamp((acc * mult + (1 << (shift-1))) >> shift)`` to ``bits``; broadcasts per column.

    ``acc`` is int32 [..., N]; ``mult`` (unsigned 16-bit) and ``shift`` (1..47) are integers that
    broadcast against ``acc`` without changing its shape (per column: [N]; per tensor: scalars).
    ``bits`` is the signed output width (8 or 16 in the hardware; 2..32 accepted).
    """
    bits = _bits(bits, "bits", 2, ACC_BITS)
    acc = _check_operand(acc, "acc", *_INT32)
    mult = _check_per_column(mult, "mult", 0, (1 << MULT_BITS) - 1, acc.shape)
    shift = _check_per_column(shift, "shift", SHIFT_MIN, SHIFT_MAX, acc.shape)
    # |acc * mult| < 2**47 and the rounding term is at most 2**46: exact in int64.
    y = (acc * mult + (np.int64(1) << (shift - 1))) >> shift
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return np.clip(y, lo, hi)


def matmul_unit(a, b, bias, mult, shift, mode: OutMode, *, a_unsigned: bool = False):
    """The whole unit: ``requant(wrap(a @ b + bias))`` per output column, or the raw sum.

    In ``OutMode.RAW`` the int32 sum is returned and ``mult``/``shift`` are ignored.
    """
    mode = OutMode(mode)
    acc = bias_add(matmul(a, b, a_unsigned=a_unsigned), bias)
    if mode is OutMode.RAW:
        return acc
    return requant(acc, mult, shift, 8 if mode is OutMode.INT8 else 16)
