"""Transformer blocks on one chip, for every strategy: weight placement and the block program.

Activations are padded to the array: the sequence to whole blocks of N tokens, rows (d_model,
d_ff) to whole words. Weights are not: a matmul's rows past the weight matrix's are zero beats
(``MM_B_ROWS``) and its last column block is stored packed (``MM_B_LAST``; :class:`Linear`).
Heads are packed (:class:`QkvLayout`): ``d_head`` lanes each, several to a word when narrower
than one, each ATTN reading and writing its own lanes. Tensors are token-major and hold ``nseq``
sequences one after another (``seq_pad`` rows each): matmuls run whole folds, LayerNorms,
element-wise ops and the row collectives one sequence's ``seq`` rows or several sequences' padded
rows (:meth:`BlockEmitter.valid_rows`), attention once per sequence and head. Per block (pre-norm)::

    VEC  LN1     x (int16)        -> h (int8)
    MM   QKV     h @ Wqkv         -> qkv (int8, packed heads)
    ATTN         per sequence and head: qkv -> o
    MM   O       o @ Wo           -> a (int16, residual scale)
    VEC  ADD     x + a            -> x
    VEC  LN2     x                -> h
    VEC  LOAD_LUT (overlaps the next matmul)
    MM   FFN1    h @ W1           -> f (int8)
    VEC  LUT     f                -> f
    MM   FFN2    f @ W2           -> a (int16)
    VEC  ADD     x + a            -> x

A gated FFN (``ffn = "gated"``, SwiGLU: FFN1 is the up matrix, the gate matrix has its shape
and columns, the LUT holds SiLU) replaces FFN1 and the LUT with::

    MM   GATE    h @ Wg           -> g (int8)
    VEC  LOAD_LUT (overlaps the gate matmul)
    MM   FFN1    h @ W1           -> f (int8, up)
    VEC  LUT     g                -> g (overlaps the up matmul)
    VEC  MUL     f * g            -> f (int8: requant(silu(gate) * up), per tensor)

With ``norm_kind = "rmsnorm"`` every LN is an RMS launch (the same streams and cycles, its
gamma/beta words with beta = 0). Post-norm reads an int8 copy of the residual (from the
previous LayerNorm, or a REQUANT at the first block a chip runs) and normalises after each
residual add, writing both the int16 residual and the int8 copy.

Under ``quant = "smooth16"`` (``sim.compiler.quantize``) the FFN hidden is int16 and FFN2 runs
as two int8 passes (``sim.golden.matmul.linear16``)::

    VEC  LOAD_LUT16 (the GELU16 knots; overlaps the FFN1 matmul)
    MM   FFN1    h @ W1           -> f16 (int16)
    VEC  GELU16  f16              -> hi = y >> 8, lo = y & 0xFF (int8 planes, over f16)
    MM   FFN2hi  hi @ W2          -> a (int16, (mult, shift - 8), no bias)
    VEC  ADD     x + a            -> x
    MM   FFN2lo  lo @ W2 + b2     -> a (int16, unsigned A)
    VEC  ADD     x + a            -> x

Under ``quant = "llm16"`` an MLP FFN is smooth16's and a gated FFN keeps its gate and up int8
and its hidden int16 (the exact product), split into planes by GELU16 with identity knots::

    MM   GATE    h @ Wg           -> g (int8)
    VEC  LOAD_LUT (overlaps the gate matmul)
    MM   FFN1    h @ W1           -> u (int8, up)
    VEC  LUT     g                -> g (overlaps the up matmul)
    VEC  LOAD_LUT16 (the identity knots)
    VEC  MUL     u * g            -> f16 (int16, exact: mult 2, shift 1)
    VEC  GELU16  f16              -> hi, lo (as above), then FFN2's two passes

and every block after the first starts with ``VEC REQUANT x -> x`` (int16 to int16, per tensor:
``L.res_req``, the previous block's residual scale to its own), on the rows this chip holds.

GELU16 writes its planes over the rows of f16 it reads: row r's hi plane over the first half of
row r (hi word j depends on f16 words 2j and 2j + 1, so it is written after they were read),
its lo plane over the second half of row r - 1 (read before row r began; row 0's goes to half a
row allocated below f16). Sharded, each pass's partial sums are all-reduced and requantised on
their own. Post-norm smooth16 makes the int8 inputs of QKV and FFN1 with a per-lane REQUANT of
the int16 LayerNorm output (the smoothing); each block makes its own, so the LayerNorms write
the int16 residual only.

A chip may hold a **shard** of a layer (:class:`Shard`): some heads (their Q/K/V columns and
the matching rows of Wo) and some FFN columns (of W1 and the gate, and the rows of W2: the
gated product is column-wise, so it needs no communication). Then O and FFN2 give
int32 partial sums (raw matmul output, the biases added on one chip only), an all-reduce SUM
over the chips of the shard's group adds them, wrapping modulo 2**32 like one chip's
accumulator would, and a per-channel REQUANT makes the int16 ``a``: the same integers as one
chip's matmul. A ``WAIT`` precedes each launch that reads what the previous one writes.

When the group's size divides the rows (and every chip's rows are whole engine words:
:meth:`BlockEmitter.row_split`), the group **splits the row-wise work** instead: a
reduce-scatter of the int32 partial sums leaves each chip the sums of its own rows, which it
alone requantises, adds to its rows of the residual and normalises; an all-gather of the int8
LayerNorm output gives every chip the whole input of the next matmul, and at the end of the
chip's layers an all-gather of the int16 residual makes it whole again (the output, or the
message to the next pipeline stage). The same integers as the all-reduce (the sums are the
same; every chip's rows are computed by the same ops), at about half the bytes on the ring
and a group's share of the vector work (the tiny model on 4 chips: 14,624 cycles instead of
22,104).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hw.spec import ModelConfig, NpuConfig
from hw.spec.collective import CollectiveRequest, elements_per_word, word_bytes
from hw.spec.formats import OutMode
from hw.spec.isa import COLL_FIFO_WORDS, Unit
from hw.spec.memory import (
    PARAM_WORDS,
    pack_params,
    pack_rows,
    pack_weight_blocks,
    row_words,
    weight_words,
)
from hw.spec.vector import GELU16_KNOTS, LUT_ENTRIES, pack_gamma_beta, pack_requant

from ..golden.rope import ROPE_MUL, rope_tables
from . import attention_launch as al_
from . import collective_launch as cl
from . import vector_launch as vl
from .alloc import Allocator, Tensor
from .assembler import Assembler
from .descriptors import emit_matmul, matmul_launches
from .quantize import QLinear, QModel

__all__ = ["Shard", "Linear", "LayerWeights", "Activations", "BlockEmitter", "QkvLayout", "cdiv",
           "pad_to"]


def cdiv(a, b):
    return -(-a // b)


def pad_to(x, n):
    return cdiv(x, n) * n


@dataclass(frozen=True)
class Shard:
    """What one chip holds of a layer.

    ``heads``: global head indices; ``ffn``: global d_ff columns; ``group``: ``(first, count,
    chips)`` of the chips that all-reduce the partial O and FFN2 sums (None: the chip holds the
    whole layer and no reduction runs); ``bias``: this chip adds the O and FFN2 biases.
    """

    heads: Sequence[int]
    ffn: Sequence[int]
    group: tuple[int, int, int] | None = None
    bias: bool = True

    @classmethod
    def whole(cls, cfg: ModelConfig) -> Shard:
        return cls(range(cfg.n_heads), range(cfg.d_ff))


@dataclass(frozen=True)
class Linear:
    """A matmul's weights on a chip: ``w``, the ``rows`` x ``cols`` int8 matrix stored
    unpadded (``hw.spec.memory.pack_weight_blocks(packed=True)``: the A operand's padding
    beats take zero B rows, ``MM_B_ROWS``; the last column block is packed, ``MM_B_LAST``),
    and ``p``, the per-column parameters (``PARAM_WORDS`` words per block of N columns)."""

    w: Tensor
    p: Tensor
    cols: int
    rows: int


@dataclass
class LayerWeights:
    """One layer's tensors on a chip (a :class:`Linear` per matmul)."""

    qkv: Linear
    o: Linear
    ffn1: Linear
    ffn2: Linear
    ln1: Tensor
    ln2: Tensor
    lut: Tensor | None               # the activation LUT (int8 FFN hidden) or the GELU16 knots
    o_req: Tensor | None = None      # per-channel requantisation of the reduced O sum
    ffn2_req: Tensor | None = None   # likewise for FFN2 (smooth16: its lo pass)
    ffn2_hi: Tensor | None = None    # smooth16: the FFN2 hi pass's parameters
    ffn2_hi_req: Tensor | None = None  # ... and its reduced sum's requantisation
    qkv_req: Tensor | None = None    # smooth16 post-norm: per-lane REQUANT to the QKV input
    ffn_req: Tensor | None = None    # ... and to the FFN1 input
    gate: Linear | None = None       # a gated FFN's gate matrix (FFN1's shape and columns)
    qkr: Linear | None = None        # RoPE: the rotated projections' own matmul (QKV's row
    #                                  does not end on a word: they start on the next)
    rope_req: Tensor | None = None   # RoPE: per-lane REQUANT of Q's and K's lanes
    lut16: Tensor | None = None      # llm16 gated: the identity GELU16 knots (``lut``: SiLU's)


@dataclass
class Activations:
    """The chip's working tensors, sized for ``rows`` rows (the largest microbatch)."""

    h: Tensor
    qkv: Tensor
    o: Tensor
    a: Tensor
    f: Tensor                        # the FFN hidden: int8, or int16 under smooth16
    x8: Tensor | None
    p: Tensor | None                 # int32 partial sums (sharded layers)
    g: Tensor | None = None          # a gated FFN's int8 gate (FFN1's shape)
    rope: tuple[Tensor, Tensor] | None = None   # RoPE: int16 q C and q' S over Q's, K's lanes
    u: Tensor | None = None          # llm16 gated: the int8 up output (f is the int16 product)


def _rows(t: Tensor) -> vl.Rows:
    return vl.Rows(t.base, t.rows, t.row_words, t.eb)


def _view(t: Tensor, rows: int) -> Tensor:
    """The first ``rows`` rows of ``t``."""
    return dataclasses.replace(t, rows=rows)


def _part(t: Tensor, own: tuple[int, int] | None) -> Tensor:
    """Rows ``own = (first, count)`` of ``t``; all of ``t`` when ``own`` is None."""
    if own is None:
        return t
    first, count = own
    return dataclasses.replace(t, base=t.base + first * t.row_words, rows=count)


@dataclass(frozen=True)
class QkvLayout:
    """Where a shard's heads lie in its QKV rows, in lanes. Heads are packed: ``d_head`` lanes
    each, one after another, several to a word when narrower than one (the attention reads
    them at their lane offsets, ``AT_Q_LANE`` .. ``AT_O_LANE``): Q of the shard's ``heads``
    from lane 0, K of its ``kv_heads`` from :attr:`k`, V from :attr:`v`; under RoPE the
    rotated projections ``[Q' | K']`` from :attr:`rope_at`, the first word boundary from
    :attr:`main` (the vector unit reads rows from a word's first lane), with
    :attr:`rope_lanes` lanes for them (the rotation runs over whole repeats of its tables'
    rows). When ``[Q | K | V]`` ends on a word boundary one matmul writes the whole row
    (:attr:`fused`), else the rotated projections are a matmul of their own."""

    d_head: int
    heads: int
    kv_heads: int
    size: int
    rope: bool

    @property
    def k(self) -> int:
        return self.heads * self.d_head

    @property
    def v(self) -> int:
        return (self.heads + self.kv_heads) * self.d_head

    @property
    def main(self) -> int:
        """Lanes of ``[Q | K | V]``."""
        return (self.heads + 2 * self.kv_heads) * self.d_head

    @property
    def qk(self) -> int:
        """Lanes of ``[Q | K]`` (what RoPE rotates) and of ``[Q' | K']``."""
        return (self.heads + self.kv_heads) * self.d_head

    @staticmethod
    def table_lanes_of(d_head: int, size: int) -> int:
        """Lanes of a RoPE table row: the fewest whole words of whole heads,
        ``lcm(d_head, N)``."""
        return math.lcm(d_head, size)

    @property
    def table_lanes(self) -> int:
        return self.table_lanes_of(self.d_head, self.size)

    @property
    def rope_at(self) -> int:
        return pad_to(self.main, self.size) if self.rope else self.main

    @property
    def rope_lanes(self) -> int:
        """Lanes the rotation runs over: :attr:`qk` up to whole table rows."""
        return pad_to(self.qk, self.table_lanes) if self.rope else 0

    @property
    def fused(self) -> bool:
        """One matmul writes the whole row (no RoPE, or ``[Q | K | V]`` ends on a word)."""
        return not self.rope or self.main % self.size == 0

    @property
    def width(self) -> int:
        """Columns of a row."""
        return self.rope_at + self.rope_lanes if self.rope else self.main

    def q_col(self, k: int) -> int:
        """The first lane of the shard's k-th head's Q (and of its output row)."""
        return k * self.d_head

    def k_col(self, g: int) -> int:
        return self.k + g * self.d_head

    def v_col(self, g: int) -> int:
        return self.v + g * self.d_head


@dataclass
class BlockEmitter:
    """Emits blocks on one chip: ``asm``, ``al`` are that chip's assembler and allocator."""

    npu: NpuConfig
    qm: QModel
    asm: Assembler
    al: Allocator
    seq: int
    chip: int = 0
    #: The collectives emitted, in program order (``{"kind", "op", "bytes", "layer", ...}``).
    comms: list = field(default_factory=list)
    #: Bases of the residual tensors whose rows are split over a head group (each chip holds
    #: only its own rows up to date): :meth:`gather_residual` makes them whole again.
    split_residuals: set = field(default_factory=set)
    #: False: place the weights without their contents (the planner's shapes-only compile:
    #: the same layout and program, ``qm``'s weight arrays never read).
    contents: bool = True
    #: RoPE: ``(first, rows)``, the positions of the tables' rows (default ``(0, seq_pad)``):
    #: a block at ``pos_base`` reads rows from ``pos_base - first`` (sequence parallelism: a
    #: chunk's own positions; one chip's passes: every pass's).
    rope_span: tuple[int, int] | None = None

    def __post_init__(self):
        cfg, n = self.qm.cfg, self.npu.array_size
        self.cfg = cfg
        self.n = n
        self.seq_pad = pad_to(self.seq, n)
        self.d_pad = pad_to(cfg.d_model, n)

    # --- weights ---------------------------------------------------------------------------
    def _store(self, name: str, words: int, make, *, low: bool = False) -> Tensor:
        """Allocate ``words`` words of weights named ``name``; with :attr:`contents`, initialise
        them with ``make()`` (the packed words, which must be that many), else place them
        without contents (:meth:`~sim.compiler.alloc.Allocator.alloc_block`): both modes give
        the same layout because every tensor is sized here, once, from the shapes."""
        if not self.contents:
            return self.al.alloc_block(name, words, "weights", low=low)
        packed = np.asarray(make())
        if packed.size != words * self.n:
            raise AssertionError(f"{name}: {packed.size // self.n} words packed, {words} sized")
        return self.al.alloc_words(name, packed, "weights", low=low)

    def _linear(self, name: str, ql, k_rows: int, cols: int, col_map=None, rows=None,
                bias=True) -> Linear:
        """Store a ``k_rows`` x ``cols`` weight matrix unpadded (:class:`Linear`: block-major,
        the last block of ``cols mod N`` columns packed; ``rows()`` selects and places the
        input rows, the rest zero) and per-column parameters of whole blocks; ``col_map``
        places output column j at column ``col_map[j]``; without ``bias`` the biases are 0.
        ``ql``, ``rows`` and ``col_map`` are callables, called only with :attr:`contents`
        (the shapes-only compile reads no weights)."""
        n = self.n
        cols_pad = pad_to(cols, n)
        get = functools.cache(ql)

        def placed():
            w_in = get().w if rows is None else rows()
            k, c = w_in.shape
            return (np.arange(c) if col_map is None else np.asarray(col_map())), w_in, k

        def weights():
            cmap, w_in, k = placed()
            w = np.zeros((k_rows, cols), np.int64)
            w[:k, cmap] = w_in
            return pack_weight_blocks(w, n, packed=True)

        def params():
            cmap, _, _ = placed()
            q = get()
            bias_v = np.zeros(cols_pad, np.int64)
            mult = np.zeros(cols_pad, np.int64)
            shift = np.ones(cols_pad, np.int64)
            if bias:
                bias_v[cmap] = q.bias
            mult[cmap], shift[cmap] = q.mult, q.shift
            return pack_params(bias_v, mult, shift, n)

        wt = self._store(name + ".w", weight_words(k_rows, cols, n, packed=True), weights,
                         low=True)
        pt = self._store(name + ".p", PARAM_WORDS * cols_pad // n, params)
        return Linear(wt, pt, cols, k_rows)

    def _requant_params(self, name: str, params):
        """Per-lane ``(mult, shift)`` words for a per-channel REQUANT of d_model lanes
        (``params()`` gives them, called only with :attr:`contents`)."""
        def make():
            mult, shift = params()
            words = np.zeros(self.d_pad, np.int64)
            words[:self.cfg.d_model] = pack_requant(mult, shift)
            return pack_rows(words[None, :], 4, self.n)
        return self._store(name, row_words(self.d_pad, 4, self.n), make)

    def kv_heads(self, shard: Shard) -> list[int]:
        """The K/V heads the shard's query heads read (grouped-query attention: a K/V head
        whose query heads lie on several chips is held by each of them)."""
        return sorted({h // self.cfg.kv_group for h in shard.heads})

    def qkv_layout(self, shard: Shard) -> QkvLayout:
        """Where ``shard``'s heads lie in its QKV rows (:class:`QkvLayout`)."""
        return QkvLayout(self.cfg.d_head, len(shard.heads), len(self.kv_heads(shard)), self.n,
                         self.cfg.rope)

    def qkv_width(self, shard: Shard) -> int:
        """Columns of a QKV row of ``shard`` (:attr:`QkvLayout.width`)."""
        return self.qkv_layout(shard).width

    def rope_tables(self) -> tuple[Tensor, Tensor]:
        """RoPE's int8 tables ``C`` and ``S`` (:func:`sim.golden.rope.rope_tables`): one row
        per position of :attr:`rope_span` (default the sequence's, rows past its end zero) of
        :attr:`QkvLayout.table_lanes` lanes, the position's ``d_head`` values repeated (one
        head's when ``d_head`` is whole words), placed once per chip and read by every layer
        and head."""
        if getattr(self, "_rope", None) is None:
            cfg, n = self.cfg, self.n
            first, count = self.rope_span or (0, self.seq_pad)
            valid = count if self.rope_span else self.seq
            lanes = QkvLayout.table_lanes_of(cfg.d_head, n)
            words = count * row_words(lanes, 1, n)

            def table(k):
                def make():
                    rows = np.zeros((count, lanes), np.int64)
                    rows[:valid] = np.tile(rope_tables(
                        cfg.d_head, cfg.rope_theta, first + np.arange(valid))[k],
                        (1, lanes // cfg.d_head))
                    return pack_rows(rows, 1, n)
                return make
            self._rope = tuple(self._store(f"rope.{name}", words, table(k))
                               for k, name in enumerate(("cos", "sin")))
        return self._rope

    def _rope_params(self, name: str, L, hcount: int, kvcount: int) -> Tensor:
        """Per-lane ``(mult, shift)`` words of RoPE's REQUANT over the Q and K lanes of a QKV
        row (``hcount`` and ``kvcount`` heads of ``d_head`` lanes)."""
        dh = self.cfg.d_head
        lanes = (hcount + kvcount) * dh

        def make():
            mult, shift = np.zeros(lanes, np.int64), np.ones(lanes, np.int64)
            for k in range(hcount + kvcount):
                m, sh = L.rope.q_req if k < hcount else L.rope.k_req
                mult[k * dh:(k + 1) * dh] = m
                shift[k * dh:(k + 1) * dh] = sh
            return pack_rows(pack_requant(mult, shift)[None, :], 4, self.n)
        return self._store(name, row_words(lanes, 4, self.n), make)

    def place_layer(self, i: int, shard: Shard) -> LayerWeights:
        """Store layer ``i``'s share ``shard`` of the weights on this chip (without
        :attr:`contents`: only the layer's flags are read, ``ffn16`` and whether it has the
        post-norm smooth16 requantisations)."""
        cfg, n, L = self.cfg, self.n, self.qm.layers[i]
        dh, d = cfg.d_head, cfg.d_model
        heads, hcount = list(shard.heads), len(shard.heads)
        reduce = shard.group is not None
        p = f"layers.{i}."
        kvs = self.kv_heads(shard)
        if cfg.rope:
            self.rope_tables()     # placed with the first layer: the layout and capacity see it

        def cols(hs):
            return np.concatenate([np.arange(dh) + h * dh for h in hs])

        @functools.cache
        def q_cols():
            """The Q columns of the local heads (read only with contents)."""
            return cols(heads)

        # The QKV row: Q of the local heads, K and V of their K/V heads, and under RoPE the
        # rotated projections Q' and K' (sim.golden.rope).
        parts = [(lambda: L.q, heads), (lambda: L.k, kvs), (lambda: L.v, kvs)]
        if cfg.rope:
            parts += [(lambda: L.rope.qr, heads), (lambda: L.rope.kr, kvs)]

        def ql_of(some):
            def make():
                pick = [(get(), cols(hs)) for get, hs in some]
                return QLinear(*(np.concatenate([getattr(x, f)[..., c] for x, c in pick],
                                                axis=-1)
                                 for f in ("w", "bias", "mult", "shift")), OutMode.INT8)
            return make

        # Heads packed (QkvLayout): the columns one after another, d_head lanes each.
        lay = self.qkv_layout(shard)
        qkr = None
        if lay.fused:
            qkv = self._linear(p + "qkv", ql_of(parts), d, sum(len(hs) for _, hs in parts) * dh)
        else:
            qkv = self._linear(p + "qkv", ql_of(parts[:3]), d, lay.main)
            qkr = self._linear(p + "qkr", ql_of(parts[3:]), d, lay.qk)

        # Wo rows of the local heads, one head after another as their outputs lie in `o`.
        o = self._linear(p + "o", lambda: L.o, hcount * dh, d, rows=lambda: L.o.w[q_cols()],
                         bias=shard.bias)
        # FFN: W1 columns and W2 rows of the local FFN columns.
        f_cols = len(shard.ffn)

        def ffn_columns(ql):
            """``ql`` (FFN1 or the gate) on this shard's FFN columns (read only with
            contents)."""
            fcols = np.asarray(shard.ffn)
            return QLinear(ql.w[:, fcols], ql.bias[fcols], ql.mult[fcols], ql.shift[fcols],
                           OutMode.INT8)
        ffn1 = self._linear(p + "ffn1", lambda: ffn_columns(L.ffn1), d, f_cols)
        gate = None if L.gate is None else self._linear(
            p + "gate", lambda: ffn_columns(L.gate), d, f_cols)
        ffn2 = self._linear(p + "ffn2", lambda: L.ffn2, f_cols, d,
                            rows=lambda: L.ffn2.w[np.asarray(shard.ffn)], bias=shard.bias)
        # LayerNorm parameters and the activation table (smooth16: the GELU16 knots).
        ln = [self._store(f"{p}ln{k}.gamma_beta", row_words(d, 4, n),
                          lambda x=x: pack_rows(pack_gamma_beta(x.gamma, x.beta)[None, :], 4, n))
              for k, x in ((1, L.ln1), (2, L.ln2))]
        lut16 = None
        if L.ffn16:
            lut16 = self._store(p + "gelu16.lut", row_words(GELU16_KNOTS, 2, n),
                                lambda: pack_rows(L.lut16[None, :], 2, n))
        if not L.ffn16 or L.gate is not None:
            lut = self._store(p + "lut", row_words(LUT_ENTRIES, 1, n),
                              lambda: pack_rows(L.lut[None, :], 1, n))
        else:
            lut, lut16 = lut16, None
        w = LayerWeights(qkv, o, ffn1, ffn2, ln[0], ln[1], lut, gate=gate, lut16=lut16,
                         qkr=qkr)
        if cfg.rope:
            w.rope_req = self._rope_params(p + "rope.requant", L, hcount, len(kvs))
        if L.ffn16:
            # The hi pass: the same weights, (mult, shift - 8) and no bias.
            def hi_params():
                mult, shift = np.zeros(self.d_pad, np.int64), np.ones(self.d_pad, np.int64)
                mult[:d], shift[:d] = L.ffn2.mult, L.ffn2.shift - 8
                return pack_params(np.zeros(self.d_pad, np.int64), mult, shift, n)
            w.ffn2_hi = self._store(p + "ffn2_hi.p", PARAM_WORDS * self.d_pad // n, hi_params)
        if L.qkv_req is not None:
            w.qkv_req = self._requant_params(p + "qkv.requant", lambda: L.qkv_req)
        if L.ffn_req is not None:
            w.ffn_req = self._requant_params(p + "ffn1.requant", lambda: L.ffn_req)
        if reduce:
            w.o_req = self._requant_params(p + "o.requant", lambda: (L.o.mult, L.o.shift))
            w.ffn2_req = self._requant_params(p + "ffn2.requant",
                                              lambda: (L.ffn2.mult, L.ffn2.shift))
            if L.ffn16:
                w.ffn2_hi_req = self._requant_params(p + "ffn2_hi.requant",
                                                     lambda: (L.ffn2.mult, L.ffn2.shift - 8))
        return w

    # --- activations -----------------------------------------------------------------------
    def alloc_activations(self, rows: int, shard: Shard, *, qkv: Tensor | None = None
                          ) -> Activations:
        """The working tensors for ``rows`` rows of one layer shard (shared by the layers: the
        widest shard sizes them); ``qkv``: a Q/K/V tensor the caller allocated (sequence
        parallelism: with rows for the neighbours' keys) instead of one of ``rows`` rows."""
        al, cfg = self.al, self.cfg
        hcount = len(shard.heads)
        f_pad = pad_to(len(shard.ffn), self.n)
        h = al.alloc("h", rows, self.d_pad, 1, "activations")
        if qkv is None:
            qkv = al.alloc("qkv", rows, self.qkv_width(shard), 1, "kv_cache")
        o = al.alloc("o", rows, hcount * cfg.d_head, 1, "activations")
        a = al.alloc("a", rows, self.d_pad, 2, "activations")
        if self.qm.quant in ("smooth16", "llm16"):
            # int16 rows, then half a row below them for row 0's lo plane (module docstring;
            # the allocator grows down, so what is allocated next lies just below).
            f = al.alloc("f16", rows, f_pad, 2, "activations")
            al.alloc("f16.lo0", 1, f_pad, 1, "activations")
            al.note(f"the int16 FFN hidden of quant=\"{self.qm.quant}\" takes "
                    f"{(f.words + row_words(f_pad, 1, self.n)) * self.n:,} bytes of the "
                    f"activations ({rows} rows of {f_pad} int16 and half a row)")
        else:
            f = al.alloc("f", rows, f_pad, 1, "activations")
        x8 = al.alloc("x8", rows, self.d_pad, 1, "activations") if cfg.norm == "post" else None
        g = al.alloc("g", rows, f_pad, 1, "activations") if cfg.ffn == "gated" else None
        u = None
        if cfg.ffn == "gated" and self.qm.quant == "llm16":
            u = al.alloc("u", rows, f_pad, 1, "activations")
        p = None
        if shard.group is not None:
            # The flat int32 sums, padded to whole blocks of the all-reduce.
            count = shard.group[1]
            unit = count * elements_per_word(self.npu.ring_word_bytes, 32)
            elems = pad_to(rows * self.d_pad, unit)
            p = al.alloc("p", 1, elems, 4, "activations")
        rope = None
        if cfg.rope:
            lanes = self.qkv_layout(shard).rope_lanes
            rope = tuple(al.alloc(f"rope.t{k}", rows, lanes, 2, "activations") for k in (1, 2))
        return Activations(h, qkv, o, a, f, x8, p, g, rope, u)

    def alloc_residual(self, name: str, nseq: int, *, multiple: int = 1,
                       transfer: bool = False) -> Tensor:
        """An int16 residual tensor of ``nseq`` sequences (the block's input and output),
        followed by padding words up to a multiple of ``multiple`` words (a message to
        another chip is whole ring words); ``transfer``: in the allocator's transfer bank."""
        rows = nseq * self.seq_pad
        words = rows * row_words(self.d_pad, 2, self.n)
        extra = pad_to(words, multiple) - words
        if extra:
            # The allocator grows down: padding allocated first lies just after the tensor.
            self.al.alloc(name + ".pad", extra, self.n, 1, "activations", row_words_=1,
                          transfer=transfer)
        return self.al.alloc(name, rows, self.d_pad, 2, "activations", transfer=transfer)

    # --- the program -----------------------------------------------------------------------
    def _matmul(self, src: Tensor, weights: Linear, dst: Tensor, k: int, mode: OutMode, *,
                params: Tensor | None = None, a_unsigned: bool = False, col: int = 0):
        """``dst = src @ weights`` (``k`` beats: the A rows' width, whole words; the weights'
        rows past theirs are zero beats); ``params`` replaces the weights' own parameters;
        ``col``: the output's first column (whole words) in ``dst``'s rows."""
        for launch in matmul_launches(
                size=self.n, m=pad_to(src.rows, self.n), k=k, n=weights.cols, a_base=src.base,
                a_row_words=src.row_words, b_base=weights.w.base,
                p_base=(weights.p if params is None else params).base,
                c_base=dst.base + col // self.n, c_row_words=dst.row_words, mode=mode,
                a_unsigned=a_unsigned, b_rows=weights.rows, packed=True):
            emit_matmul(self.asm, launch)

    def _vec(self, launch, tag=None):
        vl.emit(self.asm, launch, tag)

    def _ln(self, gb: Tensor, ql, src: Tensor, q: Tensor | None, y: Tensor | None):
        self._vec(vl.ln_launch(size=self.n, length=self.cfg.d_model, x=_rows(src),
                               gamma_beta_base=gb.base, q=_rows(q) if q is not None else None,
                               y=_rows(y) if y is not None else None, gshift=ql.gshift,
                               mult=ql.mult, shift=ql.shift, rms=self.cfg.rmsnorm),
                  tag=("ln", id(ql)))
        self.asm.wait(Unit.VEC)

    def _add(self, x: Tensor, delta: Tensor):
        self._vec(vl.add_launch(size=self.n, length=self.cfg.d_model, a=_rows(x),
                                b=_rows(delta), out=_rows(x)))
        self.asm.wait(Unit.VEC)

    def requant_input(self, x: Tensor, x8: Tensor, layer: int):
        """Post-norm: the int8 copy of the residual that block ``layer``, the first a chip
        runs, reads (nothing under smooth16, where every block makes its own)."""
        if self.qm.layers[layer].qkv_req is not None:
            return
        mult, shift = self.qm.input_requant(layer)
        self._vec(vl.requant_launch(size=self.n, length=self.cfg.d_model, a=_rows(x),
                                    out=_rows(x8), mult=mult, shift=shift),
                  tag=("input requant",))
        self.asm.wait(Unit.VEC)

    def _requant_lanes(self, x: Tensor, out: Tensor, params: Tensor):
        """Per-lane REQUANT of the int16 rows ``x`` into the int8 rows ``out``."""
        self._vec(vl.requant_launch(size=self.n, length=self.cfg.d_model, a=_rows(x),
                                    out=_rows(out), params_base=params.base))
        self.asm.wait(Unit.VEC)

    def _reduce(self, shard: Shard, acts: Activations, rows: int, req_params: Tensor, a: Tensor,
                layer: int, what: str):
        """All-reduce the int32 partial sums in ``acts.p`` and requantise them into ``a``."""
        first, count, chips = shard.group
        n = self.n
        link = self.npu.link_bytes_per_cycle
        epw = elements_per_word(word_bytes(link, n), 32)
        total = pad_to(rows * self.d_pad, count * epw)
        # Each COLL's blocks fit the engine's buffers: at most COLL_FIFO_WORDS engine words.
        chunk = count * epw * COLL_FIFO_WORDS
        words_per_elem = 4 / n
        at = 0
        while at < total:
            length = min(chunk, total - at)
            req = CollectiveRequest("all_reduce", "sum", 32, length, chips, first=first,
                                    count=count)
            base = acts.p.base + int(at * words_per_elem)
            launch = cl.coll_launch_natural(req, self.chip, base=base, size=n, link_bytes=link)
            cl.emit(self.asm, launch)
            self.asm.wait(Unit.COLL)
            self.comms.append({"kind": "all_reduce", "op": "sum", "width": 32,
                               "elements": length, "bytes": length * 4, "group": [first, count],
                               "layer": layer, "what": what})
            at += length
        # The reduced sums are rows of d_pad int32 (the flat buffer is row-major).
        src = Tensor("p.rows", acts.p.base, rows, self.d_pad, 4, self.d_pad * 4 // n,
                     "activations")
        self._vec(vl.requant_launch(size=n, length=self.cfg.d_model, a=_rows(src),
                                    out=_rows(a), params_base=req_params.base))
        self.asm.wait(Unit.VEC)

    # --- rows split over a head group ----------------------------------------------------
    def _chunk_rows(self, row_bytes: int, rows: int) -> list[tuple[int, int]] | None:
        """``(first, count)`` row chunks of a block of ``rows`` rows of ``row_bytes`` bytes such
        that each chunk is whole engine words and fits the collective engine's buffers; None
        when ``rows`` cannot be cut so."""
        wbytes = self.npu.ring_word_bytes
        if row_bytes % 4:
            return None
        step = wbytes // math.gcd(row_bytes, wbytes)   # fewest rows of whole engine words
        most = COLL_FIFO_WORDS * wbytes // row_bytes // step * step
        if most == 0 or rows % step:
            return None
        return [(r, min(most, rows - r)) for r in range(0, rows, most)]

    def row_split(self, shard: Shard, rows: int) -> tuple[int, int] | None:
        """This chip's rows ``(first, count)`` of a ``rows``-row tensor when the head group
        splits its row-wise work (see :meth:`emit_block`), else None: the group's size must
        divide ``rows`` and the int32 sums, the int8 LayerNorm outputs and the int16
        residual must all cut into whole engine words per chip."""
        if shard.group is None:
            return None
        first, count, chips = shard.group
        if rows % count:
            return None
        own = rows // count
        if any(self._chunk_rows(self.d_pad * eb, own) is None for eb in (1, 2, 4)):
            return None
        return ((self.chip - first) % chips * own, own)

    def _row_collective(self, kind: str, shard: Shard, t: Tensor, rows: int, layer, what: str):
        """``kind`` (reduce_scatter: int32 sums; all_gather: any rows, as 32-bit lanes) of the
        first ``rows`` rows of ``t`` over the head group, each chip's block its own rows
        (:meth:`row_split`), in chunks that fit the engine: chunk k holds rows k*r.. of every
        block, so the blocks lie ``rows / count`` rows apart."""
        first, count, chips = shard.group
        n, link = self.n, self.npu.link_bytes_per_cycle
        own = rows // count
        row_bytes = t.row_words * n
        for r0, r in self._chunk_rows(row_bytes, own):
            length = count * r * row_bytes // 4
            req = CollectiveRequest(kind, "sum", 32, length, chips, first=first, count=count)
            launch = cl.coll_launch_natural(req, self.chip, base=t.base + r0 * t.row_words,
                                            size=n, link_bytes=link,
                                            block_stride=own * t.row_words)
            cl.emit(self.asm, launch)
            self.asm.wait(Unit.COLL)
            self.comms.append({"kind": kind, "op": "sum", "width": 32, "elements": length,
                               "bytes": length * 4, "group": [first, count], "layer": layer,
                               "what": what})

    def valid_rows(self, nseq: int) -> int:
        """The rows a block's row-wise work covers on ``nseq`` sequences: one sequence's
        ``seq`` tokens (a decode step's ``B`` rows on a wide array are not padded to a
        fold), several sequences' padded rows (they lie ``seq_pad`` rows apart). Matmuls
        still run whole folds (:meth:`_matmul`): the rows past these hold what the folds
        compute and are never read."""
        return self.seq if nseq == 1 else nseq * self.seq_pad

    def gather_residual(self, x: Tensor, shard: Shard, nseq: int):
        """Make the residual ``x`` whole on every chip of the head group again (an all-gather
        of the rows each one holds), if its rows are split."""
        if x.base in self.split_residuals:
            self._row_collective("all_gather", shard, x, self.valid_rows(nseq), None,
                                 "residual")
            self.split_residuals.discard(x.base)

    def emit_block(self, i: int, w: LayerWeights, shard: Shard, acts: Activations, x: Tensor,
                   nseq: int, *, pos_base: int = 0, qkv_out: Tensor | None = None,
                   attend=None, one_position: bool = False):
        """Block ``i`` on the ``nseq`` sequences of the residual ``x`` (in place).

        ``qkv_out``: where the QKV matmul writes (default: ``acts.qkv``; RoPE rotates Q and
        K there); ``attend()``: emits the layer's attention launches in place of the default
        ones over ``qkv`` (sequence parallelism: K/V exchanges, then windows over the
        neighbours' keys); ``pos_base``: the position of the first row (RoPE's tables, the
        default attention's); ``one_position``: every row is at ``pos_base`` (a decode step's
        rows, one token of each sequence: RoPE reads one table row for all of them).
        """
        asm, cfg, qm, n = self.asm, self.cfg, self.qm, self.n
        L = qm.layers[i]
        rows = self.valid_rows(nseq)
        h, qkv, o, a, f = (_view(t, rows) for t in (acts.h, acts.qkv, acts.o, acts.a, acts.f))
        x8 = _view(acts.x8, rows) if acts.x8 is not None else None
        x = _view(x, rows)
        hcount = len(shard.heads)
        reduce = shard.group is not None
        out_mode = OutMode.RAW if reduce else OutMode.INT16
        own = self.row_split(shard, rows)

        def linear_out(src, weights, k, req, what, **kw):
            if not reduce:
                self._matmul(src, weights, a, k, OutMode.INT16, **kw)
                asm.wait(Unit.MATMUL)
                return
            p = Tensor("p.rows", acts.p.base, rows, self.d_pad, 4, self.d_pad * 4 // n,
                       "activations")
            self._matmul(src, weights, p, k, out_mode, **kw)
            asm.wait(Unit.MATMUL)
            if own is None:
                self._reduce(shard, acts, rows, req, a, i, what)
                return
            # Each chip reduces and requantises only its own rows.
            self._row_collective("reduce_scatter", shard, p, rows, i, what)
            self._vec(vl.requant_launch(size=n, length=cfg.d_model, a=_rows(_part(p, own)),
                                        out=_rows(_part(a, own)), params_base=req.base))
            asm.wait(Unit.VEC)

        def add():
            self._add(_part(x, own), _part(a, own))
            if own is not None:
                self.split_residuals.add(x.base)

        def norm(gb, ql, q, y):
            """LayerNorm of ``x`` into ``q`` (int8) and, if given, ``y`` (int16): while the
            rows of ``x`` are split, of this chip's rows, then ``q`` gathered from the group."""
            if x.base not in self.split_residuals:
                self._ln(gb, ql, x, q, y)
                return
            self._ln(gb, ql, _part(x, own), _part(q, own), None if y is None else _part(y, own))
            self._row_collective("all_gather", shard, q, rows, i, "LayerNorm output")

        def norm_in_place(gb, ql):
            """Post-norm smooth16: the int16 LayerNorm of ``x`` into ``x`` (this chip's rows
            while they are split; the residual stays split)."""
            split = x.base in self.split_residuals
            self._ln(gb, ql, _part(x, own) if split else x, None, _part(x, own) if split else x)

        def lanes(out, params):
            """Post-norm smooth16: the per-lane REQUANT of ``x`` into the int8 ``out`` (while
            the rows of ``x`` are split, of this chip's rows, then ``out`` gathered)."""
            if x.base not in self.split_residuals:
                self._requant_lanes(x, out, params)
                return
            self._requant_lanes(_part(x, own), _part(out, own), params)
            self._row_collective("all_gather", shard, out, rows, i, "LayerNorm output")

        kvs = self.kv_heads(shard)
        lay = self.qkv_layout(shard)

        def rope():
            """RoPE of Q and K in place (sim.golden.rope): MUL by C, MUL of Q', K' by S, ADD
            (over whole table rows: :attr:`QkvLayout.rope_lanes`), per-lane REQUANT back into
            the Q and K lanes (their last word's other lanes, V's, kept); the tables' rows from
            position ``pos_base``."""
            t1, t2 = (_view(t, rows) for t in acts.rope)
            lanes, span = lay.qk, lay.rope_lanes
            tw = lay.table_lanes // n                        # words of a table row
            rot = qkv if qkv_out is None else qkv_out       # where the QKV matmul wrote
            qk = vl.Rows(rot.base, rows, rot.row_words, 1)
            qkr = vl.Rows(rot.base + lay.rope_at // n, rows, rot.row_words, 1)
            first, count = self.rope_span or (0, self.seq_pad)
            row0 = pos_base - first
            period = 1 if one_position else rows if nseq == 1 else self.seq_pad
            if row0 < 0 or row0 + period > count or (nseq > 1 and row0):
                raise AssertionError(f"RoPE tables of positions {first}..{first + count - 1} "
                                     f"do not hold {nseq} x {period} rows from {pos_base}")
            cos, sin = (vl.Tiled(t.base + row0 * tw, period, tw, 1, span // lay.table_lanes)
                        for t in self.rope_tables())
            for src, table, out in ((qk, cos, t1), (qkr, sin, t2)):
                self._vec(vl.mul_launch(size=n, length=span, a=src, b=table, out=_rows(out),
                                        mult=ROPE_MUL[0], shift=ROPE_MUL[1]), tag=("rope", i))
                asm.wait(Unit.VEC)
            self._vec(vl.add_launch(size=n, length=span, a=_rows(t1), b=_rows(t2),
                                    out=_rows(t1)))
            asm.wait(Unit.VEC)
            self._vec(vl.requant_launch(size=n, length=lanes, a=_rows(t1), out=qk,
                                        params_base=w.rope_req.base, keep=lanes % n != 0))
            asm.wait(Unit.VEC)

        def attention():
            sched = al_.plan_schedule(seq=self.seq, window=cfg.window, causal=cfg.causal,
                                      ring=self.npu.attn_window)
            for s in range(nseq):
                row0 = s * self.seq_pad
                for k in range(hcount):
                    base = qkv.base + row0 * qkv.row_words
                    g = kvs.index(shard.heads[k] // cfg.kv_group)
                    al_.emit(asm, al_.attention_launch(
                        size=n, d_head=cfg.d_head, queries=self.seq, keys=self.seq,
                        q_base=base, k_base=base, v_base=base,
                        o_base=o.base + row0 * o.row_words, q_row_words=qkv.row_words,
                        k_row_words=qkv.row_words, v_row_words=qkv.row_words,
                        o_row_words=o.row_words, col=lay.q_col(k), k_col=lay.k_col(g),
                        v_col=lay.v_col(g), q_pos=pos_base,
                        k_pos=pos_base, bidirectional=not cfg.causal,
                        interleaved=sched.interleaved, halo=sched.halo, window=sched.window,
                        score_mult=L.score_mult, score_shift=L.score_shift,
                        out_mult=L.out_mult, out_shift=L.out_shift), ("attn", i))

        def attention_block(h_in):
            dst = qkv if qkv_out is None else qkv_out
            self._matmul(h_in, w.qkv, dst, self.d_pad, OutMode.INT8)
            if w.qkr is not None:
                self._matmul(h_in, w.qkr, dst, self.d_pad, OutMode.INT8, col=lay.rope_at)
            asm.wait(Unit.MATMUL)
            if w.rope_req is not None:
                rope()
            (attention if attend is None else attend)()
            asm.wait(Unit.ATTN)
            linear_out(o, w.o, pad_to(hcount * cfg.d_head, n), w.o_req, "attention output")
            add()

        def ffn_block(h_in):
            if L.ffn16 and w.gate is not None:
                return gated16_block(h_in)
            if L.ffn16:
                return ffn16_block(h_in)
            if w.gate is not None:
                return gated_block(h_in)
            self._matmul(h_in, w.ffn1, f, self.d_pad, OutMode.INT8)
            self._vec(vl.load_lut_launch(size=n, base=w.lut.base))   # overlaps FFN1
            asm.wait(Unit.MATMUL | Unit.VEC)
            self._vec(vl.lut_launch(size=n, length=len(shard.ffn), a=_rows(f), out=_rows(f)))
            asm.wait(Unit.VEC)
            linear_out(f, w.ffn2, f.cols, w.ffn2_req, "FFN output")
            add()

        def gate_then_up(h_in, g, up):
            """The gate matmul (LOAD_LUT beside it), then the up matmul into ``up`` with the
            activation LUT on the gate beside it (left running)."""
            self._matmul(h_in, w.gate, g, self.d_pad, OutMode.INT8)
            self._vec(vl.load_lut_launch(size=n, base=w.lut.base))   # overlaps the gate
            asm.wait(Unit.MATMUL | Unit.VEC)
            self._matmul(h_in, w.ffn1, up, self.d_pad, OutMode.INT8)
            self._vec(vl.lut_launch(size=n, length=len(shard.ffn), a=_rows(g), out=_rows(g)))

        def gated_block(h_in):
            g = _view(acts.g, rows)
            cols = len(shard.ffn)
            gate_then_up(h_in, g, f)
            asm.wait(Unit.MATMUL | Unit.VEC)
            self._vec(vl.mul_launch(size=n, length=cols, a=_rows(f), b=_rows(g), out=_rows(f),
                                    mult=L.mul_mult, shift=L.mul_shift), tag=("mul", i))
            asm.wait(Unit.VEC)
            linear_out(f, w.ffn2, f.cols, w.ffn2_req, "FFN output")
            add()

        def gated16_block(h_in):
            g, u = _view(acts.g, rows), _view(acts.u, rows)
            cols = len(shard.ffn)
            gate_then_up(h_in, g, u)
            asm.wait(Unit.VEC)
            self._vec(vl.load_lut16_launch(size=n, base=w.lut16.base))  # overlaps the up
            asm.wait(Unit.MATMUL | Unit.VEC)
            self._vec(vl.mul_launch(size=n, length=cols, a=_rows(u), b=_rows(g), out=_rows(f),
                                    mult=L.mul_mult, shift=L.mul_shift), tag=("mul", i))
            asm.wait(Unit.VEC)
            planes(cols)

        def ffn16_block(h_in):
            self._matmul(h_in, w.ffn1, f, self.d_pad, OutMode.INT16)
            self._vec(vl.load_lut16_launch(size=n, base=w.lut.base))   # overlaps FFN1
            asm.wait(Unit.MATMUL | Unit.VEC)
            planes(len(shard.ffn))

        def planes(cols):
            """GELU16 of the int16 hidden ``f`` into its two int8 planes, then FFN2's hi and lo
            passes, each added into the residual."""
            half = f.row_words // 2
            hi = Tensor("f16.hi", f.base, rows, f.cols, 1, f.row_words, "activations")
            lo = Tensor("f16.lo", f.base - half, rows, f.cols, 1, f.row_words, "activations")
            self._vec(vl.gelu16_launch(size=n, length=cols, a=_rows(f), g=L.gelu_g,
                                       hi=_rows(hi), lo=_rows(lo)))
            asm.wait(Unit.VEC)
            linear_out(hi, w.ffn2, f.cols, w.ffn2_hi_req, "FFN output (hi pass)",
                       params=w.ffn2_hi)
            add()
            linear_out(lo, w.ffn2, f.cols, w.ffn2_req, "FFN output (lo pass)",
                       a_unsigned=True)
            add()

        if L.res_req is not None:
            # llm16: this block's residual scale (the rows this chip holds, split or not).
            xr = _part(x, own) if x.base in self.split_residuals else x
            self._vec(vl.requant_launch(size=n, length=cfg.d_model, a=_rows(xr), out=_rows(xr),
                                        mult=L.res_req[0], shift=L.res_req[1]),
                      tag=("residual requant", i))
            asm.wait(Unit.VEC)
        if cfg.norm == "pre":
            norm(w.ln1, L.ln1, h, None)
            attention_block(h)
            norm(w.ln2, L.ln2, h, None)
            ffn_block(h)
        elif w.qkv_req is not None:
            # smooth16: per-lane REQUANTs make the int8 inputs from the int16 LayerNorm outputs.
            lanes(x8, w.qkv_req)
            attention_block(x8)
            norm_in_place(w.ln1, L.ln1)
            lanes(h, w.ffn_req)
            ffn_block(h)
            norm_in_place(w.ln2, L.ln2)
        else:
            attention_block(x8)
            norm(w.ln1, L.ln1, h, x)
            ffn_block(h)
            norm(w.ln2, L.ln2, x8, x)
