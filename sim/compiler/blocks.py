"""Transformer blocks on one chip, for every strategy: weight placement and the block program.

Shapes are padded to the array: the sequence to whole blocks of N tokens, d_model and d_ff to
whole words, every head's Q/K/V columns to a multiple of N (zero weights, so the padding
changes no integer). Tensors are token-major and hold ``nseq`` sequences one after another
(``seq_pad`` rows each): matmuls, LayerNorms and element-wise ops run over all of their rows,
attention once per sequence and head. Per block (pre-norm)::

    VEC  LN1     x (int16)        -> h (int8)
    MM   QKV     h @ Wqkv         -> qkv (int8, per-head padded columns)
    ATTN         per sequence and head: qkv -> o
    MM   O       o @ Wo           -> a (int16, residual scale)
    VEC  ADD     x + a            -> x
    VEC  LN2     x                -> h
    VEC  LOAD_LUT (overlaps the next matmul)
    MM   FFN1    h @ W1           -> f (int8)
    VEC  LUT     f                -> f
    MM   FFN2    f @ W2           -> a (int16)
    VEC  ADD     x + a            -> x

Post-norm reads an int8 copy of the residual (from the previous LayerNorm, or a REQUANT at the
first block a chip runs) and normalises after each residual add, writing both the int16
residual and the int8 copy.

A chip may hold a **shard** of a layer (:class:`Shard`): some heads (their Q/K/V columns and
the matching rows of Wo) and some FFN columns (of W1, and the rows of W2). Then O and FFN2 give
int32 partial sums (raw matmul output, the biases added on one chip only), an all-reduce SUM
over the chips of the shard's group adds them, wrapping modulo 2**32 like one chip's
accumulator would, and a per-channel REQUANT makes the int16 ``a``: the same integers as one
chip's matmul. A ``WAIT`` precedes each launch that reads what the previous one writes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from hw.spec import ModelConfig, NpuConfig
from hw.spec.collective import CollectiveRequest, elements_per_word, word_bytes
from hw.spec.formats import OutMode
from hw.spec.isa import COLL_FIFO_WORDS, Unit
from hw.spec.memory import pack_params, pack_rows, pack_weight_blocks, row_words
from hw.spec.vector import pack_gamma_beta, pack_requant

from . import attention_launch as al_
from . import collective_launch as cl
from . import vector_launch as vl
from .alloc import Allocator, Tensor
from .assembler import Assembler
from .descriptors import emit_matmul, matmul_launch
from .quantize import QLinear, QModel

__all__ = ["Shard", "LayerWeights", "Activations", "BlockEmitter", "cdiv", "pad_to"]


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

    heads: tuple[int, ...]
    ffn: tuple[int, ...]
    group: tuple[int, int, int] | None = None
    bias: bool = True

    @classmethod
    def whole(cls, cfg: ModelConfig) -> Shard:
        return cls(tuple(range(cfg.n_heads)), tuple(range(cfg.d_ff)))


@dataclass
class LayerWeights:
    """One layer's tensors on a chip (``(weights, params, padded cols)`` per matmul)."""

    qkv: tuple
    o: tuple
    ffn1: tuple
    ffn2: tuple
    ln1: Tensor
    ln2: Tensor
    lut: Tensor
    o_req: Tensor | None = None      # per-channel requantisation of the reduced O sum
    ffn2_req: Tensor | None = None   # likewise for FFN2


@dataclass
class Activations:
    """The chip's working tensors, sized for ``rows`` rows (the largest microbatch)."""

    h: Tensor
    qkv: Tensor
    o: Tensor
    a: Tensor
    f: Tensor
    x8: Tensor | None
    p: Tensor | None                 # int32 partial sums (sharded layers)


def _rows(t: Tensor) -> vl.Rows:
    return vl.Rows(t.base, t.rows, t.row_words, t.eb)


def _view(t: Tensor, rows: int) -> Tensor:
    """The first ``rows`` rows of ``t``."""
    return dataclasses.replace(t, rows=rows)


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

    def __post_init__(self):
        cfg, n = self.qm.cfg, self.npu.array_size
        self.cfg = cfg
        self.n = n
        self.seq_pad = pad_to(self.seq, n)
        self.d_pad = pad_to(cfg.d_model, n)
        self.dh_pad = pad_to(cfg.d_head, n)

    # --- weights ---------------------------------------------------------------------------
    def _linear(self, name: str, ql: QLinear, k_pad: int, col_map=None, cols_pad=None,
                rows=None, bias=True):
        """Store weights block-major (rows zero-padded to ``k_pad``; ``rows`` selects and
        places input rows) and per-column parameters; ``col_map`` places output column j at
        padded column ``col_map[j]``; without ``bias`` the biases are 0."""
        al, n = self.al, self.n
        w_in = ql.w if rows is None else rows
        k, cols = w_in.shape
        cols_pad = cols_pad or pad_to(cols, n)
        col_map = np.arange(cols) if col_map is None else np.asarray(col_map)
        w = np.zeros((k_pad, cols_pad), np.int64)
        w[:k, col_map] = w_in
        bias_v = np.zeros(cols_pad, np.int64)
        mult = np.zeros(cols_pad, np.int64)
        shift = np.ones(cols_pad, np.int64)
        if bias:
            bias_v[col_map] = ql.bias
        mult[col_map], shift[col_map] = ql.mult, ql.shift
        wt = al.alloc_words(name + ".w", pack_weight_blocks(w, n), "weights", low=True)
        pt = al.alloc_words(name + ".p", pack_params(bias_v, mult, shift, n), "weights")
        return wt, pt, cols_pad

    def _requant_params(self, name: str, ql: QLinear):
        words = np.zeros(self.d_pad, np.int64)
        words[:self.cfg.d_model] = pack_requant(ql.mult, ql.shift)
        return self.al.alloc_words(name, pack_rows(words[None, :], 4, self.n), "weights")

    def place_layer(self, i: int, shard: Shard) -> LayerWeights:
        """Store layer ``i``'s share ``shard`` of the weights on this chip."""
        cfg, n, L = self.cfg, self.n, self.qm.layers[i]
        dh, dh_pad, d = cfg.d_head, self.dh_pad, cfg.d_model
        heads, hcount = list(shard.heads), len(shard.heads)
        reduce = shard.group is not None
        p = f"layers.{i}."
        # Q, K and V columns of the local heads, each head padded to dh_pad.
        cols = np.concatenate([np.arange(dh) + h * dh for h in heads])
        qkv_map = np.concatenate([np.arange(dh) + part * hcount * dh_pad + k * dh_pad
                                  for part in range(3) for k in range(hcount)])
        pick = (L.q, L.k, L.v)
        ql = QLinear(np.concatenate([x.w[:, cols] for x in pick], axis=1),
                     np.concatenate([x.bias[cols] for x in pick]),
                     np.concatenate([x.mult[cols] for x in pick]),
                     np.concatenate([x.shift[cols] for x in pick]), OutMode.INT8)
        qkv = self._linear(p + "qkv", ql, self.d_pad, qkv_map, 3 * hcount * dh_pad)
        # Wo rows of the local heads (padded rows of zeros between heads).
        o_map = np.concatenate([np.arange(dh) + k * dh_pad for k in range(hcount)])
        wo_rows = np.zeros((hcount * dh_pad, d), np.int64)
        wo_rows[o_map] = L.o.w[cols]
        o = self._linear(p + "o", L.o, hcount * dh_pad, rows=wo_rows, bias=shard.bias)
        # FFN: W1 columns and W2 rows of the local FFN columns.
        fcols = np.asarray(shard.ffn)
        f_pad = pad_to(len(fcols), n)
        ffn1 = self._linear(p + "ffn1", QLinear(L.ffn1.w[:, fcols], L.ffn1.bias[fcols],
                                                L.ffn1.mult[fcols], L.ffn1.shift[fcols],
                                                OutMode.INT8), self.d_pad)
        ffn2 = self._linear(p + "ffn2", L.ffn2, f_pad, rows=L.ffn2.w[fcols], bias=shard.bias)
        # LayerNorm parameters and the activation table.
        ln = [self.al.alloc_words(f"{p}ln{k}.gamma_beta",
                                  pack_rows(pack_gamma_beta(x.gamma, x.beta)[None, :], 4, n),
                                  "weights") for k, x in ((1, L.ln1), (2, L.ln2))]
        lut = self.al.alloc_words(p + "lut", pack_rows(L.lut[None, :], 1, n), "weights")
        w = LayerWeights(qkv, o, ffn1, ffn2, ln[0], ln[1], lut)
        if reduce:
            w.o_req = self._requant_params(p + "o.requant", L.o)
            w.ffn2_req = self._requant_params(p + "ffn2.requant", L.ffn2)
        return w

    # --- activations -----------------------------------------------------------------------
    def alloc_activations(self, rows: int, shard: Shard) -> Activations:
        """The working tensors for ``rows`` rows of one layer shard (shared by the layers: the
        widest shard sizes them)."""
        al, cfg = self.al, self.cfg
        hcount = len(shard.heads)
        f_pad = pad_to(len(shard.ffn), self.n)
        h = al.alloc("h", rows, self.d_pad, 1, "activations")
        qkv = al.alloc("qkv", rows, 3 * hcount * self.dh_pad, 1, "kv_cache")
        o = al.alloc("o", rows, hcount * self.dh_pad, 1, "activations")
        a = al.alloc("a", rows, self.d_pad, 2, "activations")
        f = al.alloc("f", rows, f_pad, 1, "activations")
        x8 = al.alloc("x8", rows, self.d_pad, 1, "activations") if cfg.norm == "post" else None
        p = None
        if shard.group is not None:
            # The flat int32 sums, padded to whole blocks of the all-reduce.
            count = shard.group[1]
            unit = count * elements_per_word(word_bytes(self.npu.link_bytes_per_cycle), 32)
            elems = pad_to(rows * self.d_pad, unit)
            p = al.alloc("p", 1, elems, 4, "activations")
        return Activations(h, qkv, o, a, f, x8, p)

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
    def _matmul(self, src: Tensor, weights, dst: Tensor, k: int, mode: OutMode):
        wt, pt, cols = weights
        emit_matmul(self.asm, matmul_launch(
            size=self.n, m=src.rows, k=k, n=cols, a_base=src.base, a_row_words=src.row_words,
            b_base=wt.base, p_base=pt.base, c_base=dst.base, c_row_words=dst.row_words,
            mode=mode))

    def _vec(self, launch, tag=None):
        vl.emit(self.asm, launch, tag)

    def _ln(self, gb: Tensor, ql, src: Tensor, q: Tensor | None, y: Tensor | None):
        self._vec(vl.ln_launch(size=self.n, length=self.cfg.d_model, x=_rows(src),
                               gamma_beta_base=gb.base, q=_rows(q) if q is not None else None,
                               y=_rows(y) if y is not None else None, gshift=ql.gshift,
                               mult=ql.mult, shift=ql.shift), tag=("ln", id(ql)))
        self.asm.wait(Unit.VEC)

    def _add(self, x: Tensor, delta: Tensor):
        self._vec(vl.add_launch(size=self.n, length=self.cfg.d_model, a=_rows(x),
                                b=_rows(delta), out=_rows(x)))
        self.asm.wait(Unit.VEC)

    def requant_input(self, x: Tensor, x8: Tensor, mult: int, shift: int):
        """Post-norm: the int8 copy of the residual a chip's first block reads."""
        self._vec(vl.requant_launch(size=self.n, length=self.cfg.d_model, a=_rows(x),
                                    out=_rows(x8), mult=mult, shift=shift),
                  tag=("input requant",))
        self.asm.wait(Unit.VEC)

    def _reduce(self, shard: Shard, acts: Activations, rows: int, req_params: Tensor, a: Tensor,
                layer: int, what: str):
        """All-reduce the int32 partial sums in ``acts.p`` and requantise them into ``a``."""
        first, count, chips = shard.group
        n = self.n
        link = self.npu.link_bytes_per_cycle
        epw = elements_per_word(word_bytes(link), 32)
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

    def emit_block(self, i: int, w: LayerWeights, shard: Shard, acts: Activations, x: Tensor,
                   nseq: int, *, pos_base: int = 0):
        """Block ``i`` on the ``nseq`` sequences of the residual ``x`` (in place)."""
        asm, cfg, qm, n = self.asm, self.cfg, self.qm, self.n
        L = qm.layers[i]
        rows = nseq * self.seq_pad
        h, qkv, o, a, f = (_view(t, rows) for t in (acts.h, acts.qkv, acts.o, acts.a, acts.f))
        x8 = _view(acts.x8, rows) if acts.x8 is not None else None
        x = _view(x, rows)
        hcount = len(shard.heads)
        reduce = shard.group is not None
        out_mode = OutMode.RAW if reduce else OutMode.INT16

        def linear_out(src, weights, k, req, what):
            if not reduce:
                self._matmul(src, weights, a, k, OutMode.INT16)
                asm.wait(Unit.MATMUL)
                return
            p = Tensor("p.rows", acts.p.base, rows, self.d_pad, 4, self.d_pad * 4 // n,
                       "activations")
            self._matmul(src, weights, p, k, out_mode)
            asm.wait(Unit.MATMUL)
            self._reduce(shard, acts, rows, req, a, i, what)

        def attention():
            part = hcount * self.dh_pad // n          # words of one of Q, K, V in a qkv row
            sched = al_.plan_schedule(seq=self.seq, window=cfg.window, causal=cfg.causal,
                                      ring=self.npu.attn_window)
            for s in range(nseq):
                row0 = s * self.seq_pad
                for k in range(hcount):
                    base = qkv.base + row0 * qkv.row_words
                    al_.emit(asm, al_.attention_launch(
                        size=n, d_head=self.dh_pad, queries=self.seq, keys=self.seq,
                        q_base=base, k_base=base + part, v_base=base + 2 * part,
                        o_base=o.base + row0 * o.row_words, q_row_words=qkv.row_words,
                        k_row_words=qkv.row_words, v_row_words=qkv.row_words,
                        o_row_words=o.row_words, col=k * self.dh_pad, q_pos=pos_base,
                        k_pos=pos_base, bidirectional=not cfg.causal,
                        interleaved=sched.interleaved, halo=sched.halo, window=sched.window,
                        score_mult=L.score_mult, score_shift=L.score_shift,
                        out_mult=L.out_mult, out_shift=L.out_shift), ("attn", i))

        def attention_block(h_in):
            self._matmul(h_in, w.qkv, qkv, self.d_pad, OutMode.INT8)
            asm.wait(Unit.MATMUL)
            attention()
            asm.wait(Unit.ATTN)
            linear_out(o, w.o, hcount * self.dh_pad, w.o_req, "attention output")
            self._add(x, a)

        def ffn_block(h_in):
            self._matmul(h_in, w.ffn1, f, self.d_pad, OutMode.INT8)
            self._vec(vl.load_lut_launch(size=n, base=w.lut.base))   # overlaps FFN1
            asm.wait(Unit.MATMUL | Unit.VEC)
            self._vec(vl.lut_launch(size=n, length=len(shard.ffn), a=_rows(f), out=_rows(f)))
            asm.wait(Unit.VEC)
            linear_out(f, w.ffn2, f.cols, w.ffn2_req, "FFN output")
            self._add(x, a)

        if cfg.norm == "pre":
            self._ln(w.ln1, L.ln1, x, h, None)
            attention_block(h)
            self._ln(w.ln2, L.ln2, x, h, None)
            ffn_block(h)
        else:
            attention_block(x8)
            self._ln(w.ln1, L.ln1, x, h, x)
            ffn_block(h)
            self._ln(w.ln2, L.ln2, x, x8, x)
