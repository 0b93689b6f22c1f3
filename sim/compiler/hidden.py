"""Hidden-dimension parallelism (``--strategy hidden``): d_model sharded across the chips.

Chip c holds columns ``lo_c .. hi_c - 1`` of the residual stream and of every d_model-wide
activation (split in whole scratchpad words like ``numpy.array_split``, so uneven: 8 words on 3
chips are 3, 3, 2), and columns of the FFN's inner activation (d_ff split the same way). The cut
goes across heads: a head whose lanes lie on several chips is a **split head**; its chips are
consecutive (its **group**). Every matmul then is a partial sum, every LayerNorm a partial
statistic, every attention score of a split head a partial dot product:

- **LayerNorm** (partial-statistics mode): each chip runs LN_STATS over its slice of each row,
  an int64 SUM all-reduce of the ``[sum x, sum x^2]`` records over all chips gives the global
  statistics, and LN_APPLY with the global n = d_model normalises the slice: the same integers
  as one chip's LayerNorm (the formula depends only on x, the sums and n). RMSNorm is the same
  with RMS_APPLY, which takes the records' ``sum x`` as 0.
- **Projections** (QKV, O, FFN1, FFN2): the input is sharded by columns, so chip c computes
  ``X[:, cols_c] @ W[rows_c, :]``: int32 partial sums of the *whole* output (a RAW matmul; chip
  0 adds the biases). Each chip needs only its own columns of the output, so a SUM
  **reduce-scatter** delivers them (``reduce="reduce_scatter"``, the default), or an
  **all-reduce** delivers everything and each chip keeps its columns (``reduce="all_reduce"``,
  twice the bytes); a per-channel REQUANT makes the int8 (QKV, FFN1) or int16 (O, FFN2)
  outputs. int32 sums wrap modulo 2**32 in any order, so the result is one chip's. A gated
  FFN's gate is one more projection with FFN1's columns on every chip, so the activation LUT
  on it and MUL into FFN1's output run on each chip's own columns.
- **Attention**: a head on one chip runs as usual. A split head runs the attention buffer's
  split-score mode on each of its chips over that chip's lanes of Q and K: pass 1 (ATTN
  partial) writes the raw int32 partial score rows, an int32 SUM all-reduce adds them, pass 2
  (ATTN reduced) takes the reduced rows through the same scaling, softmax and P.V over the
  chip's lanes of V: its slice of the head's output stays where the next projection needs it.
  The partial rows of every split head go to one buffer (a slot per split head, zero where a
  chip holds none of the head: it is initialised with zeros and only the reduction's separate
  output buffer is written by the ring), reduced by **one all-reduce over all chips** per layer,
  which runs while the chips attend their whole heads.

**Grouped-query attention**: a chip's K and V layouts hold the lanes of the K/V heads its query
pieces read (:class:`KvPiece`: query head h reads K/V head ``h // kv_group`` at the same lanes;
the pieces of one K/V head with the same lanes share one, so whole query heads of a group on a
chip share their K/V head), and each ATTN (whole, partial or reduced) reads them at the piece's
``kv_off``. The QKV reduction delivers those K and V columns to every chip that needs them: a
column wanted by several chips is in the weight matrix once per destination.

**RoPE** (``sim.golden.rope``): the QKV projection also computes the rotated projections
``q' = h (Wq P)`` and ``k' = h (Wk P)``, columns like any other, so the reduction's ownership
puts q' and k' of lane j on the chip that owns q and k of lane j, wherever lane j's
rotate-half partner lives: a split head needs no exchange, since the rotation is in the
weights. Each chip then rotates its own lanes with the vector unit (MUL by its cos table, MUL
of q', k' by its sin table, ADD, per-lane REQUANT), which is lane-wise, so a split head's
partial scores of rotated lanes sum to the rotated head's. A chip's tables are rows of its
``[Q | K]`` lanes per position: one piece's lanes read for every piece when all hold the same
lanes (whole heads), else the whole row.

Per layer that is 2 LayerNorm all-reduces, 4 projection reductions and, when a head is split,
one all-reduce of the partial scores: every collective over all chips in the same order on
every chip. Why not one all-reduce per head within the head's chips (fewer bytes, disjoint
groups at the same time): the collective engine takes ring words from whoever sends them (no
source check), so a chip whose predecessor changes from one collective to the next (a group's
first member) must not receive its new predecessor's words while its previous collective runs.
A SEND from the chip to that predecessor, with a RECV before the predecessor's COLL, orders
them, but on the one-way ring that message passes the chips between, and a chip that has
launched the next collective sends words to its successor that the successor takes only once
it launches it too: the message waits behind them, its receiver waits for it, a deadlock (the
cycle model, equal to the RTL, shows it on 5 and 7 chips). Over the whole ring no predecessor
ever changes.

Memory layouts of the partial sums (``Reduction``): all-reduce: row-major [rows, all output
columns], the columns ordered by destination chip. Reduce-scatter: tile-major (N x N int32
tiles, row blocks outer), the column blocks permuted so that one COLL per row block and column
group carries a contiguous block for each destination (blocks no larger than the engine's
buffers); chip p's columns come back at its block's place and a REQUANT per column group
walks them. The reduce-scatter projections run by row blocks: while block mb is reduced, the
matmul computes block mb + 1 and the vector unit requantises block mb - 1.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
from dataclasses import dataclass, field

import numpy as np

from hw.spec import ConfigError, ModelConfig, NpuConfig
from hw.spec.attention import partial_row_words
from hw.spec.collective import CollectiveRequest, elements_per_word, word_bytes
from hw.spec.formats import OutMode
from hw.spec.isa import COLL_FIFO_WORDS, Unit
from hw.spec.memory import PARAM_WORDS, pack_params, pack_rows, pack_weight_blocks, row_words
from hw.spec.vector import LUT_ENTRIES, pack_gamma_beta, pack_requant
from hw.spec.vector_engine import stats_words

from ..golden.rope import ROPE_MUL, rope_tables
from . import attention_launch as al_
from . import collective_launch as cl
from . import vector_launch as vl
from .alloc import Allocator, Tensor
from .assembler import Assembler
from .blocks import cdiv, pad_to
from .compat import Limits, check_ring_size, check_single_chip
from .descriptors import Desc, emit_matmul, matmul_launch
from .program import ChipProgram, Placement, SystemProgram, finish
from .quantize import QLinear, QModel
from .vector_launch import Rows

__all__ = ["Piece", "KvPiece", "HiddenPlan", "split_widths", "hidden_plan", "check_hidden",
           "Reduction", "compile_hidden", "hidden_stats", "REDUCE_MODES", "SEED_COLLECTIVES"]

#: How the projections' partial sums are reduced.
REDUCE_MODES = ("reduce_scatter", "all_reduce")
#: DESIGN's first estimate of the all-reduces per layer (LayerNorm statistics and scores only).
SEED_COLLECTIVES = "3-4"


@dataclass(frozen=True)
class Piece:
    """The lanes of head ``head`` on one chip: d_model columns ``lo .. hi - 1``, at column
    ``off`` of the chip's Q (and attention output) layout, ``width`` = ``hi - lo`` (its
    ``AT_D_HEAD``; the pieces are packed, one after another, sharing words); ``group`` = ``(first,
    count)`` of the head's chips; ``kv_off``: the column of the same lanes of its K/V head in the
    chip's K (and V) layout
    (:class:`KvPiece`)."""

    head: int
    lo: int
    hi: int
    off: int
    width: int
    group: tuple[int, int]
    kv_off: int = 0

    @property
    def split(self) -> bool:
        return self.group[1] > 1


@dataclass(frozen=True)
class KvPiece:
    """The lanes of K/V head ``head`` that a chip's query pieces read: K (and V) columns
    ``lo .. hi - 1`` (of ``d_kv``), at column ``off`` of the chip's K and V layout, ``width``
    ``hi - lo``, packed like the pieces. Without grouped-query attention one per piece, at its
    ``off``;
    with it, the query pieces of one K/V head with the same lanes share one."""

    head: int
    lo: int
    hi: int
    off: int
    width: int


@dataclass(frozen=True)
class Span:
    """One sample's attention operands on a chip: the words of its first Q, K and V rows
    (``row_words`` apart), its first output row, ``queries`` queries from position ``q_pos``
    over ``keys`` keys from position 0; the pieces are packed (one after another, sharing
    words), so K's and V's layouts begin at lanes ``k_lane`` and ``v_lane`` of their rows."""

    q: int
    k: int
    v: int
    row_words: int
    o: int
    queries: int
    keys: int
    q_pos: int = 0
    k_lane: int = 0
    v_lane: int = 0


@dataclass(frozen=True)
class HiddenPlan:
    """Who holds what: per chip its d_model columns ``cols[c] = (lo, hi)``, its d_ff columns
    ``ffn[c]``, its head pieces and the K/V pieces they read; per head its group ``(first,
    count)``."""

    chips: int
    size: int
    d_model: int
    cols: tuple
    ffn: tuple
    pieces: tuple
    groups: tuple
    kv_pieces: tuple = ()

    def width(self, c: int) -> int:
        lo, hi = self.cols[c]
        return hi - lo

    def ffn_width(self, c: int) -> int:
        lo, hi = self.ffn[c]
        return hi - lo

    def q_width(self, c: int) -> int:
        """Columns of chip c's Q (and attention output) layout."""
        return sum(p.width for p in self.pieces[c])

    def kv_width(self, c: int) -> int:
        """Columns of chip c's K (and V) layout (its Q's without grouped-query attention)."""
        return sum(p.width for p in self.kv_pieces[c])

    @property
    def split_heads(self) -> list[int]:
        return [h for h, (_, count) in enumerate(self.groups) if count > 1]


def split_widths(total: int, chips: int, size: int) -> list[int]:
    """``total`` columns in whole words of ``size`` split like ``numpy.array_split`` (the first
    chips one word more), the last chip's trimmed to ``total``; ValueError if a chip gets none."""
    words = cdiv(total, size)
    if words < chips:
        raise ValueError(f"{total} columns are {words} words of {size}: fewer than {chips} chips")
    out = [len(part) * size for part in np.array_split(np.arange(words), chips)]
    out[-1] -= words * size - total
    return out


def _ranges(widths) -> tuple:
    edges = np.concatenate([[0], np.cumsum(widths)])
    return tuple((int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True))


def _resolve_widths(cfg: ModelConfig, key: str, widths, chips: int, n: int) -> list[int]:
    """``widths`` checked (``chips`` positive widths summing to ``cfg.<key>``), or the default
    :func:`split_widths`; ConfigError naming ``key`` when neither holds."""
    total = getattr(cfg, key)
    try:
        if widths is None:
            return split_widths(total, chips, n)
        widths = [int(w) for w in widths]
        if len(widths) != chips or min(widths) < 1 or sum(widths) != total:
            raise ValueError(f"{key} widths {widths} must be {chips} positive widths summing "
                             f"to {total}")
        return widths
    except ValueError as exc:
        raise ConfigError(f"cannot be split over {chips} chips: {exc}", path=cfg.path,
                          key=key, value=total) from None


def hidden_plan(npu: NpuConfig, cfg: ModelConfig, chips: int, *, widths=None,
                ffn_widths=None) -> HiddenPlan:
    """The shards of ``cfg`` on ``chips`` chips (``widths``, ``ffn_widths``: explicit d_model and
    d_ff columns per chip; default :func:`split_widths`). ConfigError when a chip's share exceeds
    its datapath: a head's lanes on a chip above ``d_head_max``, a slice above ``d_model_max``."""
    n = npu.array_size
    widths = _resolve_widths(cfg, "d_model", widths, chips, n)
    ffn_widths = _resolve_widths(cfg, "d_ff", ffn_widths, chips, n)
    cols, ffn = _ranges(widths), _ranges(ffn_widths)
    dh = cfg.d_head
    groups = []
    for h in range(cfg.n_heads):
        on = [c for c, (lo, hi) in enumerate(cols) if lo < (h + 1) * dh and hi > h * dh]
        groups.append((on[0], len(on)))
    pieces, kv_pieces = [], []
    for lo, hi in cols:
        mine, off = [], 0
        kvs, kv_at = {}, 0        # (K/V head, first lane, last lane) -> its KvPiece
        for h in range(lo // dh, cdiv(hi, dh)):
            a, b = max(lo, h * dh), min(hi, (h + 1) * dh)
            width = b - a             # packed: the pieces one after another, lanes of words
            g = h // cfg.kv_group
            lanes = (g, a - h * dh, b - h * dh)
            if lanes not in kvs:
                kvs[lanes] = KvPiece(g, g * dh + lanes[1], g * dh + lanes[2], kv_at, width)
                kv_at += width
            mine.append(Piece(h, a, b, off, width, groups[h], kvs[lanes].off))
            off += width
        pieces.append(tuple(mine))
        kv_pieces.append(tuple(kvs.values()))
    for c, mine in enumerate(pieces):
        for p in mine:
            if p.width > npu.d_head_max:
                raise ConfigError(f"exceeds datapath width d_head_max={npu.d_head_max} on chip "
                                  f"{c} of {chips}: it holds {p.hi - p.lo} lanes of head "
                                  f"{p.head}", path=npu.path, key="d_head",
                                  value=cfg.d_head)
        if widths[c] > npu.d_model_max:
            raise ConfigError(f"exceeds d_model_max={npu.d_model_max} on chip {c} of {chips}: "
                              f"its slice has {widths[c]} columns", path=npu.path,
                              key="d_model", value=cfg.d_model)
    return HiddenPlan(chips, n, cfg.d_model, cols, ffn, tuple(pieces), tuple(groups),
                      tuple(kv_pieces))


def check_hidden(npu: NpuConfig, cfg: ModelConfig, chips: int, limits: Limits | None = None,
                 **kw) -> HiddenPlan | None:
    """Compatibility of ``cfg`` with ``chips`` chips under hidden parallelism: every check of
    :func:`check_single_chip` but the widths, which are checked per shard (:func:`hidden_plan`);
    ConfigError, or each refusal reported to ``limits`` (then None when a shard refused)."""
    limits = Limits() if limits is None else limits
    check_ring_size(chips, limits)
    wide = max(npu.d_model_max, cfg.d_model, npu.d_head_max, cfg.d_head)
    check_single_chip(dataclasses.replace(npu, d_head_max=wide, d_model_max=wide), cfg, limits)
    return limits.run(hidden_plan, npu, cfg, chips, **kw)


# --- the reduction of one projection's partial sums ---------------------------------------------

class Reduction:
    """Where every chip's int32 partial sums of one projection live and how they are reduced.

    ``widths[p]``: columns of destination chip p's output (a multiple of N); ``rows`` a multiple
    of N. The weight matrix of every chip has its output column blocks in :attr:`order`
    (``(p, j)``: block j of p's columns, or ``(p, None)``: zero padding). ``mode``:

    - ``"all_reduce"``: row-major [rows, NB * N] (blocks by destination), reduced by all-reduces
      over the flat buffer, at most one engine buffer per block;
    - ``"reduce_scatter"``: tile-major (tile (mb, nb) of N x N int32 at ``(mb * NB + nb) *
      4N`` words); the blocks ordered (column group g, destination p, tile t), each destination
      with the same ``T_g`` tiles in group g (``Jmax`` = the most blocks any chip has, padded),
      so the reduce-scatter of row block mb and group g is contiguous: ``chips`` blocks of
      ``T_g`` tiles, one per destination, each fitting the engine's buffers.
    """

    def __init__(self, *, widths, rows: int, size: int, link_bytes: int, mode: str,
                 fifo_words: int = COLL_FIFO_WORDS):
        if mode not in REDUCE_MODES:
            raise ValueError(f"reduce must be one of {', '.join(REDUCE_MODES)}, not {mode!r}")
        n = size
        self.mode, self.n, self.rows, self.chips = mode, n, rows, len(widths)
        self.widths = list(widths)
        self.mb = rows // n
        wbytes = word_bytes(link_bytes, n)
        self.epw = elements_per_word(wbytes, 32)
        self.unit_elems = self.chips * self.epw
        self.chunk_elems = self.unit_elems * fifo_words
        blocks = [w // n for w in widths]
        if mode == "all_reduce":
            self.order = [(p, j) for p in range(self.chips) for j in range(blocks[p])]
            self.nb = len(self.order)
            self.elements = pad_to(rows * self.nb * n, self.unit_elems)
            self.words = self.elements * 4 // n
            self.groups = []
            return
        tile_bytes = 4 * n * n
        q = max(1, wbytes // tile_bytes)              # tiles per whole engine word (powers of 2)
        tmax = fifo_words * wbytes // tile_bytes // q * q
        if tmax < q:
            raise ValueError(f"a {n} x {n} int32 tile does not fit the collective engine's "
                             f"buffers ({fifo_words} words of {wbytes} bytes)")
        jmax = pad_to(max(blocks), q)
        units = np.array_split(np.arange(jmax // q), cdiv(jmax, tmax))
        self.groups = []          # (first block, tiles) of each column group
        self.order = []
        at = 0
        for part in units:
            tiles = len(part) * q
            self.groups.append((at, tiles))
            for p in range(self.chips):
                self.order += [(p, at + t if at + t < blocks[p] else None) for t in range(tiles)]
            at += tiles
        self.nb = len(self.order)
        self.block_words = self.nb * 4 * n
        self.words = self.mb * self.block_words
        self.elements = self.words * n // 4

    def columns(self, dest_cols) -> np.ndarray:
        """The global output column of every column of the weight matrix (-1: zero), from
        ``dest_cols[p]``: destination p's output columns in its local order (-1: padding)."""
        out = []
        for p, j in self.order:
            out += [-1] * self.n if j is None else list(dest_cols[p][j * self.n:(j + 1) * self.n])
        return np.asarray(out, np.int64)

    def c_desc(self, base: int) -> Desc:
        """The matmul's output descriptor (WR0) for the partial sums at ``base``."""
        n = self.n
        if self.mode == "all_reduce":
            rw = self.nb * 4
            return Desc(base, (4, n, self.nb, self.mb), (1, rw, 4, n * rw))
        tile = 4 * n
        return Desc(base, (4, n, self.nb, self.mb), (1, 4, tile, self.nb * tile))

    def chunks(self, base: int) -> list[tuple[int, int]]:
        """``(base word, elements)`` of each COLL, in order."""
        n = self.n
        if self.mode == "all_reduce":
            return [(base + at * 4 // n, min(self.chunk_elems, self.elements - at))
                    for at in range(0, self.elements, self.chunk_elems)]
        tile = 4 * n
        return [(base + mb * self.nb * tile + first * self.chips * tile,
                 self.chips * tiles * n * n)
                for mb in range(self.mb) for first, tiles in self.groups]

    def requant_launches(self, chip: int, base: int, params_base: int, dst: Tensor, *,
                         mb: int | None = None):
        """The per-channel REQUANT launches that turn chip ``chip``'s reduced sums into ``dst``
        (``dst.eb`` 1: int8, 2: int16; its first ``widths[chip]`` columns); ``mb``: only row
        block mb (reduce-scatter)."""
        n, rows, eb = self.n, self.rows, dst.eb
        out = Rows(dst.base, rows, dst.row_words, eb)
        if self.mode == "all_reduce":
            off = sum(1 for p, _ in self.order if p < chip) * 4
            return [vl.requant_launch(size=n, length=self.widths[chip],
                                      a=Rows(base + off, rows, self.nb * 4, 4), out=out,
                                      params_base=params_base)]
        tile = 4 * n
        blocks = self.mb if mb is None else 1
        row0 = 0 if mb is None else mb * n
        launches = []
        for first, tiles in self.groups:
            mine = min(tiles, self.widths[chip] // n - first)
            if mine <= 0:
                continue
            launch = vl.requant_launch(
                size=n, length=mine * n, a=Rows(0, blocks * n, 4 * mine, 4),
                out=Rows(dst.base + row0 * dst.row_words + first * eb, blocks * n,
                         dst.row_words, eb),
                params_base=params_base + first * 4)
            a = Desc(base + row0 * self.nb * 4 + first * self.chips * tile + chip * tiles * tile,
                     (4, mine, n, blocks), (1, tile, 4, self.nb * tile))
            launches.append(dataclasses.replace(launch, rd3=a))
        return launches


# --- one chip's share of the program ------------------------------------------------------------

#: The working tensors of a row per token (a view of fewer rows cuts them: ``_Compiler.view``).
_ROW_WISE = ("x", "h", "x8", "qkv", "rope1", "rope2", "o", "a", "f", "g")


@dataclass
class _Chip:
    """One chip while the programs are built: its assembler, allocator and tensors."""

    c: int
    asm: Assembler
    al: Allocator
    t: dict = field(default_factory=dict)          # working tensors by name
    layers: list = field(default_factory=list)     # per layer: {name: tensor or (w, p)}
    rope: tuple | None = None                      # RoPE: the C and S tables (vl.Tiled)
    #: Weights outside the layers, by projection name (:meth:`_Compiler.add_projection`).
    extra: dict = field(default_factory=dict)


class _Compiler:
    """Builds every chip's program in lock step, phase by phase."""

    def __init__(self, npu, qm, plan, *, seq, samples, reduce, contents=True,
                 transfer_bank=True, rope_positions=None):
        self.npu, self.qm, self.plan, self.cfg = npu, qm, plan, qm.cfg
        self.contents = contents
        self.n = n = npu.array_size
        self.seq, self.nseq = seq, samples
        self.seq_pad = pad_to(seq, n)
        self.rows = samples * self.seq_pad
        #: Rows of one sample in the row-wise tensors (the attention's output: sample s from
        #: row ``s * sample_rows``).
        self.sample_rows = self.seq_pad
        #: RoPE: the positions the tables hold (default the sequence's), and where a block's
        #: rows read them: ``(first row, period)`` (default every sample from position 0).
        self.rope_positions = seq if rope_positions is None else rope_positions
        self.rope_at = (0, self.seq_pad)
        #: The attention's operands per chip and sample (:meth:`spans`); None: the QKV rows.
        self.span_of = None
        self.link = npu.link_bytes_per_cycle
        self.ratio = word_bytes(self.link, self.n) // n
        self.chips = plan.chips
        self.reduce = reduce
        self.comms: list[dict] = []
        self._ids = itertools.count()          # collective ids, shared by every view
        self.layer = 0
        self.prw = partial_row_words(npu.attn_window, n)
        #: Words of one split head's partial (or reduced) score rows, every sample's.
        self.score_slot = samples * seq * self.prw
        self.ch = [_Chip(c, Assembler(), Allocator(npu, transfer_bank=transfer_bank))
                   for c in range(self.chips)]
        cfg = self.cfg
        d = cfg.d_model
        # Output columns of each projection on each destination chip (-1: padding). QKV's
        # are those of _qlinear's [Q | K | V | Q' | K'] (RoPE: the rotated projections, which
        # land with the Q and K columns they rotate, whatever chip holds a lane's partner).
        self.dest = {"qkv": [], "o": [], "ffn1": [], "ffn2": []}
        dkv = cfg.d_kv

        def lanes(pieces, at):
            return [at + x for p in pieces for x in range(p.lo, p.hi)]

        def words(cols):
            """``cols`` padded with -1 to whole words."""
            return cols + [-1] * (pad_to(len(cols), n) - len(cols))
        for c in range(self.chips):
            # Pieces packed (one after another, sharing words); under RoPE the rotated
            # projections from the first word boundary after V (the vector unit reads rows
            # from a word's first lane).
            qs, kvs = plan.pieces[c], plan.kv_pieces[c]
            q = lanes(qs, 0) + lanes(kvs, d) + lanes(kvs, d + dkv)
            if cfg.rope:
                q = words(q) + lanes(qs, d + 2 * dkv) + lanes(kvs, 2 * d + 2 * dkv)
            self.dest["qkv"].append(words(q))
            lo, hi = plan.cols[c]
            self.dest["o"].append(list(range(lo, hi)) + [-1] * (pad_to(hi - lo, n) - hi + lo))
            self.dest["ffn2"].append(self.dest["o"][c])
            flo, fhi = plan.ffn[c]
            self.dest["ffn1"].append(list(range(flo, fhi)) +
                                     [-1] * (pad_to(fhi - flo, n) - fhi + flo))
        if cfg.ffn == "gated":
            # The gate has FFN1's columns on every chip (the product is column-wise).
            self.dest["gate"] = self.dest["ffn1"]
        # Input rows of each projection's weights on each chip (-1: zero rows).
        self.inputs = {"qkv": [], "o": [], "ffn1": [], "ffn2": []}
        for c in range(self.chips):
            self.inputs["qkv"].append(self.dest["o"][c])
            self.inputs["ffn1"].append(self.dest["o"][c])
            self.inputs["ffn2"].append(self.dest["ffn1"][c])
            if cfg.ffn == "gated":
                self.inputs.setdefault("gate", []).append(self.dest["o"][c])
            self.inputs["o"].append(words(lanes(plan.pieces[c], 0)))
        #: The projections every layer has (others: :meth:`add_projection`).
        self.layer_projections = tuple(self.dest)
        self.red = self._reductions(self.rows)

    def _reductions(self, rows: int) -> dict:
        """Every projection's :class:`Reduction` of ``rows`` rows (none on one chip). The
        weights' column order does not depend on the rows, so views of other row counts
        (:meth:`view`) use the same weights."""
        if self.chips == 1:
            return {}
        return {name: Reduction(widths=[len(x) for x in dest], rows=rows, size=self.n,
                                link_bytes=self.link, mode=self.reduce)
                for name, dest in self.dest.items()}

    def add_projection(self, name: str, dest: list, inputs: list, *, place):
        """A projection outside the layers (generation's LM head): ``dest[c]`` chip c's output
        columns (-1: padding), ``inputs[c]`` its input rows, reduced like the layers' (before
        :meth:`activations`, which sizes the partial sums' buffers); ``place(c)`` gives the
        ``QLinear`` whose columns and rows they index (called only with contents)."""
        self.dest[name], self.inputs[name] = dest, inputs
        self.red = self._reductions(self.rows)
        for ch in self.ch:
            ch.extra[name] = self._place(ch, None, name, ql=place)

    def view(self, *, rows: int, seq: int, samples: int, sample_rows: int) -> _Compiler:
        """This compiler emitting over ``rows`` rows of the same tensors (a multiple of N, at
        most the rows they were allocated for): ``samples`` samples of ``seq`` queries, sample
        s's from row ``s * sample_rows``. The chips' programs, allocators and weights are
        shared; each chip's row-wise tensors are views of their first ``rows`` rows (the
        caller may replace them, e.g. "qkv" by a KV cache's rows)."""
        if rows % self.n or rows > self.rows:
            raise AssertionError(f"a view of {rows} rows of tensors of {self.rows}")
        v = copy.copy(self)
        v.rows, v.seq, v.nseq, v.sample_rows = rows, seq, samples, sample_rows
        v.seq_pad = pad_to(seq, self.n)
        v.red = self._reductions(rows)
        v.__dict__.pop("sched", None)

        def cut(name, t):
            return dataclasses.replace(t, rows=rows) if name in _ROW_WISE else t
        v.ch = [dataclasses.replace(ch, t={k: cut(k, t) for k, t in ch.t.items()})
                for ch in self.ch]
        return v

    @functools.cached_property
    def sched(self):
        """The attention's schedule (emitting only: a layout needs none)."""
        return al_.plan_schedule(seq=self.seq, window=self.cfg.window, causal=self.cfg.causal,
                                 ring=self.npu.attn_window)

    # --- weights ------------------------------------------------------------------------------
    def _qlinear(self, layer, name) -> QLinear:
        if name != "qkv":
            return getattr(layer, name)
        parts = (layer.q, layer.k, layer.v)
        if self.cfg.rope:
            parts += (layer.rope.qr, layer.rope.kr)
        return QLinear(np.concatenate([x.w for x in parts], axis=1),
                       np.concatenate([x.bias for x in parts]),
                       np.concatenate([x.mult for x in parts]),
                       np.concatenate([x.shift for x in parts]), OutMode.INT8)

    def _place(self, ch: _Chip, i: int | None, name: str, ql=None):
        """Chip ``ch``'s weights of projection ``name`` of layer ``i``: its input rows, every
        destination's columns (in the reduction's order), the biases on chip 0 only; and the
        per-channel requantisation of its own columns. ``i`` None: a projection outside the
        layers, ``ql(c)`` its ``QLinear``."""
        n = self.n
        rows = np.asarray(self.inputs[name][ch.c], np.int64)
        direct = self.chips == 1
        cols = np.asarray(self.dest[name][0], np.int64) if direct else \
            self.red[name].columns(self.dest[name])
        p = name if i is None else f"layers.{i}.{name}"
        if not self.contents:
            # The planner's shapes-only compile: the same blocks, without their contents.
            blocks = cdiv(len(cols), n)
            wt = ch.al.alloc_block(p + ".w", len(rows) * blocks, "weights", low=True)
            pt = ch.al.alloc_block(p + ".p", PARAM_WORDS * blocks, "weights")
            req = None if direct else ch.al.alloc_block(
                p + ".requant", row_words(len(self.dest[name][ch.c]), 4, n), "weights")
            return wt, pt, req
        ql = ql(ch.c) if i is None else self._qlinear(self.qm.layers[i], name)
        w = np.zeros((len(rows), len(cols)), np.int64)
        rk, ck = rows >= 0, cols >= 0
        w[np.ix_(rk, ck)] = ql.w[np.ix_(rows[rk], cols[ck])]
        bias = np.zeros(len(cols), np.int64)
        mult = np.zeros(len(cols), np.int64)
        shift = np.ones(len(cols), np.int64)
        if ch.c == 0:
            bias[ck] = ql.bias[cols[ck]]
        if direct:
            mult[ck], shift[ck] = ql.mult[cols[ck]], ql.shift[cols[ck]]
        wt = ch.al.alloc_words(p + ".w", pack_weight_blocks(w, n), "weights", low=True)
        pt = ch.al.alloc_words(p + ".p", pack_params(bias, mult, shift, n), "weights")
        req = None
        if not direct:
            own = np.asarray(self.dest[name][ch.c], np.int64)
            m = np.zeros(len(own), np.int64)
            s = np.ones(len(own), np.int64)
            m[own >= 0], s[own >= 0] = ql.mult[own[own >= 0]], ql.shift[own[own >= 0]]
            req = ch.al.alloc_words(p + ".requant", pack_rows(pack_requant(m, s)[None, :], 4, n),
                                    "weights")
        return wt, pt, req

    # --- RoPE ---------------------------------------------------------------------------------
    def _rope_lanes(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """The lane within its head of every column of chip c's ``[Q | K]`` layout (-1:
        padding), and which columns are Q's."""
        dh = self.cfg.d_head
        lanes, is_q = [], []
        for pieces, q in ((self.plan.pieces[c], True), (self.plan.kv_pieces[c], False)):
            for p in pieces:
                first = p.lo % dh
                lanes += list(range(first, first + p.hi - p.lo)) + [-1] * (p.width - p.hi + p.lo)
                is_q += [q] * p.width
        return np.asarray(lanes, np.int64), np.asarray(is_q)

    def _rope_tables(self, ch: _Chip):
        """Chip ``ch``'s RoPE tables ``C`` and ``S`` as B operands over its ``[Q | K]`` lanes
        (``vl.Tiled``): a row per position (:attr:`rope_positions` padded to whole blocks,
        by default the sequence's ``seq_pad`` rows, read again for every sample) of the lanes
        of one piece repeated for every piece when all of them hold the same lanes (whole
        heads), else of the whole row (a split head's pieces hold parts of a head)."""
        n, positions = self.n, self.rope_positions
        seq_pad = pad_to(positions, n)
        lanes, _ = self._rope_lanes(ch.c)
        first = self.plan.pieces[ch.c][0].width
        repeat = len(lanes) // first
        unit = lanes[:first]
        if first % n or len(lanes) % first or not np.array_equal(np.tile(unit, repeat), lanes):
            unit, repeat = lanes, 1
        rw = row_words(len(unit), 1, n)
        out = []
        for k, name in enumerate(("cos", "sin")):
            if not self.contents:
                t = ch.al.alloc_block(f"rope.{name}", seq_pad * rw, "weights")
            else:
                table = rope_tables(self.cfg.d_head, self.cfg.rope_theta,
                                    np.arange(positions))[k]
                rows = np.zeros((seq_pad, len(unit)), np.int64)
                rows[:positions, unit >= 0] = table[:, unit[unit >= 0]]
                t = ch.al.alloc_words(f"rope.{name}", pack_rows(rows, 1, n), "weights")
            out.append(vl.Tiled(t.base, seq_pad, rw, 1, repeat))
        return tuple(out)

    def _rope_params(self, ch: _Chip, i: int) -> Tensor:
        """Per-lane ``(mult, shift)`` of layer ``i``'s RoPE REQUANT over chip ``ch``'s
        ``[Q | K]`` lanes (Q's and K's their own; the padding 0)."""
        lanes, is_q = self._rope_lanes(ch.c)
        name = f"layers.{i}.rope.requant"
        if not self.contents:
            return ch.al.alloc_block(name, row_words(len(lanes), 4, self.n), "weights")
        r = self.qm.layers[i].rope
        mult, shift = np.zeros(len(lanes), np.int64), np.ones(len(lanes), np.int64)
        for mask, (m, sh) in ((is_q, r.q_req), (~is_q, r.k_req)):
            mult[mask & (lanes >= 0)], shift[mask & (lanes >= 0)] = m, sh
        return ch.al.alloc_words(name, pack_rows(pack_requant(mult, shift)[None, :], 4, self.n),
                                 "weights")

    def place(self):
        cfg, n = self.cfg, self.n
        for ch in self.ch:
            lo, hi = self.plan.cols[ch.c]
            if cfg.rope:
                ch.rope = self._rope_tables(ch)
            for i in range(cfg.n_layers):
                L = self.qm.layers[i]
                lw = {name: self._place(ch, i, name) for name in self.layer_projections}
                if cfg.rope:
                    lw["rope_req"] = self._rope_params(ch, i)
                if not self.contents:
                    for k in (1, 2):
                        lw[f"ln{k}"] = ch.al.alloc_block(f"layers.{i}.ln{k}.gamma_beta",
                                                         row_words(hi - lo, 4, n), "weights")
                    lw["lut"] = ch.al.alloc_block(f"layers.{i}.lut",
                                                  row_words(LUT_ENTRIES, 1, n), "weights")
                    ch.layers.append(lw)
                    continue
                for k, ln in ((1, L.ln1), (2, L.ln2)):
                    gb = pack_gamma_beta(ln.gamma[lo:hi], ln.beta[lo:hi])
                    lw[f"ln{k}"] = ch.al.alloc_words(f"layers.{i}.ln{k}.gamma_beta",
                                                     pack_rows(gb[None, :], 4, n), "weights")
                lw["lut"] = ch.al.alloc_words(f"layers.{i}.lut",
                                              pack_rows(L.lut[None, :], 1, n), "weights")
                ch.layers.append(lw)

    # --- activations --------------------------------------------------------------------------
    def activations(self, *, qkv: bool = True):
        """Every chip's working tensors for :attr:`rows` rows; ``qkv=False``: no "qkv" (the
        caller points it at its own rows, e.g. a KV cache's: :meth:`view`)."""
        n, rows, plan = self.n, self.rows, self.plan
        rec = stats_words(n)
        for ch in self.ch:
            c, al, t = ch.c, ch.al, ch.t
            wpad = pad_to(plan.width(c), n)
            t["x"] = al.alloc("x", rows, wpad, 2, "activations")
            t["h"] = al.alloc("h", rows, wpad, 1, "activations")
            if self.cfg.norm == "post":
                t["x8"] = al.alloc("x8", rows, wpad, 1, "activations")
            if qkv:
                t["qkv"] = al.alloc("qkv", rows, len(self.dest["qkv"][c]), 1, "kv_cache")
            if self.cfg.rope:
                # The int16 q C and q' S over the [Q | K] lanes.
                for k in (1, 2):
                    t[f"rope{k}"] = al.alloc(f"rope.t{k}", rows,
                                             plan.q_width(c) + plan.kv_width(c), 2,
                                             "activations")
            t["o"] = al.alloc("o", rows, plan.q_width(c), 1, "activations")
            t["a"] = al.alloc("a", rows, wpad, 2, "activations")
            t["f"] = al.alloc("f", rows, pad_to(plan.ffn_width(c), n), 1, "activations")
            if self.cfg.ffn == "gated":
                t["g"] = al.alloc("g", rows, pad_to(plan.ffn_width(c), n), 1, "activations")
            if self.chips == 1:
                t["stats"] = al.alloc("stats", rows * rec, n, 1, "activations", row_words_=1)
                continue
            # The buffers that COLL launches read and write while the matmul, attention or
            # vector unit runs go in the transfer banks: in the top bank (the matmul's A, the
            # vector unit's operands) the collective's ports, which the compute units' outrank,
            # would wait for them. The reduce-scatter's row blocks alternate between two
            # banks ("p" even blocks, "p1" odd ones), so that the matmul writing block mb + 1
            # and the requantisation reading block mb - 1 leave block mb's bank to its COLLs.
            words = max(r.words if r.mode == "all_reduce" else
                        cdiv(r.mb, 2) * r.block_words for r in self.red.values())
            odd = max((r.mb // 2 * r.block_words for r in self.red.values()
                       if r.mode == "reduce_scatter"), default=0)
            t["p"] = al.alloc("p", words, n, 1, "activations", row_words_=1, transfer=True,
                              fallback=True)
            if odd:
                t["p1"] = al.alloc("p1", odd, n, 1, "activations", row_words_=1, spare=True,
                                   fallback=True)
            # LayerNorm records as int64 elements, padded to whole all-reduce units.
            unit = self.chips * elements_per_word(word_bytes(self.link, self.n), 64)
            elems = pad_to(rows * rec * n // 8, unit)
            t["stats"] = al.alloc("stats", elems * 8 // n, n, 1, "activations", row_words_=1)
            if plan.split_heads:
                # Every split head's partial rows (a slot each: samples x queries rows of
                # ``prw`` words), zero in the slots of heads the chip holds none of (the image
                # sets them, and only the partial passes of the chip's own heads write here);
                # the all-reduce writes the reduced rows to "scores".
                elems = pad_to(len(plan.split_heads) * self.score_slot * n // 4,
                               self.chips * self.red["o"].epw)
                t["scores_in"] = al.alloc("scores_in", elems * 4 // n, n, 1, "activations",
                                          row_words_=1, spare=True, fallback=True)
                if self.contents:
                    al.images[t["scores_in"].base] = np.zeros((t["scores_in"].words, n),
                                                              np.uint8)
                t["scores"] = al.alloc("scores", elems * 4 // n, n, 1, "activations",
                                       row_words_=1, transfer=True, fallback=True)

    # --- collectives --------------------------------------------------------------------------
    def collective(self, group, chunks, *, width, what, kind="all_reduce", wait=True,
                   ident=None):
        """Emit one logical collective over ``group`` (``(first, count)``) on its members:
        ``chunks(ch)`` gives that chip's ``(base, elements)`` or ``(base, elements, out_base)``
        per COLL; ``wait``: a ``WAIT`` for the last one. ``ident``: continue the collective of
        that id (a later part of it, for the report). Returns the collective's id. Every
        collective of the compiler is over all chips (module docstring)."""
        first, count = group
        if count != self.chips:
            raise AssertionError("hidden's collectives are over all chips")
        members = [(first + k) % self.chips for k in range(count)]
        per_chip = {m: chunks(self.ch[m]) for m in members}
        count_chunks = len(per_chip[members[0]])
        if ident is None:
            ident = next(self._ids)
        for k in range(count_chunks):
            length = per_chip[members[0]][k][1]
            req = CollectiveRequest(kind, "sum", width, length, self.chips, first=first,
                                    count=count)
            for m in members:
                base, _, *out = per_chip[m][k]
                cl.emit(self.ch[m].asm, cl.coll_launch_natural(
                    req, m, base=base, out_base=out[0] if out else None, size=self.n,
                    link_bytes=self.link))
            self.comms.append({"kind": kind, "op": "sum", "width": width, "elements": length,
                               "bytes": length * width // 8, "group": [first, count],
                               "layer": self.layer, "what": what, "collective": ident})
        if wait:
            for m in members:
                self.ch[m].asm.wait(Unit.COLL)
        return ident

    def _flat(self, tensor: Tensor, elements: int, count: int, width: int):
        """Chunks of a natural-order all-reduce over ``elements`` from ``tensor.base``."""
        unit = count * elements_per_word(word_bytes(self.link, self.n), width)
        chunk = unit * COLL_FIFO_WORDS
        return [(tensor.base + at * width // 8 // self.n, min(chunk, elements - at))
                for at in range(0, elements, chunk)]

    # --- the block's phases -------------------------------------------------------------------
    def _rows(self, t: Tensor) -> Rows:
        return Rows(t.base, t.rows, t.row_words, t.eb)

    def _weights(self, ch: _Chip, name: str):
        """Chip ``ch``'s ``(weights, params, requant)`` of projection ``name``: the current
        layer's, or one outside the layers (:meth:`add_projection`)."""
        if name in ch.extra:
            return ch.extra[name]
        return ch.layers[self.layer][name]

    def layernorm(self, which: int, q: str | None, y: str | None):
        """LayerNorm ``which`` (1 or 2) of every chip's slice of ``x`` into ``q`` (int8) /
        ``y`` (int16) (:meth:`norm`)."""
        i = self.layer
        self.norm(getattr(self.qm.layers[i], f"ln{which}"),
                  lambda ch: ch.layers[i][f"ln{which}"], lambda ch: ch.t["x"],
                  lambda ch: ch.t[q] if q else None, lambda ch: ch.t[y] if y else None,
                  tag=("ln", i, which), what=f"LN{which} statistics")

    def norm(self, ln, gamma_beta, x, q, y, *, tag, what: str):
        """The LayerNorm ``ln`` of every chip's slice of the rows ``x(ch)`` (a Tensor): LN_STATS,
        an int64 all-reduce of the records (those rows' only) over all chips, LN_APPLY with
        ``gamma_beta(ch)`` into ``q(ch)`` (int8) / ``y(ch)`` (int16) (None: not written);
        RMSNorm: the same with RMS_APPLY (which ignores the records' ``sum x``)."""
        n, d = self.n, self.cfg.d_model
        unit = self.chips * elements_per_word(word_bytes(self.link, n), 64)
        for ch in self.ch:
            vl.emit(ch.asm, vl.ln_stats_launch(size=n, length=self.plan.width(ch.c),
                                               x=self._rows(x(ch)),
                                               stats_base=ch.t["stats"].base))
            ch.asm.wait(Unit.VEC)
        if self.chips > 1:
            self.collective((0, self.chips),
                            lambda ch: self._flat(ch.t["stats"], pad_to(
                                x(ch).rows * stats_words(n) * n // 8, unit), self.chips, 64),
                            width=64, what=what)
        for ch in self.ch:
            qt, yt = q(ch), y(ch)
            vl.emit(ch.asm, vl.ln_apply_launch(
                size=n, length=self.plan.width(ch.c), n=d, x=self._rows(x(ch)),
                gamma_beta_base=gamma_beta(ch).base, stats_base=ch.t["stats"].base,
                q=self._rows(qt) if qt is not None else None,
                y=self._rows(yt) if yt is not None else None,
                gshift=ln.gshift, mult=ln.mult, shift=ln.shift, rms=self.cfg.rmsnorm), tag)
            ch.asm.wait(Unit.VEC)

    def project(self, name: str, src: str, dst: str, *, lut: bool = False):
        """Projection ``name`` of every chip's ``src`` into its columns of ``dst``: a RAW matmul
        into the partial sums, their reduction and the per-channel requantisation (one chip:
        the matmul requantises itself). ``lut``: load the activation table meanwhile."""
        n, i = self.n, self.layer
        direct = self.chips == 1
        red = self.red.get(name)
        if red is not None and red.mode == "reduce_scatter":
            self._project_blocks(name, src, dst, lut=lut)
            return
        for ch in self.ch:
            wt, pt, _ = self._weights(ch, name)
            a, out = ch.t[src], ch.t[dst]
            k = len(self.inputs[name][ch.c])
            if direct:
                mode = OutMode.INT16 if out.eb == 2 else OutMode.INT8
                launch = matmul_launch(size=n, m=self.rows, k=k, n=len(self.dest[name][0]),
                                       a_base=a.base, a_row_words=a.row_words, b_base=wt.base,
                                       p_base=pt.base, c_base=out.base,
                                       c_row_words=out.row_words, mode=mode)
            else:
                p = ch.t["p"]
                launch = matmul_launch(size=n, m=self.rows, k=k, n=red.nb * n, a_base=a.base,
                                       a_row_words=a.row_words, b_base=wt.base, p_base=pt.base,
                                       c_base=p.base, c_row_words=red.nb * 4, mode=OutMode.RAW)
                launch = dataclasses.replace(launch, wr0=red.c_desc(p.base))
            emit_matmul(ch.asm, launch)
            if lut:
                vl.emit(ch.asm, vl.load_lut_launch(size=n, base=ch.layers[i]["lut"].base))
            ch.asm.wait(Unit.MATMUL | (Unit.VEC if lut else 0))
        if direct:
            return
        kind = "reduce_scatter" if red.mode == "reduce_scatter" else "all_reduce"
        self.collective((0, self.chips), lambda ch: red.chunks(ch.t["p"].base), width=32,
                        what=f"{name.upper()} projection", kind=kind)
        for ch in self.ch:
            for launch in red.requant_launches(ch.c, ch.t["p"].base,
                                               self._weights(ch, name)[2].base, ch.t[dst]):
                vl.emit(ch.asm, launch)
            ch.asm.wait(Unit.VEC)

    def _project_blocks(self, name: str, src: str, dst: str, *, lut: bool):
        """The reduce-scatter projection, pipelined by row blocks of N rows: while the
        reduce-scatters of block mb run, the matmul computes block mb + 1 and the vector unit
        requantises block mb - 1. A COLL launch waits for the previous COLL to finish and a
        MATMUL launch for the previous MATMUL, so each block's sums are complete before its
        COLL and reduced before its REQUANT without a WAIT on the unit."""
        n, i, red = self.n, self.layer, self.red[name]
        tile = 4 * n

        def base(ch, mb):
            """Where the layout of :class:`Reduction` starts for block mb to be in its bank's
            buffer (block mb at ``base + mb * block_words``)."""
            buf = ch.t["p"] if mb % 2 == 0 else ch.t["p1"]
            return buf.base + (mb // 2 - mb) * red.block_words

        def matmul(ch, mb):
            wt, pt, _ = self._weights(ch, name)
            a = ch.t[src]
            launch = matmul_launch(size=n, m=n, k=len(self.inputs[name][ch.c]), n=red.nb * n,
                                   a_base=a.base + mb * n * a.row_words,
                                   a_row_words=a.row_words, b_base=wt.base, p_base=pt.base,
                                   c_base=base(ch, mb) + mb * red.block_words,
                                   c_row_words=red.nb * 4, mode=OutMode.RAW)
            wr0 = Desc(base(ch, mb) + mb * red.block_words, (4, n, red.nb, 1), (1, 4, tile, 0))
            emit_matmul(ch.asm, dataclasses.replace(launch, wr0=wr0))

        def requant(ch, mb):
            for launch in red.requant_launches(ch.c, base(ch, mb),
                                               self._weights(ch, name)[2].base, ch.t[dst],
                                               mb=mb):
                vl.emit(ch.asm, launch)

        for ch in self.ch:
            matmul(ch, 0)
            if lut:
                vl.emit(ch.asm, vl.load_lut_launch(size=n, base=ch.layers[i]["lut"].base))
            ch.asm.wait(Unit.MATMUL | (Unit.VEC if lut else 0))
        ident = None
        per_block = len(red.groups)
        for mb in range(red.mb):
            for ch in self.ch:
                if mb + 1 < red.mb:
                    matmul(ch, mb + 1)

            def chunks(ch, mb=mb):
                return red.chunks(base(ch, mb))[mb * per_block:(mb + 1) * per_block]

            ident = self.collective((0, self.chips), chunks, width=32,
                                    what=f"{name.upper()} projection", kind="reduce_scatter",
                                    wait=False, ident=ident)
            for ch in self.ch:
                if mb:
                    requant(ch, mb - 1)
                if mb + 2 == red.mb or red.mb == 1:
                    # The last block's COLL reads what the last MATMUL writes.
                    ch.asm.wait(Unit.MATMUL)
        for ch in self.ch:
            ch.asm.wait(Unit.COLL)
            requant(ch, red.mb - 1)
            ch.asm.wait(Unit.VEC)

    def add(self):
        """``x += a`` on every chip's slice."""
        for ch in self.ch:
            vl.emit(ch.asm, vl.add_launch(size=self.n, length=self.plan.width(ch.c),
                                          a=self._rows(ch.t["x"]), b=self._rows(ch.t["a"]),
                                          out=self._rows(ch.t["x"])))
            ch.asm.wait(Unit.VEC)

    def lut(self, t: str = "f"):
        for ch in self.ch:
            vl.emit(ch.asm, vl.lut_launch(size=self.n, length=self.plan.ffn_width(ch.c),
                                          a=self._rows(ch.t[t]), out=self._rows(ch.t[t])))
            ch.asm.wait(Unit.VEC)

    def ffn_hidden(self, src: str):
        """The FFN hidden "f" from ``src``: FFN1 and the LUT, or a gated FFN's gate
        projection, the LUT on it, FFN1 (up) and MUL of the two into "f" (column-wise: every
        chip its own columns, no collective beyond the projections')."""
        if self.cfg.ffn != "gated":
            self.project("ffn1", src, "f", lut=True)
            self.lut()
            return
        L = self.qm.layers[self.layer]
        self.project("gate", src, "g", lut=True)
        self.lut("g")
        self.project("ffn1", src, "f")
        for ch in self.ch:
            f, g = self._rows(ch.t["f"]), self._rows(ch.t["g"])
            vl.emit(ch.asm, vl.mul_launch(size=self.n, length=self.plan.ffn_width(ch.c), a=f,
                                          b=g, out=f, mult=L.mul_mult, shift=L.mul_shift),
                    ("mul", self.layer))
            ch.asm.wait(Unit.VEC)

    def spans(self, ch: _Chip, s: int) -> Span:
        """Sample ``s``'s attention operands on chip ``ch``: :attr:`span_of` when set (a
        decode's cache), else its rows of "qkv" and "o", every query over every key."""
        if self.span_of is not None:
            return self.span_of(ch, s)
        qkv, o = ch.t["qkv"], ch.t["o"]
        base = qkv.base + s * self.sample_rows * qkv.row_words
        q, kv = self.plan.q_width(ch.c), self.plan.kv_width(ch.c)
        return Span(base, base, base, qkv.row_words,
                    o.base + s * self.sample_rows * o.row_words, self.seq, self.seq,
                    k_lane=q, v_lane=q + kv)

    def attention(self):
        """Every head piece of every chip (each sample's operands: :meth:`spans`): the split
        pieces' pass 1 into their slots of "scores_in", one all-reduce of every split head's
        partial rows over all chips, the whole heads while it runs, then the split pieces'
        pass 2 from "scores"."""
        n, L, cfg = self.n, self.qm.layers[self.layer], self.cfg
        sched, seq = self.sched, self.seq
        W = self.npu.attn_window
        common = {"size": n, "bidirectional": not cfg.causal,
                  "interleaved": sched.interleaved, "halo": sched.halo}
        slot = {h: k for k, h in enumerate(self.plan.split_heads)}
        tag = ("attn", self.layer)

        def rows(h, s):
            """Offset of head h's score rows of sample s in "scores_in" and "scores" (a slot
            per split head, the same in every view: a chip's partial passes write only its
            own heads' slots)."""
            return slot[h] * self.score_slot + s * seq * self.prw

        def where(sp: Span) -> dict:
            return {"queries": sp.queries, "keys": sp.keys, "q_pos": sp.q_pos}

        split = {ch.c: [p for p in self.plan.pieces[ch.c] if p.split] for ch in self.ch}
        if self.plan.split_heads:
            for ch in self.ch:
                for piece in split[ch.c]:
                    for s in range(self.nseq):
                        sp = self.spans(ch, s)
                        al_.emit(ch.asm, al_.partial_launch(
                            window=W, d_head=piece.width, q_base=sp.q, k_base=sp.k,
                            p_base=ch.t["scores_in"].base + rows(piece.head, s),
                            q_row_words=sp.row_words, k_row_words=sp.row_words, col=piece.off,
                            k_col=sp.k_lane + piece.kv_off, **where(sp), **common), tag)
                ch.asm.wait(Unit.ATTN)

            def chunks(ch):
                src, dst = ch.t["scores_in"], ch.t["scores"]
                return [(base, length, base - src.base + dst.base) for base, length in
                        self._flat(src, src.words * n // 4, self.chips, 32)]

            heads = ", ".join(str(h) for h in self.plan.split_heads)
            self.collective((0, self.chips), chunks, width=32,
                            what=f"attention scores, head{'s' if len(slot) > 1 else ''} "
                                 f"{heads}", wait=False)
        for ch in self.ch:
            o = ch.t["o"]
            for piece in self.plan.pieces[ch.c]:
                if piece.split:
                    continue
                for s in range(self.nseq):
                    sp = self.spans(ch, s)
                    rw = sp.row_words
                    al_.emit(ch.asm, al_.attention_launch(
                        d_head=piece.width, q_base=sp.q, k_base=sp.k, v_base=sp.v,
                        o_base=sp.o, q_row_words=rw, k_row_words=rw, v_row_words=rw,
                        o_row_words=o.row_words, col=piece.off, k_col=sp.k_lane + piece.kv_off,
                        v_col=sp.v_lane + piece.kv_off, k_pos=0,
                        window=sched.window, score_mult=L.score_mult,
                        score_shift=L.score_shift, out_mult=L.out_mult,
                        out_shift=L.out_shift, **where(sp), **common), tag)
            if not split[ch.c]:
                # The next projection's COLL waits for this one's on its own.
                ch.asm.wait(Unit.ATTN)
                continue
            ch.asm.wait(Unit.COLL)
            for piece in split[ch.c]:
                for s in range(self.nseq):
                    sp = self.spans(ch, s)
                    al_.emit(ch.asm, al_.reduced_launch(
                        window=W, d_head=piece.width, v_base=sp.v,
                        r_base=ch.t["scores"].base + rows(piece.head, s),
                        o_base=sp.o, v_row_words=sp.row_words,
                        o_row_words=o.row_words, col=piece.off, v_col=sp.v_lane + piece.kv_off,
                        window_cut=sched.window,
                        score_mult=L.score_mult, score_shift=L.score_shift,
                        out_mult=L.out_mult, out_shift=L.out_shift, **where(sp), **common),
                        tag)
            ch.asm.wait(Unit.ATTN)

    def rope(self):
        """RoPE of every chip's Q and K lanes in place (``sim.golden.rope``): MUL by C, MUL of
        the rotated projections Q', K' by S, ADD, per-lane REQUANT. Lane-wise, so a split
        head's chips each rotate their own lanes (their Q' lanes came with the QKV
        reduction), and the partial scores of the rotated lanes sum to the rotated head's.
        The rows read the tables from :attr:`rope_at` = ``(first row, period)``."""
        if not self.cfg.rope:
            return
        n, i = self.n, self.layer
        row0, period = self.rope_at
        for ch in self.ch:
            qkv, plan = ch.t["qkv"], self.plan
            qw, kw = plan.q_width(ch.c), plan.kv_width(ch.c)
            lanes = qw + kw
            qk = Rows(qkv.base, self.rows, qkv.row_words, 1)
            qkr = Rows(qkv.base + pad_to(qw + 2 * kw, n) // n, self.rows, qkv.row_words, 1)
            t1, t2 = self._rows(ch.t["rope1"]), self._rows(ch.t["rope2"])
            cos, sin = (dataclasses.replace(t, base=t.base + row0 * t.row_words, period=period)
                        for t in ch.rope)
            for src, table, out in ((qk, cos, t1), (qkr, sin, t2)):
                vl.emit(ch.asm, vl.mul_launch(size=n, length=lanes, a=src, b=table, out=out,
                                              mult=ROPE_MUL[0], shift=ROPE_MUL[1]),
                        ("rope", i))
                ch.asm.wait(Unit.VEC)
            vl.emit(ch.asm, vl.add_launch(size=n, length=lanes, a=t1, b=t2, out=t1))
            ch.asm.wait(Unit.VEC)
            vl.emit(ch.asm, vl.requant_launch(size=n, length=lanes, a=t1, out=qk,
                                              params_base=ch.layers[i]["rope_req"].base,
                                              keep=lanes % n != 0))
            ch.asm.wait(Unit.VEC)

    def block(self, i: int):
        self.layer = i
        if self.cfg.norm == "pre":
            self.layernorm(1, "h", None)
            self.project("qkv", "h", "qkv")
            self.rope()
            self.attention()
            self.project("o", "o", "a")
            self.add()
            self.layernorm(2, "h", None)
            self.ffn_hidden("h")
            self.project("ffn2", "f", "a")
            self.add()
        else:
            self.project("qkv", "x8", "qkv")
            self.rope()
            self.attention()
            self.project("o", "o", "a")
            self.add()
            self.layernorm(1, "h", "x")
            self.ffn_hidden("h")
            self.project("ffn2", "f", "a")
            self.add()
            self.layernorm(2, "x8", "x")


def compile_hidden(npu: NpuConfig, qm: QModel, chips: int, *, seq: int | None = None,
                   samples: int = 1, widths=None, ffn_widths=None,
                   reduce: str = "reduce_scatter", contents: bool = True,
                   check: bool = True, emit: bool = True) -> SystemProgram:
    """Programs for ``chips`` chips that split d_model (and d_ff) of every layer of ``qm``
    (``widths``/``ffn_widths``: explicit columns per chip; ``reduce``: how the projections'
    partial sums are reduced, ``REDUCE_MODES``).

    ``contents=False`` places the weights without their contents (``qm`` needs only its
    scales: the planner's shapes-only compile); ``check=False`` skips the compatibility,
    capacity and program-size checks (the planner names every violated limit itself) but
    the shards' own (:func:`hidden_plan`); ``emit=False`` lays out the scratchpads and
    stops (empty programs: the planner's capacity)."""
    cfg = qm.cfg
    if getattr(qm, "quant", "int8") != "int8":
        raise ValueError(f"--strategy hidden does not compile quant={qm.quant!r} yet (only "
                         "int8); use --quant int8")
    plan = check_hidden(npu, cfg, chips, widths=widths, ffn_widths=ffn_widths) if check else \
        hidden_plan(npu, cfg, chips, widths=widths, ffn_widths=ffn_widths)
    if reduce not in REDUCE_MODES:
        raise ValueError(f"reduce must be one of {', '.join(REDUCE_MODES)}, not {reduce!r}")
    seq = cfg.seq_len if seq is None else seq

    def layout(transfer_bank):
        comp = _Compiler(npu, qm, plan, seq=seq, samples=samples, reduce=reduce,
                         contents=contents, transfer_bank=transfer_bank)
        comp.place()
        comp.activations()
        return comp
    comp = layout(True)
    if any(ch.al.overflows for ch in comp.ch) and \
            all(ch.al.next_word <= npu.sram_words for ch in comp.ch):
        # The regions overlap though the whole fits (the top bank full: tiny-llama on 3
        # chips): every buffer in the top region, as sequence and the grids do.
        comp = layout(False)
    for ch in comp.ch:
        if check:
            ch.al.check_capacity()
    if not emit:
        return SystemProgram(npu, cfg, "hidden", [ChipProgram(ch.c, ch.asm, ch.al)
                                                  for ch in comp.ch], seq, comp.seq_pad,
                             [], [], {}, [])
    if cfg.norm == "post":
        for ch in comp.ch:
            vl.emit(ch.asm, vl.requant_launch(size=comp.n, length=plan.width(ch.c),
                                              a=comp._rows(ch.t["x"]),
                                              out=comp._rows(ch.t["x8"]), mult=qm.in_mult,
                                              shift=qm.in_shift), ("input requant",))
            ch.asm.wait(Unit.VEC)
    for i in range(cfg.n_layers):
        comp.block(i)
    programs = []
    for ch in comp.ch:
        pieces = [(p.head, p.hi - p.lo) for p in plan.pieces[ch.c]]
        programs.append(finish(npu, ChipProgram(ch.c, ch.asm, ch.al, role={
            "layers": list(range(cfg.n_layers)), "columns": list(plan.cols[ch.c]),
            "heads": [h for h, _ in pieces], "head_lanes": [w for _, w in pieces],
            "ffn_columns": plan.ffn_width(ch.c)}), check=check))
    inputs = [[] for _ in range(samples)]
    outputs = []
    for s in range(samples):
        parts = []
        for ch in comp.ch:
            x = ch.t["x"]
            place = Placement(ch.c, x.base + s * comp.seq_pad * x.row_words, comp.seq_pad,
                              x.cols, x.row_words, col=plan.cols[ch.c][0],
                              width=plan.width(ch.c))
            inputs[s].append(place)
            parts.append(place)
        outputs.append(tuple(parts))
    meta = {"columns_per_chip": [plan.width(c) for c in range(chips)],
            "ffn_columns_per_chip": [plan.ffn_width(c) for c in range(chips)],
            "head_groups": [list(g) for g in plan.groups], "split_heads": plan.split_heads,
            "reduce": reduce if chips > 1 else None}
    return SystemProgram(npu, cfg, "hidden", programs, seq, comp.seq_pad, inputs, outputs, meta,
                         comp.comms)


def hidden_stats(prog: SystemProgram, comms: list[dict]) -> dict:
    """The report's ``hidden`` section from the compiled program and its collectives: the
    shards, and per layer the collectives, their COLL launches and bytes, with why there are
    that many."""
    meta = prog.meta
    layer = [c for c in comms if c.get("layer") == 0]
    colls: dict[int, list] = {}
    for c in layer:
        colls.setdefault(c["collective"], []).append(c)
    per_layer = [{"what": items[0]["what"], "kind": items[0]["kind"],
                  "width": items[0]["width"], "group": items[0]["group"],
                  "launches": len(items), "bytes": sum(c["bytes"] for c in items)}
                 for items in colls.values()]
    ln = sum(1 for c in per_layer if "statistics" in c["what"])
    proj = sum(1 for c in per_layer if "projection" in c["what"])
    heads = len(meta["split_heads"])
    scores = (f"; one all-reduce of the partial Q.K scores of the {heads} head"
              f"{'s' if heads > 1 else ''} split across chips (each chip's lanes give a partial "
              "dot product; every split head in one buffer, zero where a chip holds none of "
              "the head)") if heads else "; no head is split, so no score all-reduce"
    why = (f"{ln} int64 all-reduces of the LayerNorm statistics [sum x, sum x^2] per row; {proj} "
           f"{meta['reduce'] or 'no'} reductions of int32 partial projections (QKV, O, FFN1, "
           "FFN2: every input is sharded by columns, so each chip's X[:, cols] @ W[rows, :] is "
           f"a partial sum of the whole output){scores}. All over every chip, in the same "
           f"order. The seed's {SEED_COLLECTIVES} counted the LayerNorm and score all-reduces "
           "only.") if len(prog.chips) > 1 else "one chip: no collectives"
    return {"columns_per_chip": meta["columns_per_chip"],
            "ffn_columns_per_chip": meta["ffn_columns_per_chip"],
            "head_groups": meta["head_groups"], "split_heads": meta["split_heads"],
            "reduce": meta["reduce"], "collectives_per_layer": len(per_layer),
            "coll_launches_per_layer": sum(c["launches"] for c in per_layer),
            "bytes_per_layer": sum(c["bytes"] for c in per_layer), "per_layer": per_layer,
            "seed_estimate": SEED_COLLECTIVES, "why": why}
