"""Cycles of one ``ATTN`` launch in the attention engine (``hw/tile/attention_engine.py``).

Plain Python. The engine's schedule is :func:`hw.spec.attention.schedule`; its pipeline
constants are the attention buffer's sweeps (``W`` cycles each) and the softmax unit's
``ET + 1`` latency (``T = L / P`` beats per row, ``E = softmax_stages(pipeline)`` row stages:
5, or 6 with the deep pipeline).
"""

from __future__ import annotations

from ..attention import (
    FLAG_INTERLEAVED,
    flags_halo,
    launch_words,
    partial_row_words,
    schedule,
    softmax_lanes,
    split_mode,
    state_mode,
    state_words,
)
from .chip import (
    ATTN_DOT_CYCLES,
    ATTN_MERGE_CYCLES,
    ATTN_NORM_CYCLES,
    ATTN_PARTIAL_CYCLES,
    ATTN_PV_CYCLES,
    ATTN_REDUCED_CYCLES,
    ATTN_STATE_ROWS,
    attn_out_pipe,
    merge_divide_cycles,
    merge_rotate_cycles,
    softmax_stages,
)

__all__ = ["launch_cycles", "preload_cycles", "state_cycles"]


def launch_cycles(regs: dict, *, window: int, length: int, size: int,
                  d_head: int | None = None, pipeline: str = "short") -> int:
    """Cycles of one launch in the engine, from its ``i_cfg`` transfer to its final ``o``
    transfer, with every input word available at once and ``o`` always ready (exact).

    The pipeline recurrence (``W`` window, ``T = L / P`` softmax beats, ``w`` words per row of
    each stream, :func:`hw.spec.attention.launch_words`: ``w_k`` of K, ``w_v`` of V, ``w_q`` of
    Q, ``w_o`` of the output, all ``d_head / N`` for heads of whole words at lane 0;
    ``kv``/``q``/``s``/``p``/``out`` are the transfer cycles of a key write, a query, its score
    row, its probabilities and its raw output row):

    - a K/V row is complete ``max(w_k, w_v)`` cycles after the previous one was used (the
      first at ``1 + max(w_k, w_v)``; the partial pass reads no V, the reduced pass no K), a Q
      row ``w_q`` cycles;
    - ``kv(n) = max(row ready, previous command + 1, out(last query) + 1)`` (the ring is
      written only while no query is in flight);
    - ``q(t) = max(row ready, previous command + 1, s(t-1) + 1)``;
    - ``s(t) = max(q(t) + W + 5, p(t-1) + 1)`` (one row in the softmax at a time);
    - ``p(t) = max(s(t) + ET + 1, out(t-1) + 1)`` (``E = softmax_stages(pipeline)``, 5 or
      6); ``out(t) = max(p(t) + W + 3, out(t-1) + w_o + 1)``; the launch ends at ``out(Q-1)
      + w_o + X``, its last word leaving the output row register at ``out(Q-1) + w_o`` and
      passing the ``X = attn_out_pipe(pipeline)`` output registers to ``o`` (0 ``"short"``,
      3 ``"deep"``: the NPU file's ``attention_pipeline``).

    Closed forms (every stream ``w`` words, valid while ``w <= W + 5``): preload
    ``w (S + 1) + 2W + ET + 11 + X + (Q - 1) max(W + 6, ET + 2)``; interleaved with ``S = H +
    Q`` keys: ``w (H + 2) + Q (2W + ET + 11) + X``.

    State rows (long context; ``d_head`` = the engine's D, ``d_head_max``, is needed): a Q
    row is ``w_q + s`` words with a state in (``s = state_words(h, N)``); its first word would
    wait for room in the state FIFO, but never does: it comes after ``q(t-1) > s(t-2) >
    p(t-3) > out(t-4)``, which is after row ``t-5``'s output, so at most 4 of the
    ``ATTN_STATE_ROWS`` = 5 rows are held; the P.V row is taken once the merge factors are ready,
    ``pend(t) = p(t) + 1 + ATTN_MERGE_CYCLES`` (the last chunk: ``+ ATTN_NORM_CYCLES +
    merge_divide_cycles(W)`` more); a row's output then takes ``w_q + s`` cycles (state rows
    out; released after them) or ``K + w_o`` (the last chunk: ``K = merge_rotate_cycles(D,
    N)`` cycles of merging and normalising, released after them, then the int8 words).
    :func:`state_cycles` gives the preload closed form.
    """
    words = launch_words(regs, size)
    beats = length // softmax_lanes(length)
    flags = regs["AT_FLAGS"]
    cmds = schedule(regs["AT_KEYS"], regs["AT_QUERIES"], interleaved=bool(flags & FLAG_INTERLEAVED),
                    halo=flags_halo(flags))
    state = _state_params(regs, window, size, d_head, pipeline)
    return _recurrence(cmds, split_mode(flags), words, partial_row_words(window, size),
                       window, softmax_stages(pipeline) * beats, state, attn_out_pipe(pipeline))


def _state_params(regs, window, size, d_head, pipeline="short"):
    """``None`` for a launch without state rows, else ``(mode, s, K, pend)``: the mode, the
    state words per row, the last chunk's merge cycles and the factors' cycles after ``p``."""
    mode = state_mode(regs["AT_FLAGS"])
    if mode is None:
        return None
    if d_head is None:
        raise ValueError("the cycles of a launch with state rows need the engine's d_head")
    pend = 1 + ATTN_MERGE_CYCLES
    if mode == "last":
        pend += ATTN_NORM_CYCLES + merge_divide_cycles(window)
    return mode, state_words(regs["AT_D_HEAD"], size), \
        merge_rotate_cycles(d_head, size, pipeline), pend


def _recurrence(cmds, split, words, rw, window, softmax, state=None, out_pipe=0):
    """:func:`launch_cycles`'s recurrence over the commands ``cmds`` (``softmax`` = ``ET``, the
    softmax's latency less 1), ``split`` None for a
    normal launch; with the split-score passes (``docs/isa.md``, ATTN), ``part``/``red`` are the
    transfers of a query's partial row out of the buffer and of its reduced row into it:

    - partial: ``part(t) = max(q(t) + W + 4, part(t-1) + R + 1)`` (one row register, emitted
      as R words); the zero reduced row is taken at ``part + 1``; ``s(t) = max(part(t) + W + 3,
      p(t-1) + 1)``; the zero probabilities ``p(t) = max(s(t) + 1, out(t-1) + 1)``; the dropped
      output ``out(t) = p(t) + W + 3``; the launch ends at ``max(part(Q-1) + R + X,
      out(Q-1))`` (``X = out_pipe``, the output registers).
    - reduced: ``q(t)`` needs no row; a reduced row is complete R cycles after the previous one
      was taken (the first at ``1 + R``); ``red(t) = max(q(t) + W + 5, row ready)``;
      ``s(t) = max(red(t) + W + 2, p(t-1) + 1)``; then softmax, P.V and output as a normal
      query.
    """
    kvw = words["k"] if split == "partial" else words["v"] if split == "reduced" else \
        max(words["k"], words["v"])
    qw, ow = words["q"], words["o"]
    pend = 0
    if state is not None:
        assert ATTN_STATE_ROWS > 4, "the state FIFO would bind (see launch_cycles)"
        mode, sw, rot, pend = state
        if mode != "first":
            qw += sw
        # Cycles from a P.V row's take to the next take.
        ow = words["q"] + sw if mode != "last" else rot + words["o"]
    k_ready, q_ready = 1 + kvw, 1 + qw
    red_ready = 1 + rw
    prev = -1
    s = p = out = part = None
    last_out = None
    for kind, _ in cmds:
        if kind == "k":
            t = max(k_ready, prev + 1, last_out + 1 if last_out is not None else 0)
            k_ready = t + kvw
            prev = t
            continue
        after_p = p + 1 if p is not None else 0
        after_out = out + 1 if out is not None else 0
        if split == "reduced":
            t = max(prev + 1, s + 1 if s is not None else 0)
            red = max(t + window + ATTN_PARTIAL_CYCLES + 1, red_ready)
            red_ready = red + rw
            s = max(red + window + ATTN_REDUCED_CYCLES, after_p)
        else:
            t = max(q_ready, prev + 1, s + 1 if s is not None else 0)
            q_ready = t + qw
            if split is None:
                s = max(t + window + ATTN_DOT_CYCLES, after_p)
            else:
                part = max(t + window + ATTN_PARTIAL_CYCLES,
                           part + rw + 1 if part is not None else 0)
                s = max(part + 1 + window + ATTN_REDUCED_CYCLES, after_p)
        if split == "partial":
            p = max(s + 1, after_out)
            out = p + window + ATTN_PV_CYCLES
        else:
            p = max(s + softmax + 1, after_out)
            out = max(p + window + ATTN_PV_CYCLES, out + ow + 1 if out is not None else 0,
                      p + pend)
        last_out = out
        prev = t
    if split == "partial":
        return max(part + rw + out_pipe, out)
    return out + ow + out_pipe


def preload_cycles(regs: dict, *, window: int, length: int, size: int,
                   d_head: int | None = None, pipeline: str = "short") -> int:
    """:func:`launch_cycles` of a preload launch (``FLAG_INTERLEAVED`` and the split-score
    bits clear) in closed form,
    ``w (S + 1) + 2W + ET + 11 + X + (Q - 1) max(W + 6, ET + 2)`` (``X =
    attn_out_pipe(pipeline)``, ``E = softmax_stages(pipeline)``), when every stream has ``w``
    words per row and ``w <= W + 5``; else the recurrence."""
    counts = set(launch_words(regs, size).values())
    words = max(counts)
    et = softmax_stages(pipeline) * (length // softmax_lanes(length))
    if state_mode(regs["AT_FLAGS"]) is not None:
        return state_cycles(regs, window=window, length=length, size=size, d_head=d_head,
                            pipeline=pipeline)
    if regs["AT_FLAGS"] & FLAG_INTERLEAVED or split_mode(regs["AT_FLAGS"]) is not None or \
            words > window + 5 or len(counts) > 1:
        return launch_cycles(regs, window=window, length=length, size=size, d_head=d_head,
                             pipeline=pipeline)
    s, q = regs["AT_KEYS"], regs["AT_QUERIES"]
    return words * (s + 1) + 2 * window + et + 11 + attn_out_pipe(pipeline) + \
        (q - 1) * max(window + 6, et + 2)


def state_cycles(regs: dict, *, window: int, length: int, size: int, d_head: int,
                 pipeline: str = "short") -> int:
    """:func:`launch_cycles` of a preload launch with state rows (``AT_FLAGS`` bits 4, 5) in
    closed form: with ``w`` words per K, V, Q and output row (heads at lane 0), a Q row of
    ``r = w + s`` words with a state in (``s = state_words(h, N)``; else ``w``) and a row's
    output ``o = w + s`` cycles (state rows out) or ``K + w`` (the last chunk; ``K =
    merge_rotate_cycles(D, N)``),

    ``max(w (S + 1), r + w - 1) + 2W + ET + 11 + X - w + o + (Q - 1) max(W + 6, ET + 2)``
    (``X = attn_out_pipe(pipeline)``, ``E = softmax_stages(pipeline)``),

    valid while ``r <= W + 5``, ``o + 1 <= max(W + 6, ET + 2)`` (the rows' output keeps up
    with the queries) and the merge factors are ready by the P.V row, ``1 +
    ATTN_MERGE_CYCLES <= W + 3`` (the last chunk: ``+ ATTN_NORM_CYCLES +
    merge_divide_cycles(W)``); else the recurrence. The merge adds only the longer output of
    the last row: ``o - w`` cycles a launch."""
    mode, sw, rot, pend = _state_params(regs, window, size, d_head, pipeline)
    words = launch_words(regs, size)
    w = words["k"]
    et = softmax_stages(pipeline) * (length // softmax_lanes(length))
    r = w + (sw if mode != "first" else 0)
    o = w + sw if mode != "last" else rot + w
    period = max(window + 6, et + 2)
    if regs["AT_FLAGS"] & FLAG_INTERLEAVED or len(set(words.values())) > 1 or \
            r > window + 5 or o + 1 > period or pend > window + ATTN_PV_CYCLES:
        return launch_cycles(regs, window=window, length=length, size=size, d_head=d_head,
                             pipeline=pipeline)
    s, q = regs["AT_KEYS"], regs["AT_QUERIES"]
    return max(w * (s + 1), r + w - 1) + 2 * window + et + 11 + \
        attn_out_pipe(pipeline) - w + o + (q - 1) * period
