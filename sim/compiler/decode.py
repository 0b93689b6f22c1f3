"""Greedy generation on chip: the prefill, then a counted loop of decode steps, no host
between tokens (the golden model is :mod:`sim.golden.decode`).

The host loads the weights, the head's tables and the prompts' token ids once (``B``
sequences of ``P`` tokens); the program runs each sequence's prefill (a loop over the
sequences), then ``n - 1`` decode steps of all ``B`` sequences at once, and the host reads
the ``n`` generated ids and int16 logit rows per sequence back at the end. Per block,
the QKV matmul writes its rows straight into that block's **cache**: ``[Q | K | V]`` rows
(heads packed as :class:`sim.compiler.blocks.QkvLayout` lays them out), position-major and
sequence-minor (row ``p * B + b`` is sequence ``b`` at position ``p``), so a step's ``B`` tokens are
one contiguous fold and a prefill writes its sequence's rows with a stride of ``B`` rows. Program
(``t``: the step, ``p = P + t``)::

    LOOP B times, sequence b:
        VEC  ONEHOT   ids[0 .. P-1, b]         -> e (int8 one-hot rows)
        MM   EMBED    e @ E8, emb_req          -> x (int16)
        VEC  ADD      x + pos16[0 .. P-1]      -> x (learned positions)
        blocks (sim.compiler.blocks) over its P rows, QKV rows into cache rows r * B + b
        VEC  LN       x[P-1]                   -> hf[b] (the final norm, int8)
    MM   LM       hf @ W_lm                    -> logits[0, 0 .. B-1]
    VEC  ARGMAX   logits[0, b]                 -> ids[P, b]
    LOOP n - 1 times:
        VEC  ONEHOT   ids[p, 0 .. B-1]         -> e
        MM   EMBED    e @ E8                   -> x
        VEC  ADD      x + pos16[p]             -> x
        blocks over the B rows (folds of N), QKV rows into cache rows p * B .. p * B + B - 1,
            per sequence and head an attention of its row over its cache rows 0 .. p
        VEC  LN       x                        -> hf
        MM   LM       hf @ W_lm                -> logits[t + 1, 0 .. B-1]
        VEC  ARGMAX   logits[t + 1, b]         -> ids[p + 1, b]
    HALT

The embedding lookup is a matmul of the token's one-hot row with the int8 table, requantised
per column by ``emb_req``: the int32 product is the table's row exactly, so ``x`` is
``REQUANT(E8[t], emb_req, 16)`` (:func:`sim.golden.decode.embed_int`) bit for bit, with
cycles that do not depend on the token. Learned positions are stored as the int16 table
``REQUANT(P8, pos_req, 16)`` (the same integers the golden adds). A step's matmuls run over
whole folds of ``N`` rows, of which the first ``B`` are the tokens (the rows below them
compute what they compute and are overwritten before any attention reads them): up to ``N``
sequences decode for the weight reads of one. The step's addresses and lengths are affine in
``t`` (:func:`sim.compiler.affine.emit_affine`), so the program's length does not depend on
``n``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from hw.spec import ConfigError, NpuConfig
from hw.spec.formats import OutMode
from hw.spec.isa import Unit
from hw.spec.memory import pack_rows, row_words
from hw.spec.vector import argmax_words, pack_gamma_beta

from ..golden.decode import check_decode, learned_positions
from ..golden.matmul import requant
from . import attention_launch as al_
from . import p2p_launch as pl
from . import vector_launch as vl
from .affine import emit_affine
from .alloc import Allocator, Tensor
from .assembler import Assembler
from .blocks import BlockEmitter, Shard, pad_to
from .compat import check_ring_port, check_single_chip
from .decode_hidden import compile_hidden_decode
from .decode_program import DecodeProgram
from .decode_quant import QHead
from .decode_split import SplitChip, check_split, kv_chunks
from .grid import head_shards, split_batch, stage_layers
from .pick import block_argmax, combine_argmax, records_block, vocab_block
from .program import ChipProgram, finish
from .quantize import QLinear, QModel

__all__ = ["DecodeProgram", "compile_decode", "check_generate", "strategy_axes",
           "DECODE_STRATEGIES",
           "GRID_STRATEGIES"]

#: The strategies generation compiles for.
DECODE_STRATEGIES = ("single", "head", "pipeline", "data", "hidden", "sequence",
                     "head+pipeline", "data+head", "data+pipeline")
#: The 2-D ones (``--grid AxB``).
GRID_STRATEGIES = ("head+pipeline", "data+head", "data+pipeline")


def check_generate(npu: NpuConfig, cfg, prompt_len: int, generate: int, *,
                   split_chips: int = 0):
    """ValueError (one line) unless one chip can generate ``generate`` tokens after a
    ``prompt_len``-token prompt (``split_chips``: the KV cache split over that many chips,
    ``sim.compiler.decode_split``)."""
    if not isinstance(generate, int) or generate < 1:
        raise ValueError(f"--generate must be at least 1 token, not {generate}")
    if prompt_len < 1:
        raise ValueError("the prompt needs at least one token")
    context = prompt_len + generate - 1
    check_decode(cfg, context)
    if split_chips:
        check_split(npu, cfg, prompt_len, generate, split_chips)
    elif context > npu.attn_window:
        raise ConfigError(f"holds {npu.attn_window} keys: a context of {context} tokens "
                          f"(prompt {prompt_len} + {generate} generated - 1) does not fit one "
                          "chip's attention buffer (--strategy sequence splits the KV cache "
                          f"over {math.ceil(context / npu.attn_window)} chips)", path=npu.path,
                          key="attn_window", value=npu.attn_window)
    if prompt_len > npu.max_seq_len:
        raise ConfigError(f"is {npu.max_seq_len}: a prompt of {prompt_len} tokens exceeds it",
                          path=npu.path, key="max_seq_len", value=npu.max_seq_len)


def compile_decode(npu: NpuConfig, qm: QModel, head: QHead, *, prompt_len: int,
                   generate: int, batch: int = 1, chips: int = 1, strategy: str | None = None,
                   grid: tuple[int, int] | None = None, check: bool = True,
                   contents: bool = True) -> DecodeProgram:
    """The programs that generate ``generate`` tokens after a ``prompt_len``-token prompt on
    ``chips`` chips (module docstring): one chip, or head parallelism (each chip its heads'
    share of every block and their KV caches, the partial sums all-reduced as in a prefill; the
    embedding's rows and the LM head's columns split in the same vocabulary blocks, the
    embeddings all-reduced and the picks combined so that every chip picks the same token); or
    data parallelism (``strategy="data"``: the sequences split over the chips, each chip the
    whole model and its own sequences, no communication); or ``head+pipeline`` on ``grid = (A,
    B)``: B stages of A head shards each (chip ``s * A + h``), each stage a head group, shard
    ``h`` of a stage sending to shard ``h`` of the next and the last stage's shard ``h`` its
    tokens to the first stage's. ``strategy`` defaults to single on one chip, head on several.
    ``batch`` sequences of ``prompt_len`` tokens decode together; ``contents=False`` places the
    weights without their contents (the planner's shapes-only compile: ``qm`` and ``head`` need
    no arrays). The transfer bank (:class:`~sim.compiler.alloc.Allocator`) holds the tables read
    beside a matmul when there is room."""
    check_generate(npu, qm.cfg, prompt_len, generate,
                   split_chips=chips if strategy == "sequence" else 0)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"the batch must be at least 1 sequence, not {batch}")
    strategy = strategy or ("single" if chips == 1 else "head")
    if strategy not in DECODE_STRATEGIES:
        raise ValueError(f"generation runs strategy {', '.join(DECODE_STRATEGIES)}, not "
                         f"{strategy}")
    axes = strategy_axes(strategy, chips, grid)
    if axes[0] > batch:
        raise ValueError(f"data parallelism of {axes[0]} replicas needs a batch of at least "
                         f"{axes[0]} sequences, not {batch}")
    if check and axes[1:] == (1, 1):
        # Split-KV decode runs a prompt beyond the ring in passes.
        check_single_chip(npu, qm.cfg, passes=strategy == "sequence")
    if check and chips > 1:
        check_ring_port(npu, chips)
    if strategy == "hidden":
        return compile_hidden_decode(npu, qm, head, prompt_len=prompt_len, generate=generate,
                                     batch=batch, chips=chips,
                                     vocab_columns=_vocab_split(npu, qm.cfg.vocab_size, chips),
                                     check=check, contents=contents)
    try:
        return _compile(npu, qm, head, prompt_len, generate, batch, check, contents,
                        chips=chips, strategy=strategy, axes=axes, transfer_bank=True)
    except ConfigError as exc:
        if "regions overlap" not in str(exc):
            raise
        return _compile(npu, qm, head, prompt_len, generate, batch, check, contents,
                        chips=chips, strategy=strategy, axes=axes, transfer_bank=False)


def _vocab_split(npu: NpuConfig, vocab: int, chips: int) -> int:
    """Columns of the LM head on each of ``chips`` chips: the vocabulary split in blocks of
    whole array blocks (the last chips' blocks may hold padding, or only padding)."""
    return pad_to(-(-vocab // chips), npu.array_size)


def strategy_axes(strategy: str, chips: int, grid) -> tuple[int, int, int]:
    """``(replicas, stages, shards)`` of ``strategy`` on ``chips`` chips (``grid``: the A x B
    of a 2-D strategy, A the first part's)."""
    if strategy in GRID_STRATEGIES:
        if grid is None or len(grid) != 2 or grid[0] * grid[1] != chips:
            raise ValueError(f"{strategy} needs a grid A x B of --chips {chips} chips, not "
                             f"{grid}")
        a, b = grid
        return {"head+pipeline": (1, b, a), "data+head": (a, 1, b),
                "data+pipeline": (a, b, 1)}[strategy]
    return {"single": (1, 1, 1), "head": (1, 1, chips), "pipeline": (1, chips, 1),
            "data": (chips, 1, 1), "hidden": (1, 1, chips), "sequence": (1, 1, 1)}[strategy]


def _compile(npu, qm, head, prompt_len, generate, batch, check, contents, *, chips, strategy,
             axes, transfer_bank):
    """Every chip of ``axes`` = (replicas, stages, shards): replica ``r``'s stage ``s``'s
    shard ``h`` is chip ``(r * stages + s) * shards + h`` (the grid compiler's order)."""
    cfg = qm.cfg
    replicas, count, shards = axes
    stages = stage_layers(cfg, count)
    vc = _vocab_split(npu, cfg.vocab_size, shards)
    if strategy == "sequence":
        # Split-KV decode: every chip the whole model and a chunk of the cache's positions.
        chunks = kv_chunks(prompt_len + generate - 1, chips)
        out = [_chip(npu, qm, head, prompt_len, generate, batch, c, Shard.whole(cfg), 1, vc,
                     check, contents, transfer_bank, split=(chunks, c)) for c in range(chips)]
        seqs = list(range(batch))
        mine = [seqs] + [[] for _ in range(chips - 1)]    # chip 0's ids and logits are read
        return DecodeProgram(npu, qm, [c["program"] for c in out], prompt_len, generate, batch,
                             [list(seqs) for _ in out], mine, [c["prompts"] for c in out],
                             [c["ids"] for c in out], [c["logits"] for c in out],
                             [c["caches"] for c in out], [c["kv_bytes"] for c in out],
                             [c["comms"] for c in out], strategy, logit_seqs=mine,
                             vocab=[c["vocab"] for c in out], kv_chunks=chunks)
    out, holds, outputs, logit_seqs = [], [], [], []
    for r, seqs in enumerate(split_batch(batch, replicas, "replicas (data parallelism)")):
        for s in range(count):
            first = (r * count + s) * shards
            group = head_shards(cfg, shards, first, chips) if shards > 1 else \
                [Shard.whole(cfg)]
            for h, shard in enumerate(group):
                piped = count > 1
                out.append(_chip(
                    npu, qm, head, prompt_len, generate, len(seqs), first + h, shard, shards,
                    vc, check, contents, transfer_bank, layers=stages[s],
                    prev=first - shards + h if s else None,
                    nxt=first + shards + h if s + 1 < count else None,
                    last=(r * count + count - 1) * shards + h, home=r * count * shards + h))
                # The first stage embeds the prompts; the last stage's first shard's ids are
                # read, and every shard's block of the logits.
                holds.append(list(seqs) if s == 0 or not piped else [])
                outputs.append(list(seqs) if s == count - 1 and h == 0 else [])
                logit_seqs.append(list(seqs) if s == count - 1 else [])
    return DecodeProgram(npu, qm, [c["program"] for c in out], prompt_len, generate, batch,
                         holds, outputs, [c["prompts"] for c in out], [c["ids"] for c in out],
                         [c["logits"] for c in out], [c["caches"] for c in out],
                         [c["kv_bytes"] for c in out], [c["comms"] for c in out], strategy,
                         pipelined=count > 1, logit_seqs=logit_seqs,
                         vocab=[c["vocab"] for c in out])


def _chip(npu, qm, head, P, generate, B, chip, shard, chips, vc, check, contents,
          transfer_bank, layers=None, prev=None, nxt=None, last=None, home=0,
          split=None) -> dict:
    """One chip's program: its heads' share of every block (all of it on one chip), its
    ``vc`` rows of the embedding and columns of the LM head (all of them on one chip). A
    pipeline stage (``layers``, the chips ``prev`` and ``nxt`` it receives from and sends
    to; None at the ends): its layers,
    the embedding on the first stage, the final norm and the LM head on the last (chip
    ``last``, which sends each token back to the first stage's chip ``home``), one sequence
    at a time (module docstring); with a head ``shard`` of a group of ``chips``, the group's
    collectives as under head parallelism. ``split``: ``(chunks, c)``, split-KV decode
    (``sim.compiler.decode_split``): the chip caches the positions ``chunks[c]``."""
    cfg, n = qm.cfg, npu.array_size
    layers = list(range(cfg.n_layers)) if layers is None else list(layers)
    piped = prev is not None or nxt is not None
    first_stage, last_stage = prev is None, nxt is None
    link = npu.link_bytes_per_cycle
    context = P + generate - 1
    p_pad, b_pad = pad_to(P, n), pad_to(B, n)
    # Cache rows: a prefill's rows r * B + b (r < p_pad); a step's fold of b_pad rows from
    # p * B, or in a pipeline each sequence's fold of N rows from p * B + b.
    cache_rows = max(p_pad * B, (context - 1) * B + (B - 1 + n if piped else b_pad))
    if split is not None:
        # Split-KV: the chunk's positions from its first, the last chip's step folds too.
        s0, e0 = split[0][split[1]]
        last_chip = split[1] == len(split[0]) - 1
        cache_rows = (e0 - s0) * B if not last_chip else \
            max((P - s0) * B, (context - 1 - s0) * B + b_pad)
    al, asm = Allocator(npu, transfer_bank=transfer_bank), Assembler()
    em = BlockEmitter(npu, qm, asm, al, seq=P, chip=chip, contents=contents)
    em.rope_span = (0, max(p_pad, context + n))
    weights = {i: em.place_layer(i, shard) for i in layers}
    d_pad = em.d_pad
    # The chip's block of the LM head's columns: its place in its head group.
    part = chip - shard.group[0] if shard.group is not None else 0
    v0, v1 = vocab_block(cfg.vocab_size, vc, part)

    # The head's tables. A head group shares the embedding by vocabulary rows, the blocks
    # of the LM head's columns: each chip's one-hot rows hold its block's lanes (all 0 for a
    # token outside it), its int32 products are the token's row or 0, and their all-reduce
    # is the row exactly, requantised per column as one chip would (``embed``).
    emb_split = shard.group is not None
    e0, e_rows = (v0, max(v1 - v0, 1)) if emb_split else (0, cfg.vocab_size)
    e_pad = pad_to(e_rows, n)
    d = cfg.d_model
    # One multiplier and shift, or one per lane (llm16c).
    emb_params = tuple(np.array(np.broadcast_to(np.asarray(v, np.int64), (d,)))
                       for v in head.emb_req)

    def emb():
        w = head.emb8 if not emb_split else np.zeros((e_rows, d), np.int64)
        if emb_split:
            w[:v1 - v0] = head.emb8[v0:v1]
        return QLinear(w, np.zeros(d, np.int64), *emb_params, OutMode.INT16)
    emb_w = emb_req = None
    if first_stage:
        emb_w = em._linear("embed", emb, e_rows, d)
        if emb_split:
            emb_req = em._requant_params("embed.requant", lambda: emb_params)

    def lm_block():
        cols = np.arange(v0, v1)
        lm = head.lm
        return QLinear(lm.w[:, cols], lm.bias[cols], lm.mult[cols], lm.shift[cols], lm.mode)
    lm_w = norm_gb = norm_req = None
    if last_stage and head.norm_req is not None:
        norm_req = em._requant_params("norm.requant", lambda: head.norm_req)
    if last_stage:
        lm_w = em._linear("lm_head", lm_block, cfg.d_model, vc)
        norm_gb = em._store("norm.gamma_beta", row_words(cfg.d_model, 4, n),
                            lambda: pack_rows(pack_gamma_beta(head.norm.gamma,
                                                              head.norm.beta)[None, :], 4, n))
    pos16 = None
    if learned_positions(cfg) and first_stage:
        pos_pad = max(p_pad, pad_to(context, n))

        def pos_rows():
            rows = np.zeros((pos_pad, d_pad), np.int64)
            rows[:context, :cfg.d_model] = requant(head.pos8[:context], *head.pos_req, 16)
            return pack_rows(rows, 2, n)
        rw = row_words(d_pad, 2, n)
        block = em._store("pos16", pos_pad * rw, pos_rows)
        pos16 = dataclasses.replace(block, rows=pos_pad, cols=d_pad, eb=2, row_words=rw)

    # The caches, the token buffers and the working tensors.
    caches = {i: al.alloc(f"layers.{i}.cache", cache_rows, em.qkv_width(shard), 1,
                          "kv_cache") for i in layers}
    aw = argmax_words(n)
    # A record a stage sends is whole ring words.
    rs = pl.message_words(aw, n, link) if piped else aw
    fold_rows = 1 if piped else B               # the rows of one step's fold
    rows_max = max(p_pad, pad_to(fold_rows, n))
    # Each stage holds what it uses: the prompts and one-hot rows on the first, the logits
    # and the final norm's rows on the last, the token records on both.
    prompts = e = logits = hf = ids = None
    if first_stage:
        prompts = al.alloc("prompts", P * B, aw * n, 1, "activations", row_words_=aw)
        e = al.alloc("onehot", rows_max, e_pad, 1, "activations")
    if first_stage or last_stage:
        ids = al.alloc("ids", generate * B, rs * n, 1, "activations", row_words_=rs,
                       transfer=piped)
    picks = None
    if last_stage:
        logits = al.alloc("logits", (generate - 1) * B + pad_to(fold_rows, n) + B - fold_rows,
                          vc, 2, "activations")
        hf = al.alloc("hf", pad_to(fold_rows, n), d_pad, 1, "activations")
        if shard.group is not None:
            # Every chip's argmax records of a pick, gathered side by side.
            picks = al.alloc("picks", chips * records_block(npu, fold_rows), n, 1,
                             "activations", row_words_=1)
    x_rw = row_words(d_pad, 2, n)
    xs = [em.alloc_residual(f"x{b}", 1, multiple=pl.message_words(x_rw, n, link),
                            transfer=True) for b in range(B)] if piped else \
        [al.alloc("x", rows_max, d_pad, 2, "activations")]
    acts = em.alloc_activations(rows_max, shard,
                                qkv=caches[layers[0]] if split is None else None)
    sp = None
    if split is not None:
        lay_ = em.qkv_layout(shard)
        srw = max(al_.state_row_words(cfg.d_head, lay_.q_col(k), n)
                  for k in range(cfg.n_heads))
        state = al.alloc("prefill.state", cfg.n_heads * npu.attn_window, 0, 1, "activations",
                         row_words_=srw) if npu.attn_window < P else None
        msg = pl.message_words(B * cfg.n_heads * srw, n, link)
        sbuf = al.alloc("split.state", 1, 0, 1, "activations", row_words_=msg, transfer=True)
        if pl.message_words(B * acts.o.row_words, n, link) > acts.o.words:
            raise AssertionError("the o rows' message is longer than the o tensor")
        sp = SplitChip(em, split[0], split[1], B, P, caches, acts, lay_, srw, state, sbuf)
    if check or al.high_word < 0:
        # Tensors below word 0 have no address to emit (a long prompt's activations): the
        # capacity check's refusal, also for a compile without it (the planner's cuts).
        al.check_capacity()
    kv_heads = em.kv_heads(shard)
    positions = context if sp is None else sp.own[1] - sp.own[0]
    kv_bytes = 2 * len(layers) * positions * B * len(kv_heads) * cfg.d_head

    def rows_of(t: Tensor, first: int, count: int) -> vl.Rows:
        return vl.Rows(t.base + first * t.row_words, count, t.row_words, t.eb)

    def view(t: Tensor, first: int, count: int, stride: int = 1) -> Tensor:
        return dataclasses.replace(t, base=t.base + first * t.row_words, rows=count,
                                   row_words=t.row_words * stride)

    hcount = len(shard.heads)
    lay = em.qkv_layout(shard)
    rw = caches[layers[0]].row_words

    def attend(a: Assembler, i: int, cache: Tensor, pos: int, queries: int, b: int,
               q_row: int, o_row: int):
        """Attention of sequence ``b``'s ``queries`` rows from position ``pos`` (the first in
        cache row ``q_row``, the output from ``o`` row ``o_row``) over its cache rows of
        positions ``0 .. pos + queries - 1`` (every head of the chip)."""
        L = qm.layers[i]
        keys = max(pos + queries, 2)          # the softmax takes 2 lanes or more (masked)
        seq_base = cache.base + b * rw        # sequence b's position 0
        for k in range(hcount):
            g = kv_heads.index(shard.heads[k] // cfg.kv_group)
            al_.emit(a, al_.attention_launch(
                size=n, d_head=cfg.d_head, queries=queries, keys=keys,
                q_base=cache.base + q_row * rw, k_base=seq_base, v_base=seq_base,
                o_base=acts.o.base + o_row * acts.o.row_words, q_row_words=B * rw,
                k_row_words=B * rw, v_row_words=B * rw, o_row_words=acts.o.row_words,
                col=lay.q_col(k), k_col=lay.k_col(g), v_col=lay.v_col(g),
                q_pos=pos, k_pos=0, bidirectional=False, interleaved=False, halo=0,
                window=cfg.window, score_mult=L.score_mult, score_shift=L.score_shift,
                out_mult=L.out_mult, out_shift=L.out_shift), ("attn", i))

    def embed(a: Assembler, step: BlockEmitter, rows: int, record: int,
              pos: vl.Rows | None, x: Tensor):
        """The one-hot rows of ``rows`` records from ``record``, their embedding into ``x``
        and the learned positions ``pos`` added."""
        folds = pad_to(rows, n)
        vl.emit(a, vl.onehot_launch(size=n, length=e_rows, record_base=record,
                                    out=rows_of(e, 0, rows), offset=e0))
        a.wait(Unit.VEC)
        if not emb_split:
            step._matmul(view(e, 0, folds), emb_w, view(x, 0, folds), e_pad, OutMode.INT16)
            a.wait(Unit.MATMUL)
        else:
            step._matmul(view(e, 0, folds), emb_w, Tensor(
                "p.rows", acts.p.base, folds, d_pad, 4, d_pad * 4 // n, "activations"), e_pad,
                OutMode.RAW)
            a.wait(Unit.MATMUL)
            step._reduce(shard, acts, rows, emb_req, view(x, 0, rows), None, "embedding")
        if pos16 is not None:
            vl.emit(a, vl.add_launch(size=n, length=cfg.d_model, a=rows_of(x, 0, rows),
                                     b=pos, out=rows_of(x, 0, rows)))
            a.wait(Unit.VEC)

    def blocks(step: BlockEmitter, rows: int, pos: int, qkv_at, attention, one_position,
               x: Tensor):
        xv = view(x, 0, pad_to(rows, n))
        for i in layers:
            step.emit_block(i, weights[i], shard, dataclasses.replace(acts, qkv=qkv_at(i)), xv,
                            1, pos_base=pos, attend=lambda i=i: attention(i),
                            one_position=one_position)
        step.gather_residual(xv, shard, 1)

    def final_norm(a: Assembler, first: int, rows: int, out: int, x: Tensor):
        src, q = rows_of(x, first, rows), rows_of(hf, out, rows)
        if norm_req is not None:
            # llm16c: the blocks' norm (BlockEmitter._ln), its copy in ``a``.
            y = rows_of(acts.a, 0, rows)
            vl.emit(a, vl.requant_launch(size=n, length=cfg.d_model, a=src, out=y,
                                         params_base=norm_req.base))
            a.wait(Unit.VEC)
            vl.emit(a, vl.ln_stats_launch(size=n, length=cfg.d_model, x=y,
                                          stats_base=acts.nrec.base))
            a.wait(Unit.VEC)
            vl.emit(a, vl.ln_apply_launch(
                size=n, length=cfg.d_model, n=head.norm_n, x=src, gamma_beta_base=norm_gb.base,
                stats_base=acts.nrec.base, q=q, gshift=head.norm.gshift, mult=head.norm.mult,
                shift=head.norm.shift, rms=True), ("ln", "final"))
            a.wait(Unit.VEC)
            return
        vl.emit(a, vl.ln_launch(size=n, length=cfg.d_model, x=src,
                                gamma_beta_base=norm_gb.base, q=q,
                                gshift=head.norm.gshift, mult=head.norm.mult,
                                shift=head.norm.shift, rms=cfg.rmsnorm), ("ln", "final"))
        a.wait(Unit.VEC)

    def pick(a: Assembler, step: BlockEmitter, first: int, rows: int):
        """The LM head of ``hf``'s ``rows`` rows into the logits rows from ``first`` (the
        chip's block of the vocabulary), and their tokens' records from ``ids[first]``: the
        ARGMAX of the row, or of a split vocabulary each chip's block's, the group's records
        gathered and combined (:mod:`sim.compiler.pick`)."""
        step._matmul(hf, lm_w, view(logits, first, pad_to(rows, n)), d_pad, OutMode.INT16)
        a.wait(Unit.MATMUL)
        if rows > 1 and rs != aw:
            raise AssertionError("an ARGMAX of several rows writes records of its own size")
        x = rows_of(logits, first, rows)
        if shard.group is None:
            vl.emit(a, vl.argmax_launch(size=n, length=cfg.vocab_size, x=x,
                                        record_base=ids.base + first * rs))
            a.wait(Unit.VEC)
            return
        block_argmax(npu, a, vocab=cfg.vocab_size, v0=v0, vc=vc, part=part, x=x,
                     picks=picks.base)
        blk = records_block(npu, rows)
        step._row_collective("all_gather", shard, Tensor("picks", picks.base, chips, blk * n,
                                                         1, blk, "activations"), chips, None,
                             "argmax records")
        combine_argmax(npu, a, vocab=cfg.vocab_size, vc=vc, chips=chips, rows=rows,
                       picks=picks.base, record_base=ids.base + first * rs)

    def emitter(a: Assembler, rows: int) -> BlockEmitter:
        step = em if rows == em.seq else dataclasses.replace(em, seq=rows)
        if step is not em:
            step._rope = em._rope if cfg.rope else None      # the tables placed once
        step.asm = em.asm = a
        return step

    pos_rows = (lambda p, k: rows_of(pos16, p, k)) if pos16 is not None else \
        (lambda p, k: None)
    prefill_comms, step_comms = [], []

    def once(a: Assembler, it: int, mark: int, into: list):
        """Keep one recording's collectives (a loop body records several)."""
        if it == 0:
            into.extend(em.comms[mark:])
        if a is not asm:
            del em.comms[mark:]

    def message(x: Tensor, rows: int):
        return pl.contiguous(x.base, pl.message_words(rows * x.row_words, n, link))

    def transfer(a: Assembler, launch, unit):
        pl.emit(a, launch)
        if unit is not None:
            a.wait(unit)

    def stage_in(a: Assembler, x: Tensor, rows: int):
        """A middle or last stage: receive the sequence's residual rows."""
        if B == 1:
            a.wait(Unit.SEND)          # the previous send of the one buffer is done
        transfer(a, pl.recv_launch(src=prev, desc=message(x, rows), size=n, link_bytes=link),
                 Unit.RECV)

    def stage_out(a: Assembler, x: Tensor, rows: int, last_row: int, first: int):
        """A stage's end of a sequence's slot: its ``rows`` residual rows to the next stage,
        or on the last stage its token: the final norm of row ``last_row``, the LM head and
        ARGMAX into ``ids[first]``, the record sent to the first stage."""
        if not last_stage:
            transfer(a, pl.send_launch(dest=nxt, desc=message(x, rows), size=n, link_bytes=link),
                     None)
            return
        final_norm(a, last_row, 1, 0, x)
        pick(a, em, first, 1)
        rec = pl.contiguous(ids.base + first * rs, rs)
        transfer(a, pl.send_launch(dest=home, desc=rec, size=n, link_bytes=link), None)

    if not piped:
        # The prefills, one sequence at a time (a loop over the sequences when there are
        # several): its rows r * B + b of every cache; then one pick of every sequence.
        def prefill(a: Assembler, b: int):
            mark = len(em.comms)
            step = emitter(a, P)
            embed(a, step, P, prompts.base + b * P * aw, pos_rows(0, P), xs[0])
            if sp is not None:
                blocks(step, P, 0, lambda i: view(acts.qkv, 0, p_pad),
                       lambda i: sp.prefill_attend(a, i, b), False, xs[0])
            else:
                blocks(step, P, 0, lambda i: view(caches[i], b, p_pad, B),
                       lambda i: attend(a, i, caches[i], 0, P, b, b, 0), False, xs[0])
            final_norm(a, P - 1, 1, b, xs[0])
            once(a, b, mark, prefill_comms)
    else:
        def prefill(a: Assembler, b: int):
            step = emitter(a, P)
            x = xs[b]
            if first_stage:
                if B == 1:
                    a.wait(Unit.SEND)
                embed(a, step, P, prompts.base + b * P * aw, pos_rows(0, P), x)
            else:
                stage_in(a, x, p_pad)
            blocks(step, P, 0, lambda i: view(caches[i], b, p_pad, B),
                   lambda i: attend(a, i, caches[i], 0, P, b, b, 0), False, x)
            stage_out(a, x, p_pad, P - 1, b)

    if piped:
        for b in range(B):      # unrolled: each sequence its own buffer
            prefill(asm, b)
    elif B == 1:
        prefill(asm, 0)
    else:
        emit_affine(asm, prefill, B)
    em.comms.extend(prefill_comms)
    em.asm = asm
    if not piped:
        pick(asm, em, 0, B)

    def decode_step(a: Assembler, t: int):
        pos = P + t
        mark = len(em.comms)
        if not piped:
            step = emitter(a, B)
            embed(a, step, B, ids.base + t * B * aw, pos_rows(pos, 1), xs[0])

            def attention(i):
                for b in range(B):
                    attend(a, i, caches[i], pos, 1, b, pos * B + b, b)
            if sp is not None:
                blocks(step, B, pos, lambda i: sp.step_qkv(i, pos, b_pad),
                       lambda i: sp.step_attend(a, i, pos), True, xs[0])
            else:
                blocks(step, B, pos, lambda i: view(caches[i], pos * B, b_pad), attention,
                       True, xs[0])
            final_norm(a, 0, B, 0, xs[0])
            pick(a, step, (t + 1) * B, B)
        else:
            step = emitter(a, 1)
            for b in range(B):
                x = xs[b]
                if first_stage:
                    # The token the last stage picked for this sequence.
                    transfer(a, pl.recv_launch(src=last, desc=pl.contiguous(
                        ids.base + (t * B + b) * rs, rs), size=n, link_bytes=link), Unit.RECV)
                    if B == 1:
                        a.wait(Unit.SEND)
                    embed(a, step, 1, ids.base + (t * B + b) * rs, pos_rows(pos, 1), x)
                else:
                    stage_in(a, x, 1)
                blocks(step, 1, pos, lambda i, b=b: view(caches[i], pos * B + b, n),
                       lambda i, b=b: attend(a, i, caches[i], pos, 1, b, pos * B + b, 0),
                       True, x)
                stage_out(a, x, 1, 0, (t + 1) * B + b)
        once(a, t, mark, step_comms)

    emit_affine(asm, decode_step, generate - 1)
    em.asm = asm
    if piped and first_stage:
        # The last step's tokens, which the last stage sends like every other.
        for b in range(B):
            transfer(asm, pl.recv_launch(src=last, desc=pl.contiguous(
                ids.base + ((generate - 1) * B + b) * rs, rs), size=n, link_bytes=link),
                Unit.RECV)
    role = {"layers": layers, "heads": list(shard.heads),
            "vocab_columns": [v0, v1], "sequences": B}
    if sp is not None:
        role["kv_positions"] = list(sp.own)
    if cfg.n_kv_heads != cfg.n_heads:
        role["kv_heads"] = kv_heads
    return {"program": finish(npu, ChipProgram(chip, asm, al, role=role), check=check),
            "prompts": prompts, "ids": ids, "logits": logits, "caches": list(caches.values()),
            "kv_bytes": kv_bytes, "comms": {"prefill": list(em.comms), "step": step_comms},
            "vocab": (v0, v1) if last_stage else None}
