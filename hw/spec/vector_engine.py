"""``VEC`` launch encodings shared by the vector engine, the ISS and the launch builder.

Plain Python, no Amaranth. A ``VEC`` launch runs ``VU_ROWS`` vector-unit commands (one per row
of ``VU_LEN`` elements) over scratchpad words; ``VU_FLAGS`` says how the words are read and
written (``docs/isa.md``, section VEC)::

    bit 0     out16        REQUANT to int16 rather than int8; GELU16's data is y, not y >> 8
    bit 1     per_channel  REQUANT takes per-lane (mult, shift) words from RD4
    bits 3:2  a_bytes      log2 of operand A's element bytes (0: 1, 1: 2, 2: 4)
    bits 5:4  b_bytes      log2 of operand B's element bytes
    bits 7:6  d_bytes      log2 of the data output's element bytes
    bit 8     wr_data      write ``data`` through WR1
    bit 9     wr_q         write ``q`` through WR2: LayerNorm's int8 output, GELU16's low byte
                           (LN_STATS and ARGMAX: their records)
    bit 10    pairs        ARGMAX combines argmax records: ``VU_LEN`` of them per row from RD5
                           (the partial argmaxes of the chips a vocabulary is split over), no A
    bit 11    keep         a ``data`` row that ends inside a word leaves the rest of that word
                           as it is (byte write enables) instead of writing zeros there: a
                           row of packed lanes written back among others (RoPE's Q and K)

Bits 12 and up must be 0; a 2-bit width code of 3 is invalid.

LayerNorm statistics (LN_STATS writes them through WR2, LN_APPLY and RMS_APPLY read them
through RD5) are one record per row: ``[sum x, sum x^2]`` as two little-endian int64 (16
bytes, ``sum x`` the unit's int32 sign-extended), padded to ``ceil(16 / N)`` words, so that an
int64 SUM all-reduce of the records gives the global statistics.

Argmax records (:data:`hw.spec.vector.ARGMAX_BYTES`, :func:`hw.spec.vector.pack_argmax`):
ARGMAX writes one per row through WR2, ONEHOT reads one per row through RD5 (and no operand A:
RD3 is not started), ``argmax_words(N)`` words each; ARGMAX with ``pairs`` reads ``VU_LEN`` of
them per row through RD5 (no operand A) and writes the one with the largest value, the lowest
index winning a tie.
"""

from __future__ import annotations

from dataclasses import dataclass

from .memory import row_words
from .vector import GELU16_KNOTS, LUT_ENTRIES, VectorOp, argmax_words, twin_of

__all__ = ["VecFlags", "FLAG_BITS", "SUPPORTED_OPS", "ELEM_BYTES", "LOAD_OPS", "Q_OPS", "B_OPS",
           "STATS_IN_OPS", "RECORD_OUT_OPS", "RECORD_IN_OPS", "combines", "uses_a",
           "uses_records", "uses_b", "row_words",
           "row_beats", "table_entries", "STATS_BYTES", "stats_words", "record_words"]

#: Bytes of one LayerNorm statistics record: int64 sum x, int64 sum x^2.
STATS_BYTES = 16

#: Bits of ``VU_FLAGS`` that carry meaning (the rest must be 0).
FLAG_BITS = 12
#: Element byte widths a 2-bit width code can name (code = index).
ELEM_BYTES = (1, 2, 4)
#: Ops a ``VEC`` launch supports.
SUPPORTED_OPS = tuple(VectorOp)
#: Ops that load a table (one row of exactly :func:`table_entries` elements) and write nothing.
LOAD_OPS = (VectorOp.LOAD_LUT, VectorOp.LOAD_LUT16)


def _like(*ops) -> tuple[VectorOp, ...]:
    """Every op that has the streams of one of ``ops`` (:func:`hw.spec.vector.twin_of`)."""
    return tuple(op for op in VectorOp if twin_of(op) in ops)


#: Ops with a ``q`` output (written through WR2 when ``wr_q``).
Q_OPS = _like(VectorOp.LN, VectorOp.LN_APPLY, VectorOp.GELU16)
#: Ops that always read operand B (RD4); REQUANT reads it when ``per_channel``.
B_OPS = _like(VectorOp.ADD, VectorOp.BIAS, VectorOp.LN, VectorOp.LN_APPLY)
#: Ops that read one statistics record per row (RD5).
STATS_IN_OPS = _like(VectorOp.LN_APPLY)
#: Ops that write one record per row through WR2 (``wr_q`` set, ``wr_data`` clear) and no
#: ``data``: LN_STATS (statistics), ARGMAX (argmax records).
RECORD_OUT_OPS = (VectorOp.LN_STATS, VectorOp.ARGMAX)
#: Ops that read one record per row through RD5: the statistics-reading ops and ONEHOT (an
#: argmax record).
RECORD_IN_OPS = (*STATS_IN_OPS, VectorOp.ONEHOT)


def _code(name: str, nbytes: int) -> int:
    if nbytes not in ELEM_BYTES:
        raise ValueError(f"{name} must be 1, 2 or 4 bytes, not {nbytes!r}")
    return ELEM_BYTES.index(nbytes)


@dataclass(frozen=True)
class VecFlags:
    """The fields of ``VU_FLAGS`` (element widths in bytes)."""

    out16: bool = False
    per_channel: bool = False
    a_bytes: int = 2
    b_bytes: int = 4
    d_bytes: int = 2
    wr_data: bool = True
    wr_q: bool = False
    pairs: bool = False
    keep: bool = False

    def __post_init__(self):
        for name in ("a_bytes", "b_bytes", "d_bytes"):
            _code(name, getattr(self, name))

    def encode(self) -> int:
        return (int(bool(self.out16)) | int(bool(self.per_channel)) << 1
                | _code("a_bytes", self.a_bytes) << 2 | _code("b_bytes", self.b_bytes) << 4
                | _code("d_bytes", self.d_bytes) << 6 | int(bool(self.wr_data)) << 8
                | int(bool(self.wr_q)) << 9 | int(bool(self.pairs)) << 10
                | int(bool(self.keep)) << 11)

    @classmethod
    def decode(cls, value: int) -> VecFlags:
        """Inverse of :meth:`encode`; ``ValueError`` naming the bad field."""
        value = int(value)
        if value < 0 or value >> FLAG_BITS:
            raise ValueError(f"VU_FLAGS={value:#x} sets bits outside 0..{FLAG_BITS - 1}")
        widths = {}
        for name, pos in (("a_bytes", 2), ("b_bytes", 4), ("d_bytes", 6)):
            code = (value >> pos) & 3
            if code == 3:
                raise ValueError(f"VU_FLAGS={value:#x}: {name} code 3 is invalid "
                                 "(0: 1, 1: 2, 2: 4 bytes)")
            widths[name] = ELEM_BYTES[code]
        return cls(out16=bool(value & 1), per_channel=bool(value >> 1 & 1),
                   wr_data=bool(value >> 8 & 1), wr_q=bool(value >> 9 & 1),
                   pairs=bool(value >> 10 & 1), keep=bool(value >> 11 & 1), **widths)


def combines(op: VectorOp, pairs: bool) -> bool:
    """ARGMAX in pair mode: it reads argmax records (RD5), not elements."""
    return VectorOp(op) is VectorOp.ARGMAX and bool(pairs)


def uses_a(op: VectorOp, pairs: bool = False) -> bool:
    """Whether the op reads operand A (RD3): every op but ONEHOT and pair-mode ARGMAX (they
    read records)."""
    return VectorOp(op) is not VectorOp.ONEHOT and not combines(op, pairs)


def uses_records(op: VectorOp, pairs: bool = False) -> bool:
    """Whether the op reads records through RD5: :data:`RECORD_IN_OPS`, pair-mode ARGMAX."""
    return VectorOp(op) in RECORD_IN_OPS or combines(op, pairs)


def uses_b(op: VectorOp, per_channel: bool) -> bool:
    """Whether the op reads operand B (RD4): :data:`B_OPS`, per-channel REQUANT."""
    op = VectorOp(op)
    return op in B_OPS or (op is VectorOp.REQUANT and bool(per_channel))


def table_entries(op: VectorOp) -> int | None:
    """Entries a table-loading op reads (LOAD_LUT 256, LOAD_LUT16 257); None for other ops."""
    return {VectorOp.LOAD_LUT: LUT_ENTRIES, VectorOp.LOAD_LUT16: GELU16_KNOTS}.get(VectorOp(op))


def row_beats(op: VectorOp, length: int, lanes: int) -> int:
    """Vector-unit beats per command (LOAD_LUT, LOAD_LUT16: always the whole table)."""
    length = table_entries(op) or length
    return -(-length // lanes)


def stats_words(word_bytes: int) -> int:
    """Words of one statistics record."""
    return -(-STATS_BYTES // word_bytes)


def record_words(op: VectorOp, word_bytes: int) -> int | None:
    """Words of the record ``op`` reads (RD5) or writes (WR2) per row: an argmax record for
    ARGMAX and ONEHOT, a statistics record for LN_STATS and the statistics-reading ops; None
    for ops without records."""
    op = VectorOp(op)
    if op in (VectorOp.ARGMAX, VectorOp.ONEHOT):
        return argmax_words(word_bytes)
    if op is VectorOp.LN_STATS or op in STATS_IN_OPS:
        return stats_words(word_bytes)
    return None
