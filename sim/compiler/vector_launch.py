"""``VEC`` launches: descriptors and registers for the vector engine (``docs/isa.md``, VEC).

A launch runs one vector-unit command per row of ``length`` elements. Tensors are token-major
:class:`Rows` (``hw.spec.memory`` layout): row r at words ``base + r*row_words``, elements of
``eb`` bytes packed little-endian. Per row the engine reads ``ceil(length*eb/N)`` words of each
operand and writes exactly ``ceil(length*eb/N)`` words of each output, so the descriptors walk
exactly those words and the rest of a row's allocation (``row_words`` may be larger) is left
untouched. A B operand of one row (bias, gamma/beta, per-channel requant words) is re-read for
every row (stride 0).

:func:`vector_launch` is the general builder; :func:`ln_launch`, :func:`add_launch`,
:func:`lut_launch`, :func:`load_lut_launch`, :func:`requant_launch`, :func:`bias_launch`,
:func:`relu_launch`, :func:`gelu16_launch` and :func:`load_lut16_launch` cover what a
transformer block needs; :func:`argmax_launch` and :func:`onehot_launch` what greedy decode
needs on chip (the next token's index, and its one-hot row for the embedding matmul);
:func:`argmax_pairs_launch` combines the partial argmaxes of the chips a vocabulary is split
over.
:func:`emit` appends a launch to an :class:`~sim.compiler.assembler.Assembler`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hw.spec.isa import MAX_COUNT, Op
from hw.spec.vector import (
    GELU16_G_MAX,
    GELU16_G_MIN,
    GELU16_KNOTS,
    LUT_ENTRIES,
    VectorOp,
    argmax_words,
)
from hw.spec.vector_engine import (
    LOAD_OPS,
    Q_OPS,
    RECORD_IN_OPS,
    RECORD_OUT_OPS,
    STATS_IN_OPS,
    VecFlags,
    record_words,
    row_words,
    table_entries,
    uses_a,
    uses_b,
)

from .descriptors import Desc

__all__ = ["Rows", "Tiled", "VectorLaunch", "vector_launch", "ln_launch", "ln_stats_launch",
           "ln_apply_launch", "add_launch", "mul_launch", "lut_launch",
           "load_lut_launch", "requant_launch", "bias_launch", "relu_launch", "gelu16_launch",
           "load_lut16_launch", "argmax_launch", "argmax_pairs_launch", "onehot_launch", "emit"]


@dataclass(frozen=True)
class Rows:
    """``rows`` rows of ``row_words`` words at word ``base``, elements of ``eb`` bytes."""

    base: int
    rows: int
    row_words: int
    eb: int

    def __post_init__(self):
        for name in ("base", "rows", "row_words"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Rows {name} must be a non-negative integer, not {value!r}")
        if self.eb not in (1, 2, 4):
            raise ValueError(f"Rows eb must be 1, 2 or 4 bytes, not {self.eb!r}")


@dataclass(frozen=True)
class Tiled:
    """A B operand of ``period`` rows of ``row_words`` words at word ``base`` (elements of ``eb``
    bytes), each read ``repeat`` times side by side to make one row of the launch, and the
    ``period`` rows again for each further ``period`` rows of the launch (RoPE's tables: one
    row per position, repeated for every head and every sequence). One descriptor does it:
    counts ``(row words, repeat, period, rows / period)``, strides ``(1, 0, row_words, 0)``."""

    base: int
    period: int
    row_words: int
    eb: int
    repeat: int

    @property
    def rows(self) -> int:
        return self.period

    def desc(self, rows: int, length: int, size: int) -> Desc:
        if self.repeat < 1 or self.period < 1 or rows % self.period:
            raise ValueError(f"b: {rows} rows are not whole periods of {self.period} rows "
                             f"(repeat={self.repeat})")
        rw = row_words(length, self.eb, size)
        if rw % self.repeat or rw // self.repeat > self.row_words:
            raise ValueError(f"b: a row of {rw} words is not {self.repeat} copies of at most "
                             f"{self.row_words} words")
        if rw // self.repeat > MAX_COUNT or max(self.repeat, self.period,
                                                rows // self.period) > MAX_COUNT:
            raise ValueError("b: the tiling exceeds a generator's 16-bit counts")
        return Desc(self.base, (rw // self.repeat, self.repeat, self.period,
                                rows // self.period), (1, 0, self.row_words, 0))


@dataclass(frozen=True)
class VectorLaunch:
    """One ``VEC`` launch: the registers (``regs``, ISA names) and one descriptor per used
    generator (``None`` for generators the launch does not start)."""

    op: VectorOp
    rows: int
    length: int
    flags: VecFlags
    rd3: Desc | None
    rd4: Desc | None
    rd5: Desc | None
    wr1: Desc | None
    wr2: Desc | None
    regs: dict = field(hash=False)

    @property
    def descs(self) -> dict[str, Desc]:
        """``{generator: descriptor}`` of the generators the launch starts."""
        named = {"RD3": self.rd3, "RD4": self.rd4, "RD5": self.rd5, "WR1": self.wr1,
                 "WR2": self.wr2}
        return {gen: d for gen, d in named.items() if d is not None}


def _walk(t: Rows, rows: int, length: int, size: int, what: str) -> Desc:
    rw = row_words(length, t.eb, size)
    if t.row_words < rw:
        raise ValueError(f"{what}: row_words={t.row_words} cannot hold {length} elements of "
                         f"{t.eb} bytes ({rw} words of {size} bytes)")
    if rw > MAX_COUNT or rows > MAX_COUNT:
        raise ValueError(f"{what}: {rows} rows of {rw} words exceed a generator's 16-bit counts")
    # A one-row tensor under a many-row launch is re-read for every row.
    step = 0 if t.rows == 1 else t.row_words
    return Desc(t.base, (rw, rows, 1, 1), (1, step, 0, 0))


def vector_launch(*, size: int, op, length: int, a: Rows | None,
                  b: Rows | Tiled | None = None,
                  data: Rows | None = None, q: Rows | None = None, mult: int = 1,
                  shift: int = 1, gshift: int = 16, per_channel: bool = False,
                  stats_base: int | None = None, n: int | None = None,
                  keep: bool = False) -> VectorLaunch:
    """``a.rows`` commands of ``op`` over rows of ``length`` elements.

    ``b`` (when the op reads B) has one row per row of ``a`` or a single row shared by all; ``data``
    (written through WR1 with ``data.eb`` bytes per element) and ``q`` (int8: the LayerNorm and
    RMSNorm ops' output, GELU16's low byte) have ``a.rows`` rows. REQUANT's ``out16`` follows
    ``data.eb`` (2: int16, 1: int8), and so does GELU16's (2: y, 1: y >> 8); GELU16's knot
    spacing g is ``shift``.
    ``stats_base``: the records (``hw.spec.vector_engine``), one per row, contiguous: LN_STATS
    writes statistics records (WR2), LN_APPLY and RMS_APPLY read them (RD5) and take ``n``, the
    element count over all chips; ARGMAX writes argmax records (WR2), ONEHOT reads them (RD5,
    and no ``a``: its rows are ``data``'s); both take ``n`` as the index offset (default 0).
    ``keep``: a ``data`` row that ends inside a word leaves the rest of the word as it is
    (``VecFlags.keep``; lanes packed with others, e.g. RoPE's Q and K written back).
    """
    op = VectorOp(op)
    apply = op in STATS_IN_OPS
    offset_op = op in (VectorOp.ARGMAX, VectorOp.ONEHOT)
    if not isinstance(size, int) or size < 2:
        raise ValueError(f"size must be an integer of at least 2, not {size!r}")
    if uses_a(op) != (a is not None):
        raise ValueError(f"{op.name} {'needs' if a is None else 'takes no'} operand a")
    if a is None and data is None:
        raise ValueError(f"{op.name} needs an output (data)")
    rows = a.rows if a is not None else data.rows
    if op in LOAD_OPS:
        entries = table_entries(op)
        if length != entries:
            raise ValueError(f"{op.name} length must be {entries}, not {length!r}")
        if data is not None or q is not None or b is not None:
            raise ValueError(f"{op.name} takes only a (the {entries} table entries)")
    elif not isinstance(length, int) or not 1 <= length <= MAX_COUNT:
        raise ValueError(f"length must be in 1..{MAX_COUNT}, not {length!r}")
    if not 1 <= rows <= MAX_COUNT:
        raise ValueError(f"a.rows must be in 1..{MAX_COUNT}, not {rows}")
    if uses_b(op, per_channel) != (b is not None):
        raise ValueError(f"{op.name}{' per-channel' if per_channel else ''} "
                         f"{'needs' if b is None else 'takes no'} operand b")
    if isinstance(b, Rows) and b.rows not in (1, rows):
        raise ValueError(f"b.rows={b.rows} must be 1 (shared) or a.rows={rows}")
    if q is not None and (op not in Q_OPS or q.eb != 1):
        raise ValueError("q is LN's int8 output: only for LN, LN_APPLY, RMS, RMS_APPLY (and "
                         "GELU16's low byte), with eb=1")
    if op is VectorOp.GELU16 and not (isinstance(shift, int)
                                      and GELU16_G_MIN <= shift <= GELU16_G_MAX):
        raise ValueError(f"GELU16 knot spacing g (shift) must be in {GELU16_G_MIN}.."
                         f"{GELU16_G_MAX}, not {shift!r}")
    records = op in RECORD_OUT_OPS or op in RECORD_IN_OPS
    if (stats_base is not None) != records:
        raise ValueError(f"stats_base is {'required' if stats_base is None else 'only'} for "
                         f"LN_STATS, LN_APPLY, RMS_APPLY, ARGMAX and ONEHOT")
    if apply and not (isinstance(n, int) and 1 <= n <= MAX_COUNT):
        raise ValueError(f"{op.name} needs n (the count over all chips) in 1..{MAX_COUNT}, "
                         f"not {n!r}")
    if offset_op:
        n = 0 if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_COUNT:
            raise ValueError(f"{op.name} index offset n must be in 0..{MAX_COUNT}, not {n!r}")
    if op is VectorOp.ARGMAX and a.eb > 2:
        raise ValueError(f"ARGMAX compares int16 elements: a.eb must be 1 or 2, not {a.eb}")
    if op in RECORD_OUT_OPS and (data is not None or q is not None):
        what = "statistics" if op is VectorOp.LN_STATS else "records"
        raise ValueError(f"{op.name} writes only its {what} (stats_base)")
    if op not in (*LOAD_OPS, *RECORD_OUT_OPS) and data is None and q is None:
        raise ValueError(f"{op.name} needs an output (data and/or q)")
    for name, t in (("data", data), ("q", q)):
        if t is not None and t.rows != rows:
            raise ValueError(f"{name}.rows={t.rows} must equal a.rows={rows}")
    narrowing = (VectorOp.REQUANT, VectorOp.GELU16, VectorOp.MUL)
    out16 = op in narrowing and data is not None and data.eb == 2
    if op in narrowing and data is not None and data.eb == 4:
        raise ValueError(f"{op.name} data must be int8 (eb=1) or int16 (eb=2)")
    flags = VecFlags(out16=out16, per_channel=bool(per_channel),
                     a_bytes=a.eb if a is not None else 2,
                     b_bytes=b.eb if b is not None else 4,
                     d_bytes=data.eb if data is not None else 1,
                     wr_data=data is not None,
                     wr_q=q is not None or op in RECORD_OUT_OPS, keep=bool(keep))
    rec = record_words(op, size)
    stats = None if stats_base is None else Desc(stats_base, (rec, rows, 1, 1), (1, rec, 0, 0))
    regs = {"VU_OP": int(op), "VU_ROWS": rows, "VU_LEN": length,
            "VU_N": n if apply or offset_op else length,
            "VU_MULT": int(mult), "VU_SHIFT": int(shift), "VU_GSHIFT": int(gshift),
            "VU_FLAGS": flags.encode()}
    return VectorLaunch(
        op=op, rows=rows, length=length, flags=flags, regs=regs,
        rd3=_walk(a, rows, length, size, "a") if a is not None else None,
        rd4=(None if b is None else b.desc(rows, length, size) if isinstance(b, Tiled)
             else _walk(b, rows, length, size, "b")),
        rd5=stats if op in RECORD_IN_OPS else None,
        wr1=_walk(data, rows, length, size, "data") if data is not None else None,
        wr2=stats if op in RECORD_OUT_OPS else (
            _walk(q, rows, length, size, "q") if q is not None else None))


def ln_launch(*, size, length, x: Rows, gamma_beta_base: int, q: Rows | None = None,
              y: Rows | None = None, gshift: int, mult: int, shift: int,
              rms: bool = False) -> VectorLaunch:
    """LayerNorm (``rms``: RMSNorm, VectorOp.RMS) of int16 rows ``x``: int8 ``q`` and/or int16
    ``y`` rows out.

    Gamma/beta are ``length`` words of ``hw.spec.vector.pack_gamma_beta`` (int32 elements) at
    ``gamma_beta_base``, shared by all rows (RMSNorm's beta is 0). Post-norm takes both outputs
    from one launch.
    """
    gb = Rows(gamma_beta_base, 1, row_words(length, 4, size), 4)
    op = VectorOp.RMS if rms else VectorOp.LN
    return vector_launch(size=size, op=op, length=length, a=x, b=gb, data=y, q=q,
                         mult=mult, shift=shift, gshift=gshift)


def ln_stats_launch(*, size, length, x: Rows, stats_base: int) -> VectorLaunch:
    """Partial LayerNorm statistics of int16 rows ``x`` (this chip's ``length`` elements of
    each row): one record ``[sum x, sum x^2]`` (2 x int64) per row at ``stats_base``, ready for
    an int64 SUM all-reduce over the chips."""
    return vector_launch(size=size, op=VectorOp.LN_STATS, length=length, a=x,
                         stats_base=stats_base)


def ln_apply_launch(*, size, length, n: int, x: Rows, gamma_beta_base: int, stats_base: int,
                    q: Rows | None = None, y: Rows | None = None, gshift: int, mult: int,
                    shift: int, rms: bool = False) -> VectorLaunch:
    """Normalise int16 rows ``x`` (``length`` local elements) with the global statistics
    records at ``stats_base`` and the global count ``n``; outputs as :func:`ln_launch`.
    ``rms``: RMSNorm (RMS_APPLY, which ignores the records' ``sum x``)."""
    gb = Rows(gamma_beta_base, 1, row_words(length, 4, size), 4)
    op = VectorOp.RMS_APPLY if rms else VectorOp.LN_APPLY
    return vector_launch(size=size, op=op, length=length, a=x, b=gb, data=y,
                         q=q, mult=mult, shift=shift, gshift=gshift, stats_base=stats_base,
                         n=n)


def add_launch(*, size, length, a: Rows, b: Rows, out: Rows) -> VectorLaunch:
    """Residual add ``out = clamp16(a + b)`` (``out`` may be ``a``: in place)."""
    return vector_launch(size=size, op=VectorOp.ADD, length=length, a=a, b=b, data=out)


def mul_launch(*, size, length, a: Rows, b: Rows | Tiled, out: Rows, mult: int,
               shift: int) -> VectorLaunch:
    """``out = requant(a * b, mult, shift)``: the element-wise product of int8 rows ``a`` and
    ``b`` requantised per tensor to int8 (``out.eb`` 1) or int16 (2): the gated FFN's product."""
    return vector_launch(size=size, op=VectorOp.MUL, length=length, a=a, b=b, data=out,
                         mult=mult, shift=shift)


def lut_launch(*, size, length, a: Rows, out: Rows) -> VectorLaunch:
    """``out = lut[a & 0xFF]`` (int8 rows in and out)."""
    return vector_launch(size=size, op=VectorOp.LUT, length=length, a=a, data=out)


def load_lut_launch(*, size, base: int) -> VectorLaunch:
    """Load the 256 int8 LUT entries stored (one int8 row) at word ``base``."""
    return vector_launch(size=size, op=VectorOp.LOAD_LUT, length=LUT_ENTRIES,
                         a=Rows(base, 1, row_words(LUT_ENTRIES, 1, size), 1))


def requant_launch(*, size, length, a: Rows, out: Rows, mult: int = 1, shift: int = 1,
                   params_base: int | None = None, keep: bool = False) -> VectorLaunch:
    """``out = requant(a)`` to int8 (``out.eb`` 1) or int16 (2); per tensor with ``mult`` and
    ``shift``, or per channel with ``pack_requant`` words (int32 elements) at ``params_base``;
    ``keep``: the bytes of a row's last word past the row are not written."""
    b = None if params_base is None else Rows(params_base, 1, row_words(length, 4, size), 4)
    return vector_launch(size=size, op=VectorOp.REQUANT, length=length, a=a, b=b, data=out,
                         mult=mult, shift=shift, per_channel=params_base is not None,
                         keep=keep)


def bias_launch(*, size, length, a: Rows, bias_base: int, out: Rows) -> VectorLaunch:
    """``out = a + bias`` wrapping modulo 2**32; ``length`` int32 biases at ``bias_base``."""
    b = Rows(bias_base, 1, row_words(length, 4, size), 4)
    return vector_launch(size=size, op=VectorOp.BIAS, length=length, a=a, b=b, data=out)


def relu_launch(*, size, length, a: Rows, out: Rows) -> VectorLaunch:
    """``out = max(a, 0)``."""
    return vector_launch(size=size, op=VectorOp.RELU, length=length, a=a, data=out)


def gelu16_launch(*, size, length, a: Rows, g: int, hi: Rows | None = None,
                  lo: Rows | None = None, y: Rows | None = None) -> VectorLaunch:
    """GELU16 of int16 rows ``a`` with knot spacing 2**``g`` (the table LOAD_LUT16 loaded).

    Outputs: ``hi`` (int8 ``y >> 8``, WR1) and/or ``lo`` (``y & 0xFF``, WR2), the two int8
    planes of a two-pass int16 matmul input; or ``y`` itself (int16, WR1) instead of ``hi``.
    """
    if hi is not None and y is not None:
        raise ValueError("GELU16 writes hi or y through WR1, not both")
    if hi is not None and hi.eb != 1:
        raise ValueError(f"GELU16 hi is int8 (eb=1), not eb={hi.eb}")
    if y is not None and y.eb != 2:
        raise ValueError(f"GELU16 y is int16 (eb=2), not eb={y.eb}")
    return vector_launch(size=size, op=VectorOp.GELU16, length=length, a=a,
                         data=hi if y is None else y, q=lo, shift=g)


def load_lut16_launch(*, size, base: int) -> VectorLaunch:
    """Load the 257 int16 GELU16 knots stored (one int16 row) at word ``base``."""
    return vector_launch(size=size, op=VectorOp.LOAD_LUT16, length=GELU16_KNOTS,
                         a=Rows(base, 1, row_words(GELU16_KNOTS, 2, size), 2))


def argmax_launch(*, size, length, x: Rows, record_base: int, offset: int = 0) -> VectorLaunch:
    """ARGMAX of each int16 row of ``x`` (``length`` elements on this chip): one argmax record
    per row (``hw.spec.vector.pack_argmax``: the index of the row's maximum, lowest on ties,
    plus ``offset``, and the maximum), contiguous at ``record_base``. ``offset`` is the global
    index of this chip's first column when a vocabulary is split over chips."""
    return vector_launch(size=size, op=VectorOp.ARGMAX, length=length, a=x,
                         stats_base=record_base, n=offset)


def argmax_pairs_launch(*, size, count: int, records_base: int, record_base: int,
                        rows: int = 1, stride: int | None = None,
                        row_stride: int | None = None) -> VectorLaunch:
    """ARGMAX in pair mode: for each of ``rows`` rows, ``count`` argmax records at
    ``records_base`` (the chips' partial argmaxes, e.g. all-gathered: global indices) combine
    into one record at ``record_base`` (contiguous, one per row): the largest value, the lowest
    index winning a tie. A row's records are ``stride`` words apart (default: a record's,
    contiguous), the rows' first records ``row_stride`` words apart (default: ``count``
    records'); e.g. every chip's block of records of all rows, side by side: ``stride`` the
    block's words, ``row_stride`` a record's."""
    for name, value in (("count", count), ("rows", rows)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
            raise ValueError(f"ARGMAX pairs {name} must be in 1..{MAX_COUNT}, not {value!r}")
    rec = argmax_words(size)
    if count * rec > MAX_COUNT:
        raise ValueError(f"ARGMAX pairs: {count} records of {rec} words exceed a generator's "
                         f"16-bit counts")
    flags = VecFlags(a_bytes=2, wr_data=False, wr_q=True, pairs=True)
    regs = {"VU_OP": int(VectorOp.ARGMAX), "VU_ROWS": rows, "VU_LEN": count, "VU_N": 0,
            "VU_MULT": 1, "VU_SHIFT": 1, "VU_GSHIFT": 16, "VU_FLAGS": flags.encode()}
    if stride is None and row_stride is None:
        rd5 = Desc(records_base, (count * rec, rows, 1, 1), (1, count * rec, 0, 0))
    else:
        stride = rec if stride is None else stride
        row_stride = count * rec if row_stride is None else row_stride
        if stride < rec and count > 1:
            raise ValueError(f"ARGMAX pairs: records {stride} words apart overlap records of "
                             f"{rec} words")
        rd5 = Desc(records_base, (rec, count, rows, 1), (1, stride, row_stride, 0))
    return VectorLaunch(
        op=VectorOp.ARGMAX, rows=rows, length=count, flags=flags, regs=regs, rd3=None,
        rd4=None, rd5=rd5, wr1=None, wr2=Desc(record_base, (rec, rows, 1, 1), (1, rec, 0, 0)))


def onehot_launch(*, size, length, record_base: int, out: Rows, offset: int = 0) -> VectorLaunch:
    """ONEHOT: for each of ``out.rows`` argmax records at ``record_base`` (contiguous, as
    :func:`argmax_launch` writes them), a row of ``length`` elements of ``out.eb`` bytes (int8:
    1) with 1 at lane ``index - offset`` and 0 elsewhere (all 0 when the index is outside this
    chip's ``offset .. offset + length - 1``): the A operand of the embedding matmul
    ``onehot @ E8``."""
    return vector_launch(size=size, op=VectorOp.ONEHOT, length=length, a=None, data=out,
                         stats_base=record_base, n=offset)


#: The ``VU_`` registers whose values come from the data (quantisation scales).
DATA_REGS = ("VU_MULT", "VU_SHIFT", "VU_GSHIFT")


def emit(asm, launch: VectorLaunch, src=None):
    """Append the launch's SETs (descriptors of the used generators, every VU_ register) and
    the ``VEC`` opcode to ``asm``. ``src`` names where the launch's data-derived scales
    (:data:`DATA_REGS`) come from (:meth:`~sim.compiler.assembler.Assembler.set`); ``None``:
    they are constants."""
    for gen, desc in launch.descs.items():
        asm.set_desc(gen, desc)
    for name, value in launch.regs.items():
        asm.set(name, value, src if name in DATA_REGS else None)
    asm.launch(Op.VEC)
