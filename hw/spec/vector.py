"""Vector-unit encodings shared by the gateware, the golden model and the compiler.

Plain Python (and NumPy), no Amaranth: the opcode values, the command fields and their widths,
how per-lane parameters are packed into the 32-bit ``i_b`` lanes, the fixed-point constants
of the LayerNorm datapath (its rsqrt seed table included; RMSNorm's ops share it, with
``sum x`` taken as 0: :data:`RMS_OPS`, :func:`twin_of`; MUL has ADD's streams and cycles)
the shape of the int16 GELU
table (GELU16) and the argmax record (ARGMAX writes it, ONEHOT reads it: :data:`ARGMAX_BYTES`,
:func:`pack_argmax`, :func:`unpack_argmax`). The numeric definitions themselves
are in :mod:`sim.golden.vector` (the reference) and :mod:`hw.tile.vector` (the gateware).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "VectorOp", "RMS_OPS", "twin_of", "VectorCmd", "LENGTH_BITS", "N_BITS", "GSHIFT_BITS",
    "LUT_ENTRIES",
    "LN_Z_FRAC_BITS", "LN_Z_BITS", "LN_D_MAX", "RSQRT_FRAC_BITS", "RSQRT_NEWTON_STEPS",
    "RSQRT_SEED_SHIFT", "RSQRT_SEED_BASE", "rsqrt_seed_table", "pack_requant", "pack_gamma_beta",
    "lut_beats", "lut16_beats", "beats", "GELU16_KNOTS", "GELU16_ZERO", "GELU16_G_MIN",
    "GELU16_G_MAX", "ARGMAX_BYTES", "argmax_words", "pack_argmax", "unpack_argmax",
]


class VectorOp(enum.IntEnum):
    """Operation of one vector-unit command (4-bit field ``op``)."""

    ADD = 0       #: residual add: clamp(a + b) to int16, never wraps
    BIAS = 1      #: bias add: a + b wrapping modulo 2**32 (int32 accumulator + int32 bias)
    REQUANT = 2   #: requant(a, mult, shift) to int8 or int16 (per tensor or per lane)
    RELU = 3      #: max(a, 0), scale unchanged
    LUT = 4       #: lut[a & 0xFF] (int8 out): GELU, ReLU with a scale change, ...
    LOAD_LUT = 5  #: load the 256 int8 LUT entries from i_a (entry i = f(int8(i)))
    LN = 6        #: full LayerNorm of one vector (statistics and normalisation)
    LN_STATS = 7  #: partial statistics: emit local (sum x, sum x^2) on o_stats
    LN_APPLY = 8  #: normalise with global (sum x, sum x^2) from i_stats and global count n
    GELU16 = 9    #: interpolated int16 GELU (257 knots): data = y >> 8 (or y), q = y & 0xFF
    LOAD_LUT16 = 10  #: load the 257 int16 knots of the GELU16 table from i_a
    RMS = 11      #: full RMSNorm of one vector: LN with sum x taken as 0 (no centring)
    RMS_APPLY = 12  #: LN_APPLY with sum x taken as 0: global sum x^2 from i_stats, global n
    MUL = 13      #: requant(int8(a) * int8(b), mult, shift) to int8 (int16 if out16): gated FFN
    ARGMAX = 14   #: one argmax record: index (lowest on ties) + n and the int16 maximum
    ONEHOT = 15   #: int8 row: 1 at lane (index - n) of the record read, 0 elsewhere


#: RMSNorm's ops: the LayerNorm datapath with ``sum x`` taken as 0, both in
#: ``D = n * sum(x^2) - sum(x)^2`` and in the centring ``n * x - sum(x)``. Their partial
#: statistics are LN_STATS's (whose ``sum x`` RMS_APPLY ignores).
RMS_OPS = (VectorOp.RMS, VectorOp.RMS_APPLY)

_TWIN = {VectorOp.RMS: VectorOp.LN, VectorOp.RMS_APPLY: VectorOp.LN_APPLY,
         VectorOp.MUL: VectorOp.ADD}


def twin_of(op) -> VectorOp:
    """The op whose streams, pipeline and cycles ``op`` has: LN for RMS, LN_APPLY for
    RMS_APPLY, ADD for MUL (two operand streams, one beat per cycle), every other op itself.
    Everything that dispatches on the op but not on its arithmetic (the engine's streams, the
    timing models, the ISS's checks) reads this."""
    op = VectorOp(op)
    return _TWIN.get(op, op)


#: Width of the command's ``length`` field (elements of this vector on this chip).
LENGTH_BITS = 16
#: Width of the command's ``n`` field (element count over all chips, LN_APPLY and RMS_APPLY;
#: the index offset of ARGMAX and ONEHOT).
N_BITS = 16
#: Width of the command's ``gshift`` field (LayerNorm gamma shift, 0..63).
GSHIFT_BITS = 6
#: Entries of the programmable activation LUT (indexed by the input's low byte).
LUT_ENTRIES = 256

#: Knots of the GELU16 table: 256 intervals and both their ends (LOAD_LUT16 reads them all).
GELU16_KNOTS = 257
#: The knot at x = 0: knot k sits at x = (k - GELU16_ZERO) << g.
GELU16_ZERO = 128
#: Knot spacing 2**g with g (the command's ``shift``) in [GELU16_G_MIN, GELU16_G_MAX]; at
#: g = 8 the 256 intervals cover the whole int16 range, so the fraction is at most 8 bits.
GELU16_G_MIN = 1
GELU16_G_MAX = 8

#: LayerNorm's normalised value z = (x - mean) / std is held with this many fraction bits ...
LN_Z_FRAC_BITS = 16
#: ... in this many bits, saturating (|z| <= sqrt(n - 1) < 256 for consistent statistics).
LN_Z_BITS = 25
#: D = n * sum(x^2) - sum(x)^2 is clamped to [0, LN_D_MAX] (never reached by consistent stats).
LN_D_MAX = (1 << 62) - 1
#: rsqrt result Y = 2**RSQRT_FRAC_BITS / sqrt(m') for the normalised mantissa m' in [1, 4).
RSQRT_FRAC_BITS = 24
#: Newton-Raphson steps after the table seed.
RSQRT_NEWTON_STEPS = 2
#: The seed table is indexed by m >> RSQRT_SEED_SHIFT (m in [2**30, 2**32)), minus RSQRT_SEED_BASE.
RSQRT_SEED_SHIFT = 25
RSQRT_SEED_BASE = 32


@dataclass(frozen=True)
class VectorCmd:
    """One command of the vector unit (the ``i_cmd`` payload).

    ``length`` is the number of elements of this vector on this chip (``1..d_model_max``;
    ignored by LOAD_LUT and LOAD_LUT16, which always read 256 and 257 entries). ``n`` is the
    LayerNorm element count of the whole vector across chips, used by LN_APPLY and RMS_APPLY
    (LN and RMS use ``length``), and the index offset of ARGMAX and ONEHOT (the first column
    of this chip's block of a row split over chips). ``mult``/``shift`` requantise (REQUANT
    without ``per_channel``, MUL's product, and the int8 output of the LayerNorm and RMSNorm ops);
    for GELU16
    ``shift`` is the knot spacing g (:data:`GELU16_G_MIN`..:data:`GELU16_G_MAX`). ``out16``
    selects int16 rather than int8 for REQUANT and MUL, and the whole int16 y rather than its high
    byte for GELU16. ``gshift`` is the
    LayerNorm (and RMSNorm) gamma shift. ``pairs``: ARGMAX combines ``length`` argmax records
    (read as ``i_stats`` beats) instead of reading ``length`` elements; ``n`` is then 0.
    """

    op: VectorOp
    length: int
    n: int = 0
    mult: int = 1
    shift: int = 1
    gshift: int = 16
    out16: bool = False
    per_channel: bool = False
    pairs: bool = False

    def __post_init__(self):
        object.__setattr__(self, "op", VectorOp(self.op))
        for name, bits in (("length", LENGTH_BITS), ("n", N_BITS), ("mult", 16), ("shift", 6),
                           ("gshift", GSHIFT_BITS)):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or not 0 <= value < 1 << bits:
                raise ValueError(f"VectorCmd {name}={value!r} must be an integer in "
                                 f"[0, {(1 << bits) - 1}]")

    def fields(self) -> dict:
        """The command as a dict of integers (for ``ctx.set`` on the gateware's ``i_cmd``)."""
        return {"op": int(self.op), "length": int(self.length), "n": int(self.n),
                "mult": int(self.mult), "shift": int(self.shift), "gshift": int(self.gshift),
                "out16": int(self.out16), "per_channel": int(self.per_channel),
                "pairs": int(self.pairs)}


#: Bytes of one argmax record (ARGMAX writes one per row, ONEHOT reads one per row): the int32
#: index at bytes 0..3, the int16 maximum at bytes 4..5, bytes 6..7 zero, all little-endian;
#: padded with zero bytes to :func:`argmax_words` words (one word when N >= 8, two at N = 4:
#: the index word, then the value word; four at N = 2).
ARGMAX_BYTES = 8


def argmax_words(word_bytes: int) -> int:
    """Words of one argmax record."""
    return -(-ARGMAX_BYTES // word_bytes)


def pack_argmax(index, value, word_bytes: int) -> np.ndarray:
    """Argmax records as words: ``uint8[rows, argmax_words(N), N]`` for ``rows`` (index, value)
    pairs (scalars give one record, ``[words, N]``). ``index`` must fit int32 and ``value``
    int16 (ValueError otherwise: nothing is wrapped)."""
    index = np.asarray(index, dtype=np.int64)
    value = np.asarray(value, dtype=np.int64)
    if index.shape != value.shape:
        raise ValueError(f"index shape {index.shape} != value shape {value.shape}")
    for name, arr, bits in (("index", index, 32), ("value", value, 16)):
        bad = arr[(arr < -(1 << (bits - 1))) | (arr >= 1 << (bits - 1))]
        if bad.size:
            raise ValueError(f"argmax {name} {int(bad[0])} does not fit int{bits}")
    words = argmax_words(word_bytes)
    flat = index.reshape(-1)
    out = np.zeros((flat.size, words * word_bytes), np.uint8)
    out[:, 0:4] = flat.astype("<i4").view(np.uint8).reshape(-1, 4)
    out[:, 4:6] = value.reshape(-1).astype("<i2").view(np.uint8).reshape(-1, 2)
    return out.reshape(index.shape + (words, word_bytes))


def unpack_argmax(words) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`pack_argmax`: ``(index, value)`` (int64) of records
    ``uint8[..., argmax_words(N), N]``."""
    words = np.asarray(words, dtype=np.uint8)
    flat = np.ascontiguousarray(words.reshape(words.shape[:-2] + (-1,))[..., :ARGMAX_BYTES])
    if flat.shape[-1] != ARGMAX_BYTES:
        raise ValueError(f"an argmax record is {ARGMAX_BYTES} bytes, not {flat.shape[-1]}")
    index = flat[..., 0:4].copy().view("<i4")[..., 0].astype(np.int64)
    value = flat[..., 4:6].copy().view("<i2")[..., 0].astype(np.int64)
    return index, value


def beats(length: int, lanes: int) -> int:
    """Beats that carry a vector of ``length`` elements, ``lanes`` per beat."""
    return -(-length // lanes)


def lut_beats(lanes: int) -> int:
    """Beats of a LOAD_LUT command."""
    return beats(LUT_ENTRIES, lanes)


def lut16_beats(lanes: int) -> int:
    """Beats of a LOAD_LUT16 command."""
    return beats(GELU16_KNOTS, lanes)


def rsqrt_seed_table() -> list[int]:
    """Seed of 2**24 / sqrt(m') at the midpoint of each of the 96 intervals of m' in [1, 4).

    Entry k covers m >> 25 == k + 32, i.e. m' = m / 2**30 in [(k + 32) / 32, (k + 33) / 32);
    relative error of the seed <= 2**-7, after two Newton steps ~2**-22 (fixed-point limited).
    """
    return [int(math.floor((1 << RSQRT_FRAC_BITS) / math.sqrt((i + 0.5) / 32) + 0.5))
            for i in range(RSQRT_SEED_BASE, 128)]


def pack_requant(mult, shift) -> np.ndarray:
    """Per-lane requantisation parameters as i_b words: bits 0..15 mult, 16..21 shift."""
    mult = np.asarray(mult, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    return (mult & 0xFFFF) | ((shift & 0x3F) << 16)


def pack_gamma_beta(gamma, beta) -> np.ndarray:
    """LayerNorm gamma and beta (both int16) as i_b words: bits 0..15 gamma, 16..31 beta."""
    gamma = np.asarray(gamma, dtype=np.int64)
    beta = np.asarray(beta, dtype=np.int64)
    word = (gamma & 0xFFFF) | ((beta & 0xFFFF) << 16)
    return np.where(word >= 1 << 31, word - (1 << 32), word)
