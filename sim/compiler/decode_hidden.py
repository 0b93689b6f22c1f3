"""Greedy generation under hidden-dimension parallelism (``--generate N --strategy hidden``).

The program of :mod:`sim.compiler.decode` (the prefill of each sequence, then a counted loop
of decode steps, no host between tokens) with d_model split over the chips as in
:mod:`sim.compiler.hidden`, whose phases emit the blocks (:meth:`~sim.compiler.hidden.
_Compiler.view`: the same weights and tensors over a prefill's ``P`` rows or a step's fold of
``B``). Chip c holds columns ``lo_c .. hi_c - 1`` of the residual stream:

- **The embedding** is chip c's columns of the table: the one-hot rows (every chip makes
  them from the same token records) times ``E8[:, lo_c:hi_c]`` give its columns of
  ``REQUANT(E8[t], emb_req, 16)``; the learned positions are its columns of the int16
  position table. No communication, and each chip stores a share of the table.
- **The KV cache** of each block is the QKV reduction's output, rows of ``[Q | K | V]`` (and
  ``[Q' | K']`` under RoPE) in the chip's own layout, position-major and sequence-minor like
  :mod:`sim.compiler.decode`'s: chip c caches the columns of K and V its head pieces read
  (its lanes of each head, a split head's too), so the cache splits by d_model with the
  projections. A step's attention reads the cached rows of positions ``0 .. p``: whole heads
  as usual, a split head by the two split-score passes and the all-reduce of its partial
  score rows (a slot per split head, the same in the prefill and the step).
- **The final norm** runs on partial statistics, as the blocks' norms: LN_STATS of the
  chip's columns of the last row, an int64 all-reduce, LN_APPLY with the global n.
- **The LM head** is a projection whose input is split by rows: chip c's
  ``hf[:, lo_c:hi_c] @ W_lm[lo_c:hi_c, :]`` is a partial sum of every logit, a reduce-scatter
  leaves chip c the sums of its block of the vocabulary (whole array blocks), which it
  requantises to int16; each chip ARGMAXes its block, the records are all-gathered and every
  chip combines them in ARGMAX's pair mode (:mod:`sim.compiler.pick`): the same token on
  every chip (lowest index on ties).

Per layer and step the collectives are the prefill's (2 norm all-reduces, 4 or 5 projection
reduce-scatters, one score all-reduce when a head is split) over a fold of the ``B``
sequences' rows (padded to ``N``), plus per step the final norm's all-reduce, the LM head's
reduce-scatter and the records' all-gather.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hw.spec import ConfigError, NpuConfig
from hw.spec.formats import OutMode
from hw.spec.isa import Unit
from hw.spec.memory import pack_rows, row_words
from hw.spec.vector import argmax_words, pack_gamma_beta

from ..golden.decode import learned_positions
from ..golden.matmul import requant
from . import attention_launch as al_
from . import vector_launch as vl
from .affine import emit_affine_chips
from .alloc import Tensor
from .blocks import BlockEmitter, pad_to
from .decode_program import DecodeProgram
from .decode_quant import QHead
from .descriptors import emit_matmul, matmul_launches
from .hidden import Span, _Compiler, check_hidden, hidden_plan
from .pick import block_argmax, combine_argmax, records_block, vocab_block
from .program import ChipProgram, finish
from .quantize import QLinear, QModel

__all__ = ["compile_hidden_decode"]


def compile_hidden_decode(npu: NpuConfig, qm: QModel, head: QHead, *, prompt_len: int,
                          generate: int, batch: int, chips: int, vocab_columns: int,
                          check: bool = True, contents: bool = True):
    """Every chip's generation program under hidden parallelism on ``chips`` chips (module
    docstring), as a :class:`~sim.compiler.decode_program.DecodeProgram`; ``vocab_columns``: each
    chip's block of the LM head's columns. ``check``: the shards' widths against the
    datapath (:func:`~sim.compiler.hidden.check_hidden`), the capacity and the program size;
    ``contents=False``: the planner's shapes-only compile."""
    cfg = qm.cfg
    if getattr(qm, "quant", "int8") != "int8":
        raise ValueError(f"--strategy hidden does not compile quant={qm.quant!r} yet (only "
                         "int8); use --quant int8")
    if chips < 2:
        raise ValueError(f"generation under hidden parallelism needs at least 2 chips, not "
                         f"{chips}")
    plan = check_hidden(npu, cfg, chips) if check else hidden_plan(npu, cfg, chips)
    args = (npu, qm, head, plan, prompt_len, generate, batch, vocab_columns, check, contents)
    try:
        out = _compile(*args, transfer_bank=True)
    except ConfigError as exc:
        if "regions overlap" not in str(exc):
            raise
        out = _compile(*args, transfer_bank=False)
    every = list(range(batch))
    return DecodeProgram(npu, qm, out["programs"], prompt_len, generate, batch,
                         [every] * chips, [every] + [[] for _ in range(chips - 1)],
                         out["prompts"], out["ids"], out["logits"], out["caches"],
                         out["kv_bytes"], out["comms"], "hidden", logit_seqs=[every] * chips,
                         vocab=[vocab_block(qm.cfg.vocab_size, vocab_columns, c)
                                for c in range(chips)])


def _compile(npu, qm, head, plan, P, generate, B, vc, check, contents, *, transfer_bank):
    cfg, n, chips = qm.cfg, npu.array_size, plan.chips
    L = cfg.n_layers
    context = P + generate - 1
    p_pad, b_pad = pad_to(P, n), pad_to(B, n)
    v_pad = pad_to(cfg.vocab_size, n)
    # The working tensors hold a prefill's rows or a step's fold, whichever is more; the
    # split heads' score slots hold max(P, B) query rows; RoPE's tables every position.
    comp = _Compiler(npu, qm, plan, seq=max(P, B), samples=1, reduce="reduce_scatter",
                     contents=contents, transfer_bank=transfer_bank,
                     rope_positions=max(p_pad, context))
    comp.place()
    # The LM head: a projection of the chip's d_model rows to every chip's vocabulary block.
    vocab = cfg.vocab_size
    comp.add_projection(
        "lm", [[v if v < vocab else -1 for v in range(c * vc, (c + 1) * vc)]
               for c in range(chips)], comp.inputs["qkv"], place=lambda c: head.lm)
    tables = [_place_tables(npu, qm, head, plan, ch, context, p_pad, v_pad, contents)
              for ch in comp.ch]
    comp.activations(qkv=False)
    aw = argmax_words(n)
    rows_max = max(p_pad, b_pad)
    cache_rows = max(p_pad * B, (context - 1) * B + b_pad)
    bufs = []
    for ch in comp.ch:
        al, wpad = ch.al, pad_to(plan.width(ch.c), n)
        caches = [al.alloc(f"layers.{i}.cache", cache_rows, len(comp.dest["qkv"][ch.c]), 1,
                           "kv_cache") for i in range(L)]
        bufs.append({
            "caches": caches,
            "prompts": al.alloc("prompts", P * B, aw * n, 1, "activations", row_words_=aw),
            "e": al.alloc("onehot", rows_max, v_pad, 1, "activations"),
            "ids": al.alloc("ids", generate * B, aw * n, 1, "activations", row_words_=aw),
            "logits": al.alloc("logits", (generate - 1) * B + b_pad, vc, 2, "activations"),
            # Every chip's argmax records of a pick, gathered side by side.
            "picks": al.alloc("picks", chips * records_block(npu, B), n, 1, "activations",
                              row_words_=1),
            "hf": al.alloc("hf", b_pad, wpad, 1, "activations")})
        ch.t["hf"] = bufs[-1]["hf"]
        if check:
            al.check_capacity()

    def rows_of(t: Tensor, first: int, count: int, stride: int = 1) -> Tensor:
        return dataclasses.replace(t, base=t.base + first * t.row_words, rows=count,
                                   row_words=t.row_words * stride)

    def embed(v: _Compiler, rows: int, records: str, first: int, pos: int, pos_rows: int):
        """Every chip's columns of the embedding of ``rows`` token records from record
        ``first`` of ``records`` ("prompts" or "ids") into "x", and ``pos_rows`` rows of the
        learned positions from ``pos`` added (one row: the same position for every row)."""
        for ch in v.ch:
            b, tb, x = bufs[ch.c], tables[ch.c], ch.t["x"]
            e = rows_of(b["e"], 0, rows)
            vl.emit(ch.asm, vl.onehot_launch(size=n, length=vocab,
                                             record_base=b[records].base + first * aw,
                                             out=comp._rows(e)))
            ch.asm.wait(Unit.VEC)
            emb = tb["embed"]          # the table stored unpadded (blocks.Linear)
            for launch in matmul_launches(
                    size=n, m=pad_to(rows, n), k=v_pad, n=emb.cols, a_base=e.base,
                    a_row_words=e.row_words, b_base=emb.w.base, p_base=emb.p.base,
                    c_base=x.base, c_row_words=x.row_words, mode=OutMode.INT16,
                    b_rows=emb.rows, packed=True):
                emit_matmul(ch.asm, launch)
            ch.asm.wait(Unit.MATMUL)
            if tb["pos16"] is not None:
                xs = comp._rows(rows_of(x, 0, rows))
                pr = comp._rows(rows_of(tb["pos16"], pos, pos_rows))
                vl.emit(ch.asm, vl.add_launch(size=n, length=plan.width(ch.c), a=xs, b=pr,
                                              out=xs))
                ch.asm.wait(Unit.VEC)

    def blocks(v: _Compiler, cache_view, span, rope_at):
        """Every layer on the view's rows: QKV into ``cache_view(cache)``, the attention of
        each sample at ``span(c, cache, s)``, RoPE's tables from ``rope_at``."""
        v.rope_at = rope_at
        for i in range(L):
            for ch in v.ch:
                ch.t["qkv"] = cache_view(bufs[ch.c]["caches"][i])
            v.span_of = lambda ch, s, i=i: span(ch.c, bufs[ch.c]["caches"][i], s)
            v.block(i)

    def span(c: int, cache: Tensor, b: int, pos: int, queries: int, q_row: int,
             o_row: int) -> Span:
        """Sequence ``b``'s ``queries`` rows from position ``pos`` (the first in cache row
        ``q_row``, the output from row ``o_row`` of "o") over its cached positions
        ``0 .. pos + queries - 1``."""
        rw = cache.row_words
        seq0 = cache.base + b * rw
        q, kv = plan.q_width(c), plan.kv_width(c)       # lanes: the pieces are packed
        o = comp.ch[c].t["o"]
        return Span(cache.base + q_row * rw, seq0, seq0, B * rw, o.base + o_row * o.row_words,
                    queries, max(pos + queries, 2), pos,    # the softmax takes 2 lanes or more
                    k_lane=q, v_lane=q + kv)

    def final_norm(v: _Compiler, first: int, rows: int, out: int):
        v.layer = None
        v.norm(head.norm, lambda ch: tables[ch.c]["norm"],
               lambda ch: rows_of(ch.t["x"], first, rows),
               lambda ch: rows_of(bufs[ch.c]["hf"], out, rows), lambda ch: None,
               tag=("ln", "final"), what="final norm statistics")

    def pick(v: _Compiler, first: int, rows: int):
        """The LM head of "hf"'s fold into the logits rows from ``first`` (each chip its
        vocabulary block), and the tokens of the ``rows`` rows picked from every chip's
        records (:mod:`sim.compiler.pick`) into ``ids[first]``, the same on
        every chip."""
        v.layer = None
        for ch in v.ch:
            ch.t["logits"] = rows_of(bufs[ch.c]["logits"], first, v.rows)
        v.project("lm", "hf", "logits")
        # Each chip's ARGMAX of its block, one all-gather of the records over all chips,
        # then every chip's combine (in lock step, phase by phase).
        x = {ch.c: comp._rows(rows_of(bufs[ch.c]["logits"], first, rows)) for ch in v.ch}
        for ch in v.ch:
            block_argmax(npu, ch.asm, vocab=vocab, v0=ch.c * vc, vc=vc, part=ch.c, x=x[ch.c],
                         picks=bufs[ch.c]["picks"].base)
        blk = records_block(npu, rows)
        v.collective((0, chips), lambda ch: [(bufs[ch.c]["picks"].base, chips * blk * n // 4)],
                     width=32, what="argmax records", kind="all_gather")
        for ch in v.ch:
            b = bufs[ch.c]
            combine_argmax(npu, ch.asm, vocab=vocab, vc=vc, chips=chips, rows=rows,
                           picks=b["picks"].base, record_base=b["ids"].base + first * aw)

    sched = al_.Schedule(interleaved=False, halo=0, window=cfg.window)
    pre = comp.view(rows=p_pad, seq=P, samples=1, sample_rows=p_pad)
    fold = comp.view(rows=b_pad, seq=1, samples=B, sample_rows=1)
    for v in (pre, fold):
        v.sched = sched
    programs = [ch.asm for ch in comp.ch]
    comms = {"prefill": [], "step": []}

    def recording(v: _Compiler, recs, body, keep: str | None):
        """``body()`` emitted on the view's chips into ``recs`` (recorders, or the
        programs); its collectives (one entry per COLL, the same on every chip) added to
        ``comms[keep]``."""
        for ch, a in zip(v.ch, recs, strict=True):
            ch.asm = a
        mark = len(comp.comms)
        body()
        if keep is not None:
            comms[keep].extend(comp.comms[mark:])
        del comp.comms[mark:]

    def prefill(recs, b: int):
        def body():
            embed(pre, P, "prompts", b * P, 0, P)
            blocks(pre, lambda cache: rows_of(cache, b, p_pad, B),
                   lambda c, cache, s: span(c, cache, b, 0, P, b, 0), (0, p_pad))
            final_norm(pre, P - 1, 1, b)
        # One sequence's (a loop body is recorded several times).
        recording(pre, recs, body, "prefill" if b == 0 else None)

    if B == 1:
        prefill(programs, 0)
    else:
        emit_affine_chips(programs, prefill, B)
    recording(fold, programs, lambda: pick(fold, 0, B), "prefill")

    def decode_step(recs, t: int):
        pos = P + t

        def body():
            embed(fold, B, "ids", t * B, pos, 1)
            blocks(fold, lambda cache: rows_of(cache, pos * B, b_pad),
                   lambda c, cache, s: span(c, cache, s, pos, 1, pos * B + s, s), (pos, 1))
            final_norm(fold, 0, B, 0)
            pick(fold, (t + 1) * B, B)
        recording(fold, recs, body, "step" if t == 0 else None)

    emit_affine_chips(programs, decode_step, generate - 1)
    out = {"programs": [], "prompts": [], "ids": [], "logits": [], "caches": [],
           "kv_bytes": [], "comms": []}
    for ch, b in zip(comp.ch, bufs, strict=True):
        ch.asm = programs[ch.c]
        lo, hi = plan.cols[ch.c]
        kv_lanes = sum(k.hi - k.lo for k in plan.kv_pieces[ch.c])
        role = {"layers": list(range(L)), "columns": [lo, hi],
                "heads": [p.head for p in plan.pieces[ch.c]],
                "vocab_columns": list(vocab_block(vocab, vc, ch.c)), "sequences": B}
        out["programs"].append(finish(npu, ChipProgram(ch.c, ch.asm, ch.al, role=role),
                                      check=check))
        for key in ("prompts", "ids", "logits", "caches"):
            out[key].append(b[key])
        out["kv_bytes"].append(2 * L * context * B * kv_lanes)
        out["comms"].append(comms)
    return out


def _place_tables(npu, qm, head, plan, ch, context, p_pad, v_pad, contents) -> dict:
    """Chip ``ch``'s share of the head's tables: its columns of the embedding table (a
    matmul's B operand, requantised per column by ``emb_req``), of the int16 learned
    positions, and of the final norm's gamma and beta."""
    cfg, n = qm.cfg, npu.array_size
    lo, hi = plan.cols[ch.c]
    wpad = pad_to(hi - lo, n)
    em = BlockEmitter(npu, qm, ch.asm, ch.al, seq=p_pad, chip=ch.c, contents=contents)

    def emb():
        w = hi - lo
        return QLinear(head.emb8[:, lo:hi], np.zeros(w, np.int64),
                       np.full(w, head.emb_req[0], np.int64),
                       np.full(w, head.emb_req[1], np.int64), OutMode.INT16)
    out = {"embed": em._linear("embed", emb, cfg.vocab_size, hi - lo)}
    out["norm"] = em._store("norm.gamma_beta", row_words(hi - lo, 4, n), lambda: pack_rows(
        pack_gamma_beta(head.norm.gamma[lo:hi], head.norm.beta[lo:hi])[None, :], 4, n))
    out["pos16"] = None
    if learned_positions(cfg):
        pos_pad = max(p_pad, pad_to(context, n))

        def pos_rows():
            rows = np.zeros((pos_pad, wpad), np.int64)
            rows[:context, :hi - lo] = requant(head.pos8[:context, lo:hi], *head.pos_req, 16)
            return pack_rows(rows, 2, n)
        rw = row_words(wpad, 2, n)
        block = em._store("pos16", pos_pad * rw, pos_rows)
        out["pos16"] = dataclasses.replace(block, rows=pos_pad, cols=wpad, eb=2, row_words=rw)
    return out
