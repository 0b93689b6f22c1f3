"""Greedy generation on one chip: the prefill, then a counted loop of decode steps, no host
between tokens (the golden model is :mod:`sim.golden.decode`).

The host loads the weights, the head's tables and the prompt's token ids once; the program
runs the prefill of the ``P`` prompt tokens and ``n - 1`` decode steps, and the host reads the
``P + n`` token ids (the prompt's, then the ``n`` generated) and the ``n`` int16 logit rows
back at the end. Per block, the QKV matmul writes its rows straight into that block's **cache**
(``[Q | K | V]`` rows, one per position: the prefill's rows, then one per step), which the
attention reads the keys and values of every earlier position from. Program::

    VEC  ONEHOT   ids[0 .. P-1]            -> e (int8 one-hot rows)
    MM   EMBED    e @ E8, emb_req          -> x (int16)
    VEC  ADD      x + pos16[0 .. P-1]      -> x (learned positions)
    blocks (sim.compiler.blocks) over the P rows, QKV rows into the caches' rows 0 .. P-1
    VEC  LN       x[P-1]                   -> hf (the final norm, int8)
    MM   LM       hf @ W_lm                -> logits[0]
    VEC  ARGMAX   logits[0]                -> ids[P]
    LOOP n - 1 times, iteration t (position p = P + t):
        VEC  ONEHOT   ids[p]               -> e[0]
        MM   EMBED    e @ E8               -> x
        VEC  ADD      x[0] + pos16[p]      -> x[0]
        blocks over one row (N rows of the array's fold), QKV row into the caches' row p,
            attention of that row over the cache's rows 0 .. p
        VEC  LN       x[0]                 -> hf
        MM   LM       hf @ W_lm            -> logits[t + 1]
        VEC  ARGMAX   logits[t + 1]        -> ids[p + 1]
    HALT

The embedding lookup is a matmul of the token's one-hot row with the int8 table, requantised
per column by ``emb_req``: the int32 product is the table's row exactly, so ``x`` is
``REQUANT(E8[t], emb_req, 16)`` (:func:`sim.golden.decode.embed_int`) bit for bit, with
cycles that do not depend on the token. Learned positions are stored as the int16 table
``REQUANT(P8, pos_req, 16)`` (the same integers the golden adds). The matmuls of one step run
over one fold of ``N`` rows, of which row 0 is the token (the rows below it compute what
they compute and are overwritten before any attention reads them). The step's addresses and
lengths are affine in ``t`` (:func:`sim.compiler.affine.emit_affine`), so the program's length
does not depend on ``n``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from hw.spec import ConfigError, NpuConfig
from hw.spec.collective import word_bytes
from hw.spec.formats import OutMode
from hw.spec.isa import Unit
from hw.spec.memory import pack_rows, row_words, unpack_rows
from hw.spec.vector import argmax_words, pack_argmax, pack_gamma_beta, unpack_argmax

from ..golden.decode import check_decode, learned_positions
from ..golden.matmul import requant
from . import attention_launch as al_
from . import vector_launch as vl
from .affine import emit_affine
from .alloc import Allocator, Tensor
from .assembler import Assembler
from .blocks import BlockEmitter, Shard, pad_to
from .compat import check_ring_port, check_single_chip
from .decode_quant import QHead
from .grid import head_shards
from .program import ChipProgram, finish
from .quantize import QLinear, QModel

__all__ = ["DecodeProgram", "compile_decode", "check_generate"]


@dataclass
class DecodeProgram:
    """Every chip's generation program and where the inputs and outputs live."""

    npu: NpuConfig
    qm: QModel
    chips: list          #: :class:`~sim.compiler.program.ChipProgram` per chip
    prompt_len: int
    generate: int
    #: Per chip: ``P + n`` argmax records, the prompt's ids (loaded), then the generated.
    ids: list
    #: Chip 0's ``n`` int16 rows of the padded vocabulary (and ``N - 1`` rows of padding).
    logits: Tensor
    caches: list         #: per chip, per block: its ``[Q | K | V]`` rows, one per position
    #: Per chip: bytes of K and V its caches hold for the whole context (``P + n - 1``).
    kv_bytes: list = field(default_factory=list)
    #: Per chip: the collectives of the prefill and of one decode step (``{"prefill", "step"}``).
    comms: list = field(default_factory=list)

    @property
    def context(self) -> int:
        return self.prompt_len + self.generate - 1

    @property
    def programs(self) -> list[list[int]]:
        return [c.program for c in self.chips]

    def images(self, prompt) -> list[dict[int, np.ndarray]]:
        """Every chip's initial memory: its weights and tables, and the prompt's ids."""
        n = self.npu.array_size
        prompt = np.asarray(prompt, np.int64)
        ids = pack_argmax(prompt, np.zeros_like(prompt), n).reshape(-1, n)
        return [{**c.images, t.base: ids} for c, t in zip(self.chips, self.ids, strict=True)]

    def reads(self) -> list[tuple[int, int]]:
        """The ``(base, words)`` regions to read back from chip 0: the ids, then the logits."""
        return [(self.ids[0].base, self.ids[0].words), (self.logits.base,
                                                 self.generate * self.logits.row_words)]

    def read(self, regions) -> dict:
        """``ids`` [n] (the generated) and ``logits`` [n, vocab] from the words :meth:`reads`
        asked for."""
        n, cfg = self.npu.array_size, self.qm.cfg
        records = np.asarray(regions[0], np.uint8).reshape(-1, argmax_words(n), n)
        ids, _ = unpack_argmax(records)
        logits = unpack_rows(regions[1], self.generate, self.logits.cols, 2)
        return {"ids": np.array(ids[self.prompt_len:], np.int64),
                "logits": logits[:, :cfg.vocab_size]}


def check_generate(npu: NpuConfig, cfg, prompt_len: int, generate: int):
    """ValueError (one line) unless one chip can generate ``generate`` tokens after a
    ``prompt_len``-token prompt."""
    if not isinstance(generate, int) or generate < 1:
        raise ValueError(f"--generate must be at least 1 token, not {generate}")
    if prompt_len < 1:
        raise ValueError("the prompt needs at least one token")
    context = prompt_len + generate - 1
    check_decode(cfg, context)
    if context > npu.attn_window:
        raise ConfigError(f"holds {npu.attn_window} keys: a context of {context} tokens "
                          f"(prompt {prompt_len} + {generate} generated - 1) does not fit the "
                          "attention buffer", path=npu.path, key="attn_window",
                          value=npu.attn_window)
    if prompt_len > npu.max_seq_len:
        raise ConfigError(f"is {npu.max_seq_len}: a prompt of {prompt_len} tokens exceeds it",
                          path=npu.path, key="max_seq_len", value=npu.max_seq_len)


def compile_decode(npu: NpuConfig, qm: QModel, head: QHead, *, prompt_len: int,
                   generate: int, chips: int = 1, check: bool = True) -> DecodeProgram:
    """The programs that generate ``generate`` tokens after a ``prompt_len``-token prompt on
    ``chips`` chips (module docstring): one chip, or head parallelism (each chip its heads'
    share of every block and their KV caches, the partial sums all-reduced as in a prefill;
    the whole embedding on every chip; the LM head's columns split, the logits all-gathered so
    that every chip picks the same token). The transfer bank
    (:class:`~sim.compiler.alloc.Allocator`) holds the tables read beside a matmul when there
    is room."""
    check_generate(npu, qm.cfg, prompt_len, generate)
    if check and chips == 1:
        check_single_chip(npu, qm.cfg)
    if check and chips > 1:
        check_ring_port(npu, chips)
    try:
        return _compile(npu, qm, head, prompt_len, generate, check, chips=chips,
                        transfer_bank=True)
    except ConfigError as exc:
        if "regions overlap" not in str(exc):
            raise
        return _compile(npu, qm, head, prompt_len, generate, check, chips=chips,
                        transfer_bank=False)


def _vocab_split(npu: NpuConfig, vocab: int, chips: int) -> int:
    """Columns of the LM head on each of ``chips`` chips: the vocabulary padded to whole
    array blocks per chip and, split, to whole engine words per chip (the logits' all-gather
    is of int16 rows)."""
    n = npu.array_size
    if chips == 1:
        return pad_to(vocab, n)
    unit = math.lcm(n, word_bytes(npu.link_bytes_per_cycle) // 2)
    return pad_to(-(-vocab // chips), unit)


def _compile(npu, qm, head, prompt_len, generate, check, *, chips, transfer_bank):
    cfg, n = qm.cfg, npu.array_size
    P, context = prompt_len, prompt_len + generate - 1
    ctx_rows = pad_to(context, n) + n          # a step's fold writes N rows from its position
    shards = head_shards(cfg, chips) if chips > 1 else [Shard.whole(cfg)]
    vc = _vocab_split(npu, cfg.vocab_size, chips)
    out = [_chip(npu, qm, head, P, generate, chip, shard, chips, vc, ctx_rows, check,
                 transfer_bank) for chip, shard in enumerate(shards)]
    chip0 = out[0]
    return DecodeProgram(npu, qm, [c["program"] for c in out], P, generate,
                         [c["ids"] for c in out],
                         chip0["logits"], [c["caches"] for c in out],
                         [c["kv_bytes"] for c in out], [c["comms"] for c in out])


def _chip(npu, qm, head, P, generate, chip, shard, chips, vc, ctx_rows, check,
          transfer_bank) -> dict:
    """One chip's program: its heads' share of every block (all of it on one chip), the
    whole embedding, its ``vc`` columns of the LM head."""
    cfg, n = qm.cfg, npu.array_size
    context = P + generate - 1
    al, asm = Allocator(npu, transfer_bank=transfer_bank), Assembler()
    em = BlockEmitter(npu, qm, asm, al, seq=P, chip=chip)
    em.rope_span = (0, ctx_rows)
    weights = {i: em.place_layer(i, shard) for i in range(cfg.n_layers)}
    v_pad, d_pad = pad_to(cfg.vocab_size, n), em.d_pad
    v0 = chip * vc                              # the chip's first LM-head column

    # The head's tables.
    emb = QLinear(head.emb8, np.zeros(cfg.d_model, np.int64),
                  np.full(cfg.d_model, head.emb_req[0], np.int64),
                  np.full(cfg.d_model, head.emb_req[1], np.int64), OutMode.INT16)
    emb_w = em._linear("embed", lambda: emb, v_pad, d_pad)

    def lm_block():
        cols = np.arange(v0, min(v0 + vc, cfg.vocab_size))
        lm = head.lm
        return QLinear(lm.w[:, cols], lm.bias[cols], lm.mult[cols], lm.shift[cols], lm.mode)
    lm_w = em._linear("lm_head", lm_block, d_pad, vc)
    norm_gb = em._store("norm.gamma_beta", row_words(cfg.d_model, 4, n),
                        lambda: pack_rows(pack_gamma_beta(head.norm.gamma,
                                                          head.norm.beta)[None, :], 4, n))
    pos16 = None
    if learned_positions(cfg):
        pos_pad = pad_to(context, n)

        def pos_rows():
            rows = np.zeros((pos_pad, d_pad), np.int64)
            rows[:context, :cfg.d_model] = requant(head.pos8[:context], *head.pos_req, 16)
            return pack_rows(rows, 2, n)
        rw = row_words(d_pad, 2, n)
        block = em._store("pos16", pos_pad * rw, pos_rows)
        pos16 = dataclasses.replace(block, rows=pos_pad, cols=d_pad, eb=2, row_words=rw)

    # The caches, the token buffers and the working tensors.
    caches = [al.alloc(f"layers.{i}.cache", ctx_rows, em.qkv_width(shard), 1, "kv_cache")
              for i in range(cfg.n_layers)]
    aw = argmax_words(n)
    ids = al.alloc("ids", P + generate, aw * n, 1, "activations", row_words_=aw)
    logits = al.alloc("logits", generate + n - 1, vc * chips, 2, "activations")
    e = al.alloc("onehot", em.seq_pad, v_pad, 1, "activations")
    x = em.alloc_residual("x", 1)
    hf = al.alloc("hf", n, d_pad, 1, "activations")
    acts = em.alloc_activations(em.seq_pad, shard, qkv=caches[0])
    if check:
        al.check_capacity()
    kv_heads = em.kv_heads(shard)
    kv_bytes = 2 * cfg.n_layers * context * len(kv_heads) * cfg.d_head

    def rows_of(t: Tensor, first: int, count: int) -> vl.Rows:
        return vl.Rows(t.base + first * t.row_words, count, t.row_words, t.eb)

    def view(t: Tensor, first: int, count: int) -> Tensor:
        return dataclasses.replace(t, base=t.base + first * t.row_words, rows=count)

    hcount = len(shard.heads)
    q_words = hcount * em.dh_pad // n
    kv_words = len(kv_heads) * em.dh_pad // n
    vc_words = row_words(vc, 2, n)
    group = shard.group

    def attend(a: Assembler, i: int, cache: Tensor, pos: int, queries: int):
        """Attention of the cache's rows ``pos .. pos + queries - 1`` over its rows
        ``0 .. pos + queries - 1`` (every head of the chip)."""
        L = qm.layers[i]
        keys = max(pos + queries, 2)          # the softmax takes 2 lanes or more (masked)
        for k in range(hcount):
            g = kv_heads.index(shard.heads[k] // cfg.kv_group)
            al_.emit(a, al_.attention_launch(
                size=n, d_head=em.dh_pad, queries=queries, keys=keys,
                q_base=cache.base + pos * cache.row_words, k_base=cache.base + q_words,
                v_base=cache.base + q_words + kv_words, o_base=acts.o.base,
                q_row_words=cache.row_words, k_row_words=cache.row_words,
                v_row_words=cache.row_words, o_row_words=acts.o.row_words,
                col=k * em.dh_pad, kv_col=g * em.dh_pad, q_pos=pos, k_pos=0,
                bidirectional=False, interleaved=False, halo=0, window=cfg.window,
                score_mult=L.score_mult, score_shift=L.score_shift, out_mult=L.out_mult,
                out_shift=L.out_shift), ("attn", i))

    def token_pass(a: Assembler, pos: int, rows: int, e_rows: vl.Rows, ids_in: int,
                   last: int, t_out: int):
        """Embed ``rows`` tokens at positions ``pos ..``, run every block, and pick the next
        token from the row ``last`` of ``x``: its logits to row ``t_out``, its id to
        ``ids[pos + rows]``."""
        seq_pad = pad_to(rows, n)
        step = em
        if rows != em.seq:
            step = dataclasses.replace(em, seq=rows)
            step._rope = em._rope if cfg.rope else None      # the tables placed once
        step.asm = em.asm = a
        vl.emit(a, vl.onehot_launch(size=n, length=cfg.vocab_size, record_base=ids_in,
                                    out=e_rows))
        a.wait(Unit.VEC)
        em._matmul(view(e, 0, seq_pad), emb_w, view(x, 0, seq_pad), v_pad, OutMode.INT16)
        a.wait(Unit.MATMUL)
        if pos16 is not None:
            vl.emit(a, vl.add_launch(size=n, length=cfg.d_model, a=rows_of(x, 0, rows),
                                     b=rows_of(pos16, pos, rows), out=rows_of(x, 0, rows)))
            a.wait(Unit.VEC)
        xs = view(x, 0, seq_pad)
        for i in range(cfg.n_layers):
            cache = caches[i]
            step.emit_block(i, weights[i], shard, dataclasses.replace(
                acts, qkv=view(cache, pos, seq_pad)), xs, 1, pos_base=pos,
                attend=lambda i=i, cache=cache: attend(a, i, cache, pos, rows))
        step.gather_residual(xs, shard, 1)
        vl.emit(a, vl.ln_launch(size=n, length=cfg.d_model, x=rows_of(x, last, 1),
                                gamma_beta_base=norm_gb.base, q=rows_of(hf, 0, 1),
                                gshift=head.norm.gshift, mult=head.norm.mult,
                                shift=head.norm.shift, rms=cfg.rmsnorm), ("ln", "final"))
        a.wait(Unit.VEC)
        row = logits.base + t_out * logits.row_words
        em._matmul(hf, lm_w, Tensor("logits.block", row + chip * vc_words, n, vc, 2,
                                    logits.row_words, "activations"), d_pad, OutMode.INT16)
        a.wait(Unit.MATMUL)
        if group is not None:
            # Every chip gets the whole row of logits: its block is at its place.
            em._row_collective("all_gather", shard, Tensor(
                "logits.row", row, chips, vc, 2, vc_words, "activations"), chips, None,
                "logits")
        vl.emit(a, vl.argmax_launch(size=n, length=cfg.vocab_size,
                                    x=rows_of(logits, t_out, 1),
                                    record_base=ids.base + (pos + rows) * aw))
        a.wait(Unit.VEC)

    token_pass(asm, 0, P, rows_of(e, 0, P), ids.base, P - 1, 0)
    step_comms = []

    def decode_step(a: Assembler, t: int):
        mark = len(em.comms)
        token_pass(a, P + t, 1, rows_of(e, 0, 1), ids.base + (P + t) * aw, 0, t + 1)
        if t == 0:
            step_comms.extend(em.comms[mark:])
        del em.comms[mark:]

    emit_affine(asm, decode_step, generate - 1)
    em.asm = asm
    role = {"layers": list(range(cfg.n_layers)), "heads": list(shard.heads),
            "vocab_columns": [v0, min(v0 + vc, cfg.vocab_size)]}
    if cfg.n_kv_heads != cfg.n_heads:
        role["kv_heads"] = kv_heads
    return {"program": finish(npu, ChipProgram(chip, asm, al, role=role), check=check),
            "ids": ids, "logits": logits, "caches": caches, "kv_bytes": kv_bytes,
            "comms": {"prefill": list(em.comms), "step": step_comms}}
