"""Greedy generation on chip: the prefill, then a counted loop of decode steps, no host
between tokens (the golden model is :mod:`sim.golden.decode`).

The host loads the weights, the head's tables and the prompts' token ids once (``B``
sequences of ``P`` tokens); the program runs each sequence's prefill (a loop over the
sequences), then ``n - 1`` decode steps of all ``B`` sequences at once, and the host reads
the ``n`` generated ids and int16 logit rows per sequence back at the end. Per block,
the QKV matmul writes its rows straight into that block's **cache**: ``[Q | K | V]`` rows,
position-major and sequence-minor (row ``p * B + b`` is sequence ``b`` at position ``p``), so
a step's ``B`` tokens are one contiguous fold and a prefill writes its sequence's rows with a
stride of ``B`` rows. Program (``t``: the step, ``p = P + t``)::

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
from dataclasses import dataclass, field

import numpy as np

from hw.spec import ConfigError, NpuConfig
from hw.spec.formats import OutMode
from hw.spec.isa import Unit
from hw.spec.memory import pack_rows, row_words, unpack_rows
from hw.spec.vector import argmax_words, pack_argmax, pack_gamma_beta, unpack_argmax

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
from .decode_quant import QHead
from .grid import head_shards, split_batch, stage_layers
from .program import ChipProgram, finish
from .quantize import QLinear, QModel

__all__ = ["DecodeProgram", "compile_decode", "check_generate", "strategy_axes",
           "DECODE_STRATEGIES",
           "GRID_STRATEGIES"]

#: The strategies generation compiles for.
DECODE_STRATEGIES = ("single", "head", "pipeline", "data", "head+pipeline", "data+head",
                     "data+pipeline")
#: The 2-D ones (``--grid AxB``).
GRID_STRATEGIES = ("head+pipeline", "data+head", "data+pipeline")


@dataclass
class DecodeProgram:
    """Every chip's generation program and where the inputs and outputs live."""

    npu: NpuConfig
    qm: QModel
    chips: list          #: :class:`~sim.compiler.program.ChipProgram` per chip
    prompt_len: int
    generate: int
    batch: int
    #: Per chip: the global indices of the sequences whose prompts it holds (loaded into
    #: ``prompts``) and of those whose ids and logits are read back from it (``outputs``).
    holds: list
    outputs: list
    #: Per chip: its sequences' prompts as argmax records, sequence-major (loaded; None on a
    #: chip that embeds no prompt).
    prompts: list
    #: Per chip: its sequences' generated ids as argmax records, step-major (None on a
    #: pipeline's middle stages).
    ids: list
    #: Per chip: its int16 logits, step-major rows of the padded vocabulary (and the rows of a
    #: fold's padding; None but on the chips that pick tokens).
    logits: list
    caches: list         #: per chip, per block: its ``[Q | K | V]`` rows (module docstring)
    #: Per chip: bytes of K and V its caches hold for the whole context (``P + n - 1``
    #: positions of each of its sequences).
    kv_bytes: list = field(default_factory=list)
    #: Per chip: the collectives of the prefill and of one decode step (``{"prefill", "step"}``).
    comms: list = field(default_factory=list)
    strategy: str = "single"
    #: The chips form pipelines: each stage picks one sequence's token at a time.
    pipelined: bool = False

    @property
    def context(self) -> int:
        return self.prompt_len + self.generate - 1

    @property
    def picker(self) -> int:
        """The chip whose ARGMAX launches pick the tokens that are read back first (the
        first chip with outputs: the last stage of a pipeline)."""
        return next(c for c, seqs in enumerate(self.outputs) if seqs)

    @property
    def picks_per_step(self) -> int:
        """The picker's ARGMAX launches per step: one for all its sequences, or in a pipeline
        one per sequence."""
        return len(self.outputs[self.picker]) if self.pipelined else 1

    @property
    def programs(self) -> list[list[int]]:
        return [c.program for c in self.chips]

    def images(self, prompts) -> list[dict[int, np.ndarray]]:
        """Every chip's initial memory: its weights and tables, and its sequences' prompts
        (``prompts``: ``[B, P]`` ids)."""
        n = self.npu.array_size
        prompts = np.asarray(prompts, np.int64).reshape(self.batch, self.prompt_len)
        out = []
        for c, t, seqs in zip(self.chips, self.prompts, self.holds, strict=True):
            image = dict(c.images)
            if seqs:
                ids = prompts[seqs].reshape(-1)
                image[t.base] = pack_argmax(ids, np.zeros_like(ids), n).reshape(-1, n)
            out.append(image)
        return out

    def reads(self) -> list[list[tuple[int, int]]]:
        """Per chip, the ``(base, words)`` regions to read back: its ids, then its logits
        (none on a chip without outputs)."""
        out = []
        for seqs, ids, logits in zip(self.outputs, self.ids, self.logits, strict=True):
            rows = self.generate * len(seqs)
            out.append([(ids.base, ids.words), (logits.base, rows * logits.row_words)]
                       if seqs else [])
        return out

    def read(self, regions) -> dict:
        """``ids`` [B, n] (the generated) and ``logits`` [B, n, vocab] from each chip's words
        :meth:`reads` asked for."""
        n, cfg = self.npu.array_size, self.qm.cfg
        ids = np.zeros((self.batch, self.generate), np.int64)
        logits = np.zeros((self.batch, self.generate, cfg.vocab_size), np.int64)
        for seqs, words, t, rec in zip(self.outputs, regions, self.logits, self.ids,
                                       strict=True):
            if not seqs:
                continue
            b = len(seqs)
            records = np.asarray(words[0], np.uint8).reshape(-1, rec.row_words,
                                                             n)[:, :argmax_words(n)]
            got, _ = unpack_argmax(records)
            ids[seqs] = got.reshape(self.generate, b).T
            rows = unpack_rows(words[1], self.generate * b, t.cols, 2)
            logits[seqs] = rows[:, :cfg.vocab_size].reshape(self.generate, b,
                                                             -1).transpose(1, 0, 2)
        return {"ids": ids, "logits": logits}


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
                   generate: int, batch: int = 1, chips: int = 1, strategy: str | None = None,
                   grid: tuple[int, int] | None = None, check: bool = True,
                   contents: bool = True) -> DecodeProgram:
    """The programs that generate ``generate`` tokens after a ``prompt_len``-token prompt on
    ``chips`` chips (module docstring): one chip, or head parallelism (each chip its heads'
    share of every block and their KV caches, the partial sums all-reduced as in a prefill;
    the whole embedding on every chip; the LM head's columns split, the logits all-gathered so
    that every chip picks the same token); or data parallelism (``strategy="data"``: the
    sequences split over the chips, each chip the whole model and its own sequences, no
    communication); or ``head+pipeline`` on ``grid = (A, B)``: B stages of A head shards each
    (chip ``s * A + h``), each stage a head group, shard ``h`` of a stage sending to shard ``h``
    of the next and the last stage's shard ``h`` its tokens to the first stage's.
    ``strategy`` defaults to single on one chip, head on several. ``batch``
    sequences of ``prompt_len`` tokens
    decode together; ``contents=False`` places the weights without their contents (the
    planner's shapes-only compile: ``qm`` and ``head`` need no arrays). The transfer bank
    (:class:`~sim.compiler.alloc.Allocator`) holds the tables read beside a matmul when there
    is room."""
    check_generate(npu, qm.cfg, prompt_len, generate)
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
        check_single_chip(npu, qm.cfg)
    if check and chips > 1:
        check_ring_port(npu, chips)
    try:
        return _compile(npu, qm, head, prompt_len, generate, batch, check, contents,
                        chips=chips, strategy=strategy, axes=axes, transfer_bank=True)
    except ConfigError as exc:
        if "regions overlap" not in str(exc):
            raise
        return _compile(npu, qm, head, prompt_len, generate, batch, check, contents,
                        chips=chips, strategy=strategy, axes=axes, transfer_bank=False)


def _vocab_split(npu: NpuConfig, vocab: int, chips: int) -> int:
    """Columns of the LM head on each of ``chips`` chips: the vocabulary padded to whole
    array blocks per chip and, split, to whole engine words per chip (the logits' all-gather
    is of int16 rows)."""
    n = npu.array_size
    if chips == 1:
        return pad_to(vocab, n)
    unit = math.lcm(n, npu.ring_word_bytes // 2)
    return pad_to(-(-vocab // chips), unit)


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
            "data": (chips, 1, 1)}[strategy]


def _compile(npu, qm, head, prompt_len, generate, batch, check, contents, *, chips, strategy,
             axes, transfer_bank):
    """Every chip of ``axes`` = (replicas, stages, shards): replica ``r``'s stage ``s``'s
    shard ``h`` is chip ``(r * stages + s) * shards + h`` (the grid compiler's order)."""
    cfg = qm.cfg
    replicas, count, shards = axes
    stages = stage_layers(cfg, count)
    vc = _vocab_split(npu, cfg.vocab_size, shards)
    out, holds, outputs = [], [], []
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
                # The first stage embeds the prompts; the last stage's first shard is read.
                holds.append(list(seqs) if s == 0 or not piped else [])
                outputs.append(list(seqs) if s == count - 1 and h == 0 else [])
    return DecodeProgram(npu, qm, [c["program"] for c in out], prompt_len, generate, batch,
                         holds, outputs, [c["prompts"] for c in out], [c["ids"] for c in out],
                         [c["logits"] for c in out], [c["caches"] for c in out],
                         [c["kv_bytes"] for c in out], [c["comms"] for c in out], strategy,
                         pipelined=count > 1)


def _chip(npu, qm, head, P, generate, B, chip, shard, chips, vc, check, contents,
          transfer_bank, layers=None, prev=None, nxt=None, last=None, home=0) -> dict:
    """One chip's program: its heads' share of every block (all of it on one chip), the
    whole embedding, its ``vc`` columns of the LM head. A pipeline stage (``layers``, the
    chips ``prev`` and ``nxt`` it receives from and sends to; None at the ends): its layers,
    the embedding on the first stage, the final norm and the LM head on the last (chip
    ``last``, which sends each token back to the first stage's chip ``home``), one sequence
    at a time (module docstring); with a head ``shard`` of a group of ``chips``, the group's
    collectives as under head parallelism."""
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
    al, asm = Allocator(npu, transfer_bank=transfer_bank), Assembler()
    em = BlockEmitter(npu, qm, asm, al, seq=P, chip=chip, contents=contents)
    em.rope_span = (0, max(p_pad, context + n))
    weights = {i: em.place_layer(i, shard) for i in layers}
    v_pad, d_pad = pad_to(cfg.vocab_size, n), em.d_pad
    # The chip's block of the LM head's columns: its place in its head group.
    part = chip - shard.group[0] if shard.group is not None else 0
    v0 = part * vc

    # The head's tables.
    def emb():
        d = cfg.d_model
        mult, shift = (np.broadcast_to(np.asarray(v, np.int64), (d,)) for v in head.emb_req)
        return QLinear(head.emb8, np.zeros(d, np.int64), mult, shift, OutMode.INT16)
    emb_w = em._linear("embed", emb, v_pad, d_pad) if first_stage else None

    def lm_block():
        cols = np.arange(v0, min(v0 + vc, cfg.vocab_size))
        lm = head.lm
        return QLinear(lm.w[:, cols], lm.bias[cols], lm.mult[cols], lm.shift[cols], lm.mode)
    lm_w = norm_gb = norm_req = None
    if last_stage and head.norm_req is not None:
        norm_req = em._requant_params("norm.requant", lambda: head.norm_req)
    if last_stage:
        lm_w = em._linear("lm_head", lm_block, d_pad, vc)
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
        e = al.alloc("onehot", rows_max, v_pad, 1, "activations")
    if first_stage or last_stage:
        ids = al.alloc("ids", generate * B, rs * n, 1, "activations", row_words_=rs,
                       transfer=piped)
    if last_stage:
        logits = al.alloc("logits", (generate - 1) * B + pad_to(fold_rows, n) + B - fold_rows,
                          vc * chips, 2, "activations")
        hf = al.alloc("hf", pad_to(fold_rows, n), d_pad, 1, "activations")
    x_rw = row_words(d_pad, 2, n)
    xs = [em.alloc_residual(f"x{b}", 1, multiple=pl.message_words(x_rw, n, link),
                            transfer=True) for b in range(B)] if piped else \
        [al.alloc("x", rows_max, d_pad, 2, "activations")]
    acts = em.alloc_activations(rows_max, shard, qkv=caches[layers[0]])
    if check:
        al.check_capacity()
    kv_heads = em.kv_heads(shard)
    kv_bytes = 2 * len(layers) * context * B * len(kv_heads) * cfg.d_head

    def rows_of(t: Tensor, first: int, count: int) -> vl.Rows:
        return vl.Rows(t.base + first * t.row_words, count, t.row_words, t.eb)

    def view(t: Tensor, first: int, count: int, stride: int = 1) -> Tensor:
        return dataclasses.replace(t, base=t.base + first * t.row_words, rows=count,
                                   row_words=t.row_words * stride)

    hcount = len(shard.heads)
    q_words = hcount * em.dh_pad // n
    kv_words = len(kv_heads) * em.dh_pad // n
    vc_words = row_words(vc, 2, n)
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
                size=n, d_head=em.dh_pad, queries=queries, keys=keys,
                q_base=cache.base + q_row * rw, k_base=seq_base + q_words,
                v_base=seq_base + q_words + kv_words, o_base=acts.o.base + o_row *
                acts.o.row_words, q_row_words=B * rw, k_row_words=B * rw, v_row_words=B * rw,
                o_row_words=acts.o.row_words, col=k * em.dh_pad, kv_col=g * em.dh_pad,
                q_pos=pos, k_pos=0, bidirectional=False, interleaved=False, halo=0,
                window=cfg.window, score_mult=L.score_mult, score_shift=L.score_shift,
                out_mult=L.out_mult, out_shift=L.out_shift), ("attn", i))

    def embed(a: Assembler, step: BlockEmitter, rows: int, record: int,
              pos: vl.Rows | None, x: Tensor):
        """The one-hot rows of ``rows`` records from ``record``, their embedding into ``x``
        and the learned positions ``pos`` added."""
        folds = pad_to(rows, n)
        vl.emit(a, vl.onehot_launch(size=n, length=cfg.vocab_size, record_base=record,
                                    out=rows_of(e, 0, rows)))
        a.wait(Unit.VEC)
        step._matmul(view(e, 0, folds), emb_w, view(x, 0, folds), v_pad, OutMode.INT16)
        a.wait(Unit.MATMUL)
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
        """The LM head of ``hf``'s ``rows`` rows into the logits rows from ``first``, every
        chip's columns gathered, and their tokens' records from ``ids[first]``."""
        block = Tensor("logits.block", logits.base + first * logits.row_words + part * vc_words,
                       pad_to(rows, n), vc, 2, logits.row_words, "activations")
        step._matmul(hf, lm_w, block, d_pad, OutMode.INT16)
        a.wait(Unit.MATMUL)
        if shard.group is not None:
            for b in range(rows):     # each row: every chip's block at its place
                row = logits.base + (first + b) * logits.row_words
                step._row_collective("all_gather", shard, Tensor(
                    "logits.row", row, chips, vc, 2, vc_words, "activations"), chips, None,
                    "logits")
        if rows > 1 and rs != aw:
            raise AssertionError("an ARGMAX of several rows writes records of its own size")
        vl.emit(a, vl.argmax_launch(size=n, length=cfg.vocab_size,
                                    x=rows_of(logits, first, rows),
                                    record_base=ids.base + first * rs))
        a.wait(Unit.VEC)

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
            blocks(step, B, pos, lambda i: view(caches[i], pos * B, b_pad), attention, True,
                   xs[0])
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
            "vocab_columns": [v0, min(v0 + vc, cfg.vocab_size)], "sequences": B}
    if cfg.n_kv_heads != cfg.n_heads:
        role["kv_heads"] = kv_heads
    return {"program": finish(npu, ChipProgram(chip, asm, al, role=role), check=check),
            "prompts": prompts, "ids": ids, "logits": logits, "caches": list(caches.values()),
            "kv_bytes": kv_bytes, "comms": {"prefill": list(em.comms), "step": step_comms}}
