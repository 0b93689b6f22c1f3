"""Golden model of the matmul unit: int8 matmul, int32 bias, per-column requantisation.

Bit-exact with ``hw.tile.matmul`` (``hw.spec.formats``, ``docs/formats.md``):

- ``A`` is int8, or unsigned 8-bit when ``a_unsigned``; ``B`` is int8.
- Products are summed in int32 and **wrap modulo 2**32** (two's complement); so does the bias
  add. Wrapping keeps partial sums associative: split K across chips, add the int32 partials
  (wrapping too), and the result equals the single-chip one bit for bit.
- ``requant(acc, mult, shift, bits)`` rounds half up (adds ``1 << (shift-1)`` then floors) and
  saturates to ``bits``; it never wraps.
- ``linear16``: an int16 activation times int8 weights into the int16 residual, as two ordinary
  passes of the unit over the activation's bytes (no new hardware)::

      hi = a16 >> 8 (int8);  lo = a16 & 0xFF (unsigned 8-bit);  a16 = 256 hi + lo
      f_hi = requant(wrap32(hi @ W), mult, shift - 8, 16)            signed A, no bias
      f_lo = requant(wrap32(lo @ W + bias), mult, shift, 16)         unsigned A
      out  = clamp16(clamp16(residual + f_hi) + f_lo)                two residual ADDs

  with ``(mult, shift)`` per output column the requantisation of the full product
  ``a16 @ W + bias`` (``shift >= 9``). Each pass rounds on its own; the sum is within one LSB
  of requantising the exact 42-bit ``256 * (hi @ W) + lo @ W + bias``. With K split across
  chips each pass's int32 partials are summed (wrapping) before requantisation: neither
  wraps for K < 2**16, so the result is the same for any split.
"""

import numbers

import numpy as np

from hw.spec.formats import ACC_BITS, MULT_BITS, SHIFT_MAX, SHIFT_MIN, OutMode

__all__ = ["wrap", "matmul", "bias_add", "requant", "matmul_unit", "linear16_passes",
           "linear16", "LINEAR16_SHIFT_MIN"]

#: The smallest requantisation shift of a two-pass int16 product: the hi pass uses shift - 8.
LINEAR16_SHIFT_MIN = SHIFT_MIN + 8


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
    # wrap, so wrapping once at the end equals wrapping after every add. The sum is taken in
    # float64 (BLAS; NumPy's int64 matmul has none): every partial sum is an integer below
    # K * 2**15, exact in float64's 53 bits for any K below 2**38, so the result is the
    # integer sum whatever the order of the adds.
    if a.shape[1] < 1 << 38:
        return wrap(np.rint(a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64))
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


def linear16_passes(a16, w, bias, mult, shift) -> tuple[np.ndarray, np.ndarray]:
    """``(f_hi, f_lo)``: the two int16 passes of ``a16 @ w + bias`` (module docstring).

    ``a16`` is int16 [M, K], ``w`` int8 [K, N], ``bias`` int32 and ``mult``/``shift`` per
    column (or scalars) with ``LINEAR16_SHIFT_MIN <= shift <= SHIFT_MAX``: the requantisation
    of the int16 product; the hi pass takes ``shift - 8`` and no bias.
    """
    a16 = _check_operand(a16, "a16", -(1 << 15), (1 << 15) - 1)
    shift = np.asarray(shift)
    if shift.size and shift.min() < LINEAR16_SHIFT_MIN:
        raise ValueError(f"shift {shift.min()} is below {LINEAR16_SHIFT_MIN}: the hi pass "
                         "requantises with shift - 8 >= 1")
    acc_hi = matmul(a16 >> 8, w)
    acc_lo = matmul(a16 & 0xFF, w, a_unsigned=True)
    f_hi = requant(acc_hi, mult, shift - 8, 16)
    f_lo = requant(bias_add(acc_lo, bias), mult, shift, 16)
    return f_hi, f_lo


def linear16(a16, w, bias, mult, shift, residual) -> np.ndarray:
    """``clamp16(clamp16(residual + f_hi) + f_lo)``: the two-pass int16 product added into the
    int16 ``residual`` [M, N] by two saturating residual adds (module docstring)."""
    residual = _check_operand(residual, "residual", -(1 << 15), (1 << 15) - 1)
    f_hi, f_lo = linear16_passes(a16, w, bias, mult, shift)
    lo, hi = -(1 << 15), (1 << 15) - 1
    return np.clip(np.clip(residual + f_hi, lo, hi) + f_lo, lo, hi)
