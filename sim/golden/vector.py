"""Golden model of the vector unit: residual/bias add, requantisation, ReLU, LUT, LayerNorm,
RMSNorm, argmax and one-hot rows.

Bit-exact with :class:`hw.tile.vector.VectorUnit`; imports only ``hw.spec``, NumPy and
:mod:`sim.golden.matmul`. Integer semantics (all shifts are arithmetic, i.e. floor):

- ``residual_add(a, b) = clamp(a + b, int16)``: saturates, never wraps.
- ``bias_add`` (int32 + int32 wrapping mod 2**32) and ``requant`` are those of the matmul unit.
- ``gated_mul(a, b, mult, shift) = requant(int8(a) * int8(b), mult, shift, 8)`` (MUL): the
  exact int16 product of the operands' low bytes, requantised per tensor with round-half-up
  and saturation like REQUANT (to int16 with ``out16``): the gated FFN's silu(gate) * up.
- ``relu(a) = max(a, 0)``; ``lut_apply(table, a) = table[a & 0xFF]`` where ``table[i]`` holds
  f(int8(i)); :func:`gelu_table`, :func:`silu_table` and :func:`relu_table` build tables
  from input/output scales.
- GELU16 (:func:`gelu16_apply`), int16 in and out at one scale, from a table T of 257 int16
  knots ``T[k] ~ gelu((k - 128) * 2**g)`` (:func:`gelu16_table`) with ``1 <= g <= 8``::

      x >= 128 << g:   y = x                      (gelu(x) = x above the table)
      x < -(128 << g): y = 0
      otherwise:       i = x >> g;  f = x - (i << g)                 (0 <= f < 2**g)
                       y = T[i+128] + (((T[i+129] - T[i+128]) * f + 2**(g-1)) >> g)

  y lies between two knots, so it is int16 without a clamp. The unit emits ``hi = y >> 8``
  (int8) as ``data`` (or y itself) and ``lo = y & 0xFF`` (unsigned 8-bit, carried as the int8
  ``q``): the two int8 planes of a two-pass int16 matmul input (:func:`split16`).
- LayerNorm, one-pass and integer, from S1 = sum(x), S2 = sum(x^2) and the count n (all
  elements, across chips in the distributed case), ``x`` int16::

      D   = clamp(n * S2 - S1**2, 0, 2**62 - 1)              # = n^2 * variance
      Y,h = rsqrt_fixed(D)                                   # 1/sqrt(D) ~ Y * 2**-(24+15+h)
      t   = n * x - S1                                       # = n * (x - mean)
      z   = clamp((t * Y + 2**(22+h)) >> (23 + h), 25 bits)  # (x - mean)/std, 16 fraction bits
      y   = ((z * gamma + ((1 << gshift) >> 1)) >> gshift) + beta
      y16 = clamp(y, int16);  q8 = requant(y16, mult, shift, 8)

  ``rsqrt_fixed``: D > 0 is normalised to m = D * 2**-s in [2**30, 2**32) with s even
  (h = s/2); a 96-entry table (:func:`hw.spec.vector.rsqrt_seed_table`) indexed by m >> 25 seeds
  Y ~ 2**24 / sqrt(m / 2**30), then two Newton steps in Q24 with floor shifts::

      y2 = (Y * Y) >> 24;  my2 = (m * y2) >> 30;  Y = (Y * (3 * 2**24 - my2)) >> 25

  D == 0 (a constant vector) gives Y = 0, h = 0, so z = 0 and the output is beta.
  The float epsilon of LayerNorm is taken as 0 (the integer form is scale-free).
  Gamma and beta are int16 per channel: the real-valued output (in output LSBs) is
  ``z_real * gamma * 2**(16 - gshift) + beta``.

Since the normalisation depends only on (x, S1, S2, n), partial statistics summed over chips
give the full LayerNorm bit for bit.

- ``argmax16(x, offset)`` (ARGMAX): ``(offset + i, x[i])`` for the first i holding the largest
  int16 element (the lowest index wins a tie), as ``sim.golden.decode.argmax_int`` picks the
  next token; the unit writes it as an argmax record (:func:`hw.spec.vector.pack_argmax`).
- ``argmax_pairs(index, value)`` (ARGMAX with ``pairs``): of ``k`` argmax records (the
  partial argmaxes of the chips a vocabulary is split over), the one with the largest value,
  the lowest index winning a tie: ``argmax_pairs`` of the blocks' ``argmax16(block, v0)`` is
  ``argmax16`` of the whole row.
- ``onehot(index, offset, length)`` (ONEHOT): int8 row with 1 at lane ``index - offset`` and 0
  elsewhere (all 0 when that lane is outside the row): ``onehot @ E8`` is the embedding row
  E8[index] exactly.

- RMSNorm (``VectorOp.RMS``, ``RMS_APPLY``) is the same datapath with S1 taken as 0 (the
  ``rms`` flag of :func:`ln_normalise`): ``D = n * S2`` (= n^2 * mean(x^2)) and ``t = n * x``,
  so ``z = x / sqrt(mean(x^2))`` and ``y = z * gamma + beta`` as above (the compiler's RMSNorm
  has beta = 0). An all-zero vector gives beta, and ``|z| <= sqrt(n) < 256``.
"""

from __future__ import annotations

import math

import numpy as np

from hw.spec import vector as spec
from hw.spec.vector import VectorCmd, VectorOp

from .matmul import bias_add, requant, wrap

__all__ = [
    "residual_add", "gated_mul", "relu", "lut_apply", "gelu_table", "relu_table", "gelu_float",
    "silu_float", "silu_table",
    "gelu16_knot_shift", "gelu16_table", "silu16_table", "SILU16_SPAN", "relu16_table",
    "identity16_table", "split16_table", "SPLIT16_G", "SPLIT16_EXACT_MAX",
    "gelu16_apply", "split16",
    "rsqrt_fixed", "ln_stats", "ln_normalise", "layernorm", "layernorm_float", "rmsnorm",
    "rmsnorm_float",
    "argmax16", "argmax_pairs", "argmax_record", "onehot",
    "unpack_requant", "unpack_gamma_beta", "VectorUnitModel", "bias_add", "requant",
]

_SEED = spec.rsqrt_seed_table()


def _int(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def _round_half_up(v) -> np.ndarray:
    return np.floor(np.asarray(v, dtype=np.float64) + 0.5).astype(np.int64)


def residual_add(a, b) -> np.ndarray:
    """``clamp(a + b, -32768, 32767)`` (int32 operands allowed; the sum is exact first)."""
    return np.clip(_int(a) + _int(b), -(1 << 15), (1 << 15) - 1)


def gated_mul(a, b, mult: int, shift: int, bits: int = 8) -> np.ndarray:
    """MUL: ``requant(int8(a) * int8(b), mult, shift, bits)`` (the operands' low bytes)."""
    return requant(wrap(_int(a), 8) * wrap(_int(b), 8), mult, shift, bits)


def relu(a) -> np.ndarray:
    return np.maximum(_int(a), 0)


def lut_apply(table, a) -> np.ndarray:
    """``table[a & 0xFF]``: the LUT is indexed by the input's low byte."""
    table = _int(table)
    if table.shape != (spec.LUT_ENTRIES,):
        raise ValueError(f"LUT must have {spec.LUT_ENTRIES} entries, not shape {table.shape}")
    return table[_int(a) & 0xFF]


def _int8_inputs() -> np.ndarray:
    return wrap(np.arange(spec.LUT_ENTRIES), 8)


def gelu_float(x) -> np.ndarray:
    """Exact GELU, ``x * Phi(x)``, in float64."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _table(f, in_scale, out_scale) -> np.ndarray:
    if not (in_scale > 0 and out_scale > 0):
        raise ValueError(f"scales must be positive, not {in_scale!r}, {out_scale!r}")
    return np.clip(_round_half_up(f(_int8_inputs() * float(in_scale)) / out_scale), -128, 127)


def gelu_table(in_scale: float, out_scale: float) -> np.ndarray:
    """LUT for GELU: int8 input with scale ``in_scale`` to int8 with ``out_scale``.

    Entry i = clamp(round_half_up(gelu(int8(i) * in_scale) / out_scale)): exactly the float
    GELU re-quantised, so the unit's GELU error is that of this rounding (<= 1/2 LSB).
    """
    return _table(gelu_float, in_scale, out_scale)


def silu_float(x) -> np.ndarray:
    """Exact SiLU (swish), ``x * sigmoid(x) = x / (1 + exp(-x))``, in float64."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))                 # never overflows: sigmoid from e**-|x|
    return x * np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu_table(in_scale: float, out_scale: float) -> np.ndarray:
    """LUT for SiLU (same construction as :func:`gelu_table`): entry i =
    clamp(round_half_up(silu(int8(i) * in_scale) / out_scale))."""
    return _table(silu_float, in_scale, out_scale)


def relu_table(in_scale: float, out_scale: float) -> np.ndarray:
    """LUT for ReLU with a change of scale (same construction as :func:`gelu_table`)."""
    return _table(lambda v: np.maximum(v, 0.0), in_scale, out_scale)


def gelu16_knot_shift(scale: float, span: float = 8.0) -> int:
    """The knot spacing g for int16 inputs of ``scale``: the smallest g in 1..8 whose 256
    intervals cover ``|x| <= span`` (GELU is x or 0 to within 5e-15 beyond 8), or 8 when no g
    does (then the table covers every int16)::

        g = min(8, max(1, ceil(log2(span / (128 * scale)))))
    """
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be positive and finite, not {scale!r}")
    if not (span > 0 and math.isfinite(span)):
        raise ValueError(f"span must be positive and finite, not {span!r}")
    g = math.ceil(math.log2(span / (spec.GELU16_ZERO * scale)))
    return min(spec.GELU16_G_MAX, max(spec.GELU16_G_MIN, g))


def _check_g(g) -> int:
    if isinstance(g, bool) or not isinstance(g, (int, np.integer)):
        raise TypeError(f"g must be an integer, not {g!r}")
    if not spec.GELU16_G_MIN <= g <= spec.GELU16_G_MAX:
        raise ValueError(f"g={g} is outside [{spec.GELU16_G_MIN}, {spec.GELU16_G_MAX}]")
    return int(g)


def _table16(f, scale: float, g: int) -> np.ndarray:
    g = _check_g(g)
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be positive and finite, not {scale!r}")
    x = (np.arange(spec.GELU16_KNOTS) - spec.GELU16_ZERO) * float(2 ** g) * float(scale)
    return np.clip(_round_half_up(f(x) / scale), -(1 << 15), (1 << 15) - 1)


def gelu16_table(scale: float, g: int) -> np.ndarray:
    """The 257 int16 knots of GELU16 for int16 inputs and outputs of ``scale``, knots 2**g
    apart: ``T[k] = clamp16(round_half_up(gelu((k - 128) * 2**g * scale) / scale))``."""
    return _table16(gelu_float, scale, g)


#: The span SiLU's GELU16 knots cover (``gelu16_knot_shift(scale, SILU16_SPAN)``): the op
#: takes y = x above its table and 0 below, and SiLU is within 16 / (1 + e**16) = 1.8e-6 of
#: that beyond 16 (beyond GELU's 8 it would still be 2.7e-3 away).
SILU16_SPAN = 16.0


def silu16_table(scale: float, g: int) -> np.ndarray:
    """GELU16 knots for SiLU (the op interpolates any table; above and below it y = x and 0,
    SiLU's limits): ``T[k] = clamp16(round_half_up(silu((k - 128) * 2**g * scale) / scale))``;
    pick g with ``gelu16_knot_shift(scale, SILU16_SPAN)``."""
    return _table16(silu_float, scale, g)


def relu16_table(g: int) -> np.ndarray:
    """GELU16 knots that make the op ReLU, exactly: ``T[k] = max(0, (k - 128) * 2**g)`` (the
    interpolation of a function linear between the knots is exact, and above the table y = x,
    below it 0); ``g <= 7`` keeps every knot within int16."""
    g = _check_g(g)
    if g > 7:
        raise ValueError(f"g={g}: ReLU knots up to 128 * 2**g must stay within int16 (g <= 7)")
    return np.maximum(0, (np.arange(spec.GELU16_KNOTS, dtype=np.int64) - spec.GELU16_ZERO) << g)


def identity16_table(g: int) -> np.ndarray:
    """GELU16 knots that make the op the identity on ``x >= -128 * 2**g`` (below it gives 0):
    ``T[k] = (k - 128) * 2**g``, exact like :func:`relu16_table` (``g <= 7``). With g = 7 it
    passes every product of two int8 (``|a b| <= 16384``) unchanged while writing its two int8
    planes: llm16's gated FFN hidden (``sim.compiler.quantize``)."""
    g = _check_g(g)
    if g > 7:
        raise ValueError(f"g={g}: identity knots up to 128 * 2**g must stay within int16 "
                         "(g <= 7)")
    return (np.arange(spec.GELU16_KNOTS, dtype=np.int64) - spec.GELU16_ZERO) << g


#: The knot spacing of :func:`split16_table` (every int16 lies inside its table).
SPLIT16_G = 8
#: The largest int16 that :func:`split16_table` passes unchanged *and* whose high digit
#: ``round(x / 256)`` fits int8 (the table alone passes 32640 too; its last knot is 32767,
#: not 32768, so the values above come out 1 smaller).
SPLIT16_EXACT_MAX = 32639


def split16_table() -> np.ndarray:
    """GELU16 knots (g = :data:`SPLIT16_G`) that make the op the identity on every int16 up to
    32640: ``T[k] = min((k - 128) * 256, 32767)`` (the last knot clamped to
    int16). GELU16 then writes a tensor's byte planes, or (its low byte as int8) the low digit
    of ``x = 256 * round(x / 256) + int8(x & 0xFF)``: llm16c's int16 x int16 gated product
    (``sim.compiler.quantize``)."""
    knots = (np.arange(spec.GELU16_KNOTS, dtype=np.int64) - spec.GELU16_ZERO) << SPLIT16_G
    return np.minimum(knots, (1 << 15) - 1)


def gelu16_apply(table, x, g: int) -> np.ndarray:
    """GELU16 of int16 ``x`` (the low 16 bits of each element) with the 257-knot ``table``."""
    g = _check_g(g)
    table = _int(table)
    if table.shape != (spec.GELU16_KNOTS,):
        raise ValueError(f"GELU16 table must have {spec.GELU16_KNOTS} knots, not shape "
                         f"{table.shape}")
    table = wrap(table, 16)
    x = wrap(_int(x), 16)
    i = x >> g
    f = x - (i << g)
    # Only in-range lanes use the knots.
    k = np.clip(i + spec.GELU16_ZERO, 0, spec.GELU16_KNOTS - 2)
    lo, hi = table[k], table[k + 1]
    y = lo + (((hi - lo) * f + (1 << (g - 1))) >> g)
    y = np.where(i >= spec.GELU16_ZERO, x, y)
    return np.where(i < -spec.GELU16_ZERO, 0, y)


def split16(y) -> tuple[np.ndarray, np.ndarray]:
    """int16 ``y`` as its two matmul planes: ``hi = y >> 8`` (int8), ``lo = y & 0xFF``
    (unsigned 8-bit), so that ``y = 256 * hi + lo``."""
    y = wrap(_int(y), 16)
    return y >> 8, y & 0xFF


def rsqrt_fixed(d: int) -> tuple[int, int]:
    """``(Y, h)`` with ``1/sqrt(d) ~ Y * 2**-(39 + h)``; ``(0, 0)`` for ``d <= 0``."""
    d = min(int(d), spec.LN_D_MAX)
    if d <= 0:
        return 0, 0
    e = d.bit_length()
    s = e - 31 if (e - 31) % 2 == 0 else e - 32
    m = d >> s if s >= 0 else d << -s
    assert 1 << 30 <= m < 1 << 32
    y = _SEED[(m >> spec.RSQRT_SEED_SHIFT) - spec.RSQRT_SEED_BASE]
    q = spec.RSQRT_FRAC_BITS
    for _ in range(spec.RSQRT_NEWTON_STEPS):
        y2 = (y * y) >> q
        my2 = (m * y2) >> 30
        y = (y * ((3 << q) - my2)) >> (q + 1)
    return y, s // 2


def ln_stats(x) -> tuple[int, int]:
    """Local statistics ``(sum x, sum x^2)`` of int16 ``x`` (int32 and int64 on the stream)."""
    x = wrap(_int(x), 16)
    return int(wrap(x.sum(), 32)), int((x * x).sum())


def ln_normalise(x, s1: int, s2: int, n: int, gamma, beta, gshift: int, mult: int, shift: int,
                 *, rms: bool = False):
    """Normalise int16 ``x`` with statistics (s1, s2, n); return ``(y16, q8)``. ``rms``:
    RMSNorm, s1 taken as 0 (whatever is passed)."""
    x = wrap(_int(x), 16)
    s1 = 0 if rms else int(wrap(s1, 32))
    d = max(0, min(n * int(s2) - s1 * s1, spec.LN_D_MAX))
    y_r, h = rsqrt_fixed(d)
    t = n * x - s1
    zs = spec.RSQRT_FRAC_BITS + 15 - spec.LN_Z_FRAC_BITS + h
    z = (t * np.int64(y_r) + (np.int64(1) << (zs - 1))) >> zs
    z = np.clip(z, -(1 << (spec.LN_Z_BITS - 1)), (1 << (spec.LN_Z_BITS - 1)) - 1)
    gamma = wrap(_int(gamma), 16)
    beta = wrap(_int(beta), 16)
    y = ((z * gamma + ((np.int64(1) << gshift) >> 1)) >> gshift) + beta
    y16 = np.clip(y, -(1 << 15), (1 << 15) - 1)
    return y16, requant(y16, mult, shift, 8)


def layernorm(x, gamma, beta, gshift: int, mult: int, shift: int):
    """Full LayerNorm of one vector: the same formula with its own statistics."""
    x = _int(x)
    s1, s2 = ln_stats(x)
    return ln_normalise(x, s1, s2, len(x), gamma, beta, gshift, mult, shift)


def layernorm_float(x, gamma, beta, gshift: int) -> np.ndarray:
    """Float64 LayerNorm (eps = 0) in output LSBs: ``z * gamma * 2**(16-gshift) + beta``.

    Gamma and beta are the integers the unit uses, so the difference to :func:`layernorm`
    measures the datapath (rsqrt, rounding), not the quantisation of the parameters.
    """
    x = np.asarray(x, dtype=np.float64)
    std = x.std()
    return _scaled_float(np.zeros_like(x) if std == 0 else (x - x.mean()) / std, gamma, beta,
                         gshift)


def _scaled_float(z, gamma, beta, gshift: int) -> np.ndarray:
    """``z * gamma * 2**(16-gshift) + beta``: a float64 normalised vector in output LSBs."""
    return (z * np.asarray(gamma, dtype=np.float64) * 2.0 ** (spec.LN_Z_FRAC_BITS - gshift)
            + np.asarray(beta, dtype=np.float64))


def rmsnorm(x, gamma, beta, gshift: int, mult: int, shift: int):
    """Full RMSNorm of one vector (``VectorOp.RMS``): :func:`ln_normalise` with ``rms``."""
    x = _int(x)
    _, s2 = ln_stats(x)
    return ln_normalise(x, 0, s2, len(x), gamma, beta, gshift, mult, shift, rms=True)


def rmsnorm_float(x, gamma, beta, gshift: int) -> np.ndarray:
    """Float64 RMSNorm (eps = 0, as :func:`layernorm_float`) in output LSBs:
    ``x / sqrt(mean(x^2)) * gamma * 2**(16-gshift) + beta``; an all-zero vector gives beta."""
    x = np.asarray(x, dtype=np.float64)
    rms = math.sqrt(float(np.mean(x * x)))
    return _scaled_float(np.zeros_like(x) if rms == 0 else x / rms, gamma, beta, gshift)


def _check_field(value, name: str, low: int, bits: int, what: str = "") -> int:
    """``value`` as an int if it is an integer in ``[low, 2**bits - 1]`` (a command field)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if not low <= value < 1 << bits:
        raise ValueError(f"{name}={value} is outside [{low}, {(1 << bits) - 1}]{what}")
    return int(value)


def _check_length(length) -> int:
    return _check_field(length, "length", 1, spec.LENGTH_BITS)


def _check_offset(offset) -> int:
    return _check_field(offset, "offset", 0, spec.N_BITS, " (the n field)")


def argmax16(x, offset: int = 0) -> tuple[int, int]:
    """ARGMAX of the int16 row ``x`` (the low 16 bits of each element, 1..65535 of them):
    ``(offset + i, x[i])`` for the lowest i holding the maximum."""
    x = wrap(_int(x).reshape(-1), 16)
    _check_length(x.size)
    offset = _check_offset(offset)
    i = int(np.argmax(x))               # numpy returns the first maximum
    return offset + i, int(x[i])


def argmax_record(x, offset: int, word_bytes: int) -> np.ndarray:
    """The words ARGMAX writes for the int16 row ``x``: ``argmax16(x, offset)`` as an argmax
    record (:func:`hw.spec.vector.pack_argmax`), ``uint8[argmax_words(N), N]``."""
    return spec.pack_argmax(*argmax16(x, offset), word_bytes)


def argmax_pairs(index, value) -> tuple[int, int]:
    """Combine argmax records ``(index[i], value[i])`` (1..65535 of them; int32 indices,
    int16 values): the largest value and, of the records holding it, the lowest index."""
    index = _int(index).reshape(-1)
    value = _int(value).reshape(-1)
    if index.shape != value.shape:
        raise ValueError(f"{index.size} indices but {value.size} values")
    _check_length(index.size)
    if index.min() < -(1 << 31) or index.max() >= 1 << 31:
        raise ValueError("argmax_pairs: an index does not fit the record's int32")
    if value.min() < -(1 << 15) or value.max() >= 1 << 15:
        raise ValueError("argmax_pairs: a value does not fit the record's int16")
    best = value.max()
    return int(index[value == best].min()), int(best)


def onehot(index, offset: int, length: int) -> np.ndarray:
    """ONEHOT: ``length`` elements, 1 at lane ``index - offset`` (when it is in the row), else 0.
    ``index`` is the record's int32 index."""
    length = _check_length(length)
    offset = _check_offset(offset)
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
        raise TypeError(f"index must be an integer, not {index!r}")
    if not -(1 << 31) <= index < 1 << 31:
        raise ValueError(f"index={index} does not fit the record's int32")
    return (np.arange(length) == int(index) - offset).astype(np.int64)


def unpack_requant(words) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`hw.spec.vector.pack_requant`: ``(mult, shift)``."""
    words = _int(words)
    return words & 0xFFFF, (words >> 16) & 0x3F


def unpack_gamma_beta(words) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`hw.spec.vector.pack_gamma_beta`: ``(gamma, beta)``."""
    words = _int(words)
    return wrap(words & 0xFFFF, 16), wrap((words >> 16) & 0xFFFF, 16)


class VectorUnitModel:
    """The unit as a command interpreter (its two tables are its only state).

    :meth:`execute` takes one :class:`~hw.spec.vector.VectorCmd` with its ``i_a`` elements,
    ``i_b`` words and ``i_stats`` pair, and returns what the unit emits:
    ``{"data": int64[length], "q": int64[length]}`` on ``o``, ``{"stats": (s1, s2)}`` or
    (ARGMAX) ``{"record": (index, value)}`` on ``o_stats``, or ``{}`` for LOAD_LUT and
    LOAD_LUT16. ONEHOT takes the argmax record ``(index, value)`` as ``stats``, ARGMAX with
    ``pairs`` its ``length`` records ``[(index, value), ...]``. ``q`` is zero
    except for the LayerNorm and RMSNorm ops (int8 output) and GELU16 (the low byte of y as an
    int8 container).
    The LUT resets to ReLU at unchanged scale, the GELU16 table to all zeros.
    """

    def __init__(self):
        self.lut = relu_table(1.0, 1.0)  # the reset contents: ReLU at unchanged scale
        self.lut16 = np.zeros(spec.GELU16_KNOTS, dtype=np.int64)

    def execute(self, cmd: VectorCmd, a=None, b=None, stats=None) -> dict:
        op = cmd.op
        if op is VectorOp.LOAD_LUT:
            self.lut = wrap(_int(a)[:spec.LUT_ENTRIES], 8)
            return {}
        if op is VectorOp.LOAD_LUT16:
            self.lut16 = wrap(_int(a)[:spec.GELU16_KNOTS], 16)
            return {}
        a = _int(a)[:cmd.length] if a is not None else None
        b = _int(b)[:cmd.length] if b is not None else None
        zeros = np.zeros(cmd.length, dtype=np.int64)
        if op is VectorOp.ARGMAX and cmd.pairs:
            pairs = np.asarray(stats, dtype=np.int64).reshape(-1, 2)[:cmd.length]
            if len(pairs) != cmd.length:
                raise ValueError(f"ARGMAX pairs: {len(pairs)} records, not length={cmd.length}")
            return {"record": argmax_pairs(pairs[:, 0], pairs[:, 1])}
        if op is VectorOp.ARGMAX:
            return {"record": argmax16(a, cmd.n)}
        if op is VectorOp.ONEHOT:
            return {"data": onehot(int(stats[0]), cmd.n, cmd.length), "q": zeros}
        if op is VectorOp.LN_STATS:
            return {"stats": ln_stats(a)}
        if spec.twin_of(op) in (VectorOp.LN, VectorOp.LN_APPLY):
            gamma, beta = unpack_gamma_beta(b)
            full = spec.twin_of(op) is VectorOp.LN
            s1, s2 = ln_stats(a) if full else stats
            n = cmd.length if full else cmd.n
            y16, q8 = ln_normalise(a, s1, s2, n, gamma, beta, cmd.gshift, cmd.mult, cmd.shift,
                                   rms=op in spec.RMS_OPS)
            return {"data": y16, "q": q8}
        if op is VectorOp.ADD:
            data = residual_add(a, b)
        elif op is VectorOp.MUL:
            data = gated_mul(a, b, cmd.mult, cmd.shift, 16 if cmd.out16 else 8)
        elif op is VectorOp.BIAS:
            data = bias_add(a, b)
        elif op is VectorOp.REQUANT:
            mult, shift = unpack_requant(b) if cmd.per_channel else (cmd.mult, cmd.shift)
            data = requant(wrap(a, 32), mult, shift, 16 if cmd.out16 else 8)
        elif op is VectorOp.RELU:
            data = relu(wrap(a, 32))
        elif op is VectorOp.LUT:
            data = lut_apply(self.lut, a)
        elif op is VectorOp.GELU16:
            y = gelu16_apply(self.lut16, a, cmd.shift)
            return {"data": y if cmd.out16 else y >> 8, "q": wrap(y, 8)}
        else:  # pragma: no cover  (VectorOp is exhaustive)
            raise ValueError(f"unknown op {op!r}")
        return {"data": data, "q": zeros}
