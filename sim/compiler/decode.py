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
from dataclasses import dataclass

import numpy as np

from hw.spec import ConfigError, NpuConfig
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
from .compat import check_single_chip
from .decode_quant import QHead
from .program import ChipProgram, finish
from .quantize import QLinear, QModel

__all__ = ["DecodeProgram", "compile_decode", "check_generate"]


@dataclass
class DecodeProgram:
    """One chip's generation program and where its inputs and outputs live."""

    npu: NpuConfig
    qm: QModel
    chip: ChipProgram
    prompt_len: int
    generate: int
    ids: Tensor          #: ``P + n`` index words: the prompt's ids (loaded), then the generated
    logits: Tensor       #: ``n`` int16 rows of ``vocab`` (and ``N - 1`` rows of fold padding)
    caches: list         #: per block, its ``[Q | K | V]`` rows, one per position
    #: Bytes of K and V the caches hold for the whole context (``P + n - 1`` positions).
    kv_bytes: int = 0

    @property
    def context(self) -> int:
        return self.prompt_len + self.generate - 1

    def images(self, prompt) -> dict[int, np.ndarray]:
        """The chip's initial memory: the weights and tables, and the prompt's ids."""
        out = dict(self.chip.images)
        n = self.npu.array_size
        prompt = np.asarray(prompt, np.int64)
        out[self.ids.base] = pack_argmax(prompt, np.zeros_like(prompt), n).reshape(-1, n)
        return out

    def reads(self) -> list[tuple[int, int]]:
        """The ``(base, words)`` regions to read back: the ids, then the logits."""
        return [(self.ids.base, self.ids.words), (self.logits.base,
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
                   generate: int, check: bool = True) -> DecodeProgram:
    """The program that generates ``generate`` tokens after a ``prompt_len``-token prompt on
    one chip (module docstring). The transfer bank (:class:`~sim.compiler.alloc.Allocator`)
    holds the tables read beside a matmul when there is room."""
    check_generate(npu, qm.cfg, prompt_len, generate)
    if check:
        check_single_chip(npu, qm.cfg)
    try:
        return _compile(npu, qm, head, prompt_len, generate, check, transfer_bank=True)
    except ConfigError as exc:
        if "regions overlap" not in str(exc):
            raise
        return _compile(npu, qm, head, prompt_len, generate, check, transfer_bank=False)


def _compile(npu, qm, head, prompt_len, generate, check, *, transfer_bank):
    cfg, n = qm.cfg, npu.array_size
    P, context = prompt_len, prompt_len + generate - 1
    al, asm = Allocator(npu, transfer_bank=transfer_bank), Assembler()
    em = BlockEmitter(npu, qm, asm, al, seq=P, chip=0)
    ctx_rows = pad_to(context, n) + n          # a step's fold writes N rows from its position
    em.rope_span = (0, ctx_rows)
    shard = Shard.whole(cfg)
    weights = {i: em.place_layer(i, shard) for i in range(cfg.n_layers)}
    v_pad, d_pad = pad_to(cfg.vocab_size, n), em.d_pad

    # The head's tables.
    emb = QLinear(head.emb8, np.zeros(cfg.d_model, np.int64),
                  np.full(cfg.d_model, head.emb_req[0], np.int64),
                  np.full(cfg.d_model, head.emb_req[1], np.int64), OutMode.INT16)
    emb_w = em._linear("embed", lambda: emb, v_pad, d_pad)
    lm_w = em._linear("lm_head", lambda: head.lm, d_pad, v_pad)
    norm_gb = em._store("norm.gamma_beta", row_words(cfg.d_model, 4, n),
                        lambda: pack_rows(pack_gamma_beta(head.norm.gamma, head.norm.beta)[None, :],
                                                  4, n))
    pos16 = None
    if learned_positions(cfg):
        rows = np.zeros((pad_to(context, n), d_pad), np.int64)
        def pos_rows():
            rows[:context, :cfg.d_model] = requant(head.pos8[:context], *head.pos_req, 16)
            return pack_rows(rows, 2, n)
        pos16 = em._store("pos16", rows.shape[0] * row_words(d_pad, 2, n), pos_rows)
        pos16 = dataclasses.replace(pos16, rows=rows.shape[0], cols=d_pad, eb=2,
                                    row_words=row_words(d_pad, 2, n))

    # The caches, the token buffers and the working tensors.
    qkv_cols = em.qkv_width(shard)
    caches = [al.alloc(f"layers.{i}.cache", ctx_rows, qkv_cols, 1, "kv_cache")
              for i in range(cfg.n_layers)]
    aw = argmax_words(n)
    ids = al.alloc("ids", P + generate, aw * n, 1, "activations", row_words_=aw)
    logits = al.alloc("logits", generate + n - 1, v_pad, 2, "activations")
    e = al.alloc("onehot", em.seq_pad, v_pad, 1, "activations")
    x = em.alloc_residual("x", 1)
    hf = al.alloc("hf", n, d_pad, 1, "activations")
    acts = em.alloc_activations(em.seq_pad, shard, qkv=caches[0])
    if check:
        al.check_capacity()
    kv_heads = len(em.kv_heads(shard))
    kv_bytes = 2 * cfg.n_layers * context * kv_heads * cfg.d_head

    def rows_of(t: Tensor, first: int, count: int) -> vl.Rows:
        return vl.Rows(t.base + first * t.row_words, count, t.row_words, t.eb)

    def view(t: Tensor, first: int, count: int) -> Tensor:
        return dataclasses.replace(t, base=t.base + first * t.row_words, rows=count)

    hcount = len(shard.heads)
    kvs = em.kv_heads(shard)
    q_words = hcount * em.dh_pad // n
    kv_words = len(kvs) * em.dh_pad // n

    def attend(a: Assembler, i: int, cache: Tensor, pos: int, queries: int):
        """Attention of the cache's rows ``pos .. pos + queries - 1`` over its rows
        ``0 .. pos + queries - 1`` (every head)."""
        L = qm.layers[i]
        keys = max(pos + queries, 2)          # the softmax takes 2 lanes or more (masked)
        for k in range(hcount):
            g = kvs.index(shard.heads[k] // cfg.kv_group)
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
        em.asm = a
        seq_pad = pad_to(rows, n)
        vl.emit(a, vl.onehot_launch(size=n, length=cfg.vocab_size, record_base=ids_in,
                                    out=e_rows))
        a.wait(Unit.VEC)
        em._matmul(view(e, 0, seq_pad), emb_w, view(x, 0, seq_pad), v_pad, OutMode.INT16)
        a.wait(Unit.MATMUL)
        if pos16 is not None:
            vl.emit(a, vl.add_launch(size=n, length=cfg.d_model, a=rows_of(x, 0, rows),
                                     b=rows_of(pos16, pos, rows), out=rows_of(x, 0, rows)))
            a.wait(Unit.VEC)
        step = em
        if rows != em.seq:
            step = dataclasses.replace(em, seq=rows)
            step._rope = em._rope if cfg.rope else None      # the tables placed once
        step.asm = a
        for i in range(cfg.n_layers):
            cache = caches[i]
            qkv = view(cache, pos, seq_pad)
            step.emit_block(i, weights[i], shard, dataclasses.replace(acts, qkv=qkv),
                            view(x, 0, seq_pad), 1, pos_base=pos,
                            attend=lambda i=i, cache=cache: attend(a, i, cache, pos, rows))
        vl.emit(a, vl.ln_launch(size=n, length=cfg.d_model, x=rows_of(x, last, 1),
                                gamma_beta_base=norm_gb.base, q=rows_of(hf, 0, 1),
                                gshift=head.norm.gshift, mult=head.norm.mult,
                                shift=head.norm.shift, rms=cfg.rmsnorm), ("ln", "final"))
        a.wait(Unit.VEC)
        em._matmul(hf, lm_w, view(logits, t_out, n), d_pad, OutMode.INT16)
        a.wait(Unit.MATMUL)
        vl.emit(a, vl.argmax_launch(size=n, length=cfg.vocab_size,
                                    x=rows_of(logits, t_out, 1),
                                    record_base=ids.base + (pos + rows) * aw))
        a.wait(Unit.VEC)

    token_pass(asm, 0, P, rows_of(e, 0, P), ids.base, P - 1, 0)

    def decode_step(a: Assembler, t: int):
        pos = P + t
        token_pass(a, pos, 1, rows_of(e, 0, 1), ids.base + pos * aw, 0, t + 1)

    emit_affine(asm, decode_step, generate - 1)
    em.asm = asm
    chip = finish(npu, ChipProgram(0, asm, al, role={"layers": list(range(cfg.n_layers)),
                                                     "heads": list(shard.heads)}), check=check)
    return DecodeProgram(npu, qm, chip, P, generate, ids, logits, caches, kv_bytes)

