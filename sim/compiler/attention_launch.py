"""Launch builder for ``ATTN`` (one attention head per launch): descriptors and registers.

``attention_launch`` builds one launch from tensor addresses; ``plan_schedule`` says which
schedule runs a whole sequence on one chip (or refuses); ``head_launches`` builds the launches of
every head of a layer, whose results equal ``sim.golden.layer.attention_int``.
``partial_launch`` and ``reduced_launch`` are the two passes of split-score mode (a head whose
lanes lie on several chips): raw partial score rows out, reduced rows back in. See
``docs/isa.md`` (ATTN) for the registers and streams.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hw.spec.attention import LANE_REGS, flags_value, head_words, partial_row_words
from hw.spec.isa import Op

from .descriptors import Desc

__all__ = ["AttentionLaunch", "attention_launch", "partial_launch", "reduced_launch",
           "plan_schedule", "head_launches", "emit", "Schedule"]


@dataclass(frozen=True)
class AttentionLaunch:
    rd3: Desc | None   # K rows of the head (None: the reduced pass reads no K)
    rd4: Desc | None   # V rows (None: the partial pass reads no V)
    rd5: Desc          # Q rows (the reduced pass: reduced score rows)
    wr1: Desc          # output rows (the partial pass: partial score rows)
    regs: dict[str, int] = field(default_factory=dict)   # AT_* register values


@dataclass(frozen=True)
class Schedule:
    """How one chip runs a whole sequence: ``interleaved`` (else preload), ``halo`` keys
    before the interleaving, ``window`` for ``AT_WINDOW`` (0: no narrowing)."""

    interleaved: bool
    halo: int
    window: int


def attention_launch(*, size, d_head, queries, keys, q_base, k_base, v_base, o_base,
                     q_row_words, k_row_words, v_row_words, o_row_words, col=0, kv_col=None,
                     k_col=None, v_col=None, o_col=None, q_pos=0, k_pos=0,
                     bidirectional=False, interleaved=False, halo=0, window=0,
                     score_mult, score_shift, out_mult, out_shift) -> AttentionLaunch:
    """One head over ``queries`` query rows and ``keys`` key/value rows.

    Tensors are int8 token-major (``hw.spec.memory``); row r of Q is at ``q_base + r*q_row_words``
    (likewise K, V, O); the head's slice is columns ``col .. col + d_head - 1`` of Q and (by
    default) of O (``o_col``), and columns from ``kv_col`` (default ``col``) of K and V, or
    from ``k_col`` and ``v_col`` (grouped-query attention: the query head's K/V head; a packed
    row: its K and V sections). Columns need not be whole words: a head narrower than a word
    shares its words with its neighbours (packed heads), the launch reads the words that hold
    its lanes and writes only its own lanes of the output (``AT_Q_LANE`` .. ``AT_O_LANE``).
    Key n has absolute position ``k_pos + n``, query t ``q_pos + t``. ``halo`` keys are written
    before the interleaving starts.
    """
    if d_head < 1:
        raise ValueError(f"d_head={d_head} must be at least 1")
    if queries < 1 or keys < 1:
        raise ValueError(f"queries={queries} and keys={keys} must be at least 1")
    if not 0 <= halo <= keys or (halo and not interleaved):
        raise ValueError(f"halo={halo} must be in 0..keys={keys}, and only with interleaved")
    if interleaved and keys > halo + queries:
        raise ValueError(f"interleaved: keys={keys} exceeds halo={halo} + queries={queries}")
    kv_col = col if kv_col is None else kv_col
    cols = {"q": col, "k": kv_col if k_col is None else k_col,
            "v": kv_col if v_col is None else v_col, "o": col if o_col is None else o_col}
    for name, c in cols.items():
        if c < 0:
            raise ValueError(f"the {name.upper()} column {c} must be non-negative")
    words = {name: head_words(d_head, c % size, size) for name, c in cols.items()}
    for name, rw in (("q", q_row_words), ("k", k_row_words), ("v", v_row_words),
                     ("o", o_row_words)):
        if rw < cols[name] // size + words[name]:
            raise ValueError(f"{name}_row_words={rw} cannot hold columns up to "
                             f"{cols[name] + d_head}")

    def rows(base, rw, count, name):
        return Desc(base + cols[name] // size, (words[name], count, 1, 1), (1, rw, 0, 0))

    flags = flags_value(bidirectional=bidirectional, interleaved=interleaved, halo=halo)
    regs = {"AT_QUERIES": queries, "AT_KEYS": keys, "AT_Q_POS": q_pos, "AT_K_POS": k_pos,
            "AT_WINDOW": window, "AT_FLAGS": flags, "AT_SCORE_MULT": score_mult,
            "AT_SCORE_SHIFT": score_shift, "AT_OUT_MULT": out_mult, "AT_OUT_SHIFT": out_shift,
            "AT_D_HEAD": d_head}
    regs.update({reg: cols[name] % size for name, reg in LANE_REGS.items()})
    return AttentionLaunch(rd3=rows(k_base, k_row_words, keys, "k"),
                           rd4=rows(v_base, v_row_words, keys, "v"),
                           rd5=rows(q_base, q_row_words, queries, "q"),
                           wr1=rows(o_base, o_row_words, queries, "o"), regs=regs)


def plan_schedule(*, seq: int, window: int, causal: bool, ring: int) -> Schedule:
    """The schedule that runs a whole sequence of ``seq`` tokens on one chip whose ring holds
    ``ring`` keys, for a model ``window`` (0 = full attention); ``ValueError`` if none does.

    - every key fits the ring (``seq <= ring``): preload, causal or bidirectional;
    - causal, ``0 < window <= ring``: interleaved, one key before each query (the ring drops
      the keys that leave the window);
    - bidirectional, ``0 < window`` and ``2 window - 1 <= ring``: interleaved with ``window - 1``
      keys ahead of the queries, so the ring holds both sides of each query's window.

    ``AT_WINDOW`` is the model window whenever it cuts (``0 < window < seq``), else 0.
    """
    cut = window if 0 < window < seq else 0
    if seq <= ring:
        return Schedule(interleaved=False, halo=0, window=cut)
    if causal and 0 < window <= ring:
        return Schedule(interleaved=True, halo=0, window=cut)
    if not causal and window > 0 and 2 * window - 1 <= ring:
        return Schedule(interleaved=True, halo=window - 1, window=cut)
    kind = "causal" if causal else "bidirectional"
    need = f"a window of at most {ring}" if causal else \
        f"a window of at most {(ring + 1) // 2} (2 window - 1 <= {ring})"
    raise ValueError(f"{kind} attention over {seq} tokens with window {window} does not fit one "
                     f"chip's K/V ring of {ring} keys (needs seq <= {ring} or {need})")


def head_launches(*, npu, cfg, layer, q_base, k_base, v_base, o_base, row_words,
                  pos_base=0) -> list[AttentionLaunch]:
    """One launch per head of a layer: Q, K, V and O are int8 [seq, d_model] tensors of
    ``row_words`` words per row; ``cfg`` a ``ModelConfig``, ``layer`` carries ``score_mult``,
    ``score_shift``, ``out_mult``, ``out_shift`` (``sim.compiler.quantize``)."""
    sched = plan_schedule(seq=cfg.seq_len, window=cfg.window, causal=cfg.causal,
                          ring=npu.attn_window)
    if cfg.d_head > npu.d_head_max:
        raise ValueError(f"d_head {cfg.d_head} exceeds d_head_max {npu.d_head_max}")
    out = []
    for head in range(cfg.n_heads):
        out.append(attention_launch(
            size=npu.array_size, d_head=cfg.d_head, queries=cfg.seq_len, keys=cfg.seq_len,
            q_base=q_base, k_base=k_base, v_base=v_base, o_base=o_base, q_row_words=row_words,
            k_row_words=row_words, v_row_words=row_words, o_row_words=row_words,
            col=head * cfg.d_head, q_pos=pos_base, k_pos=pos_base,
            bidirectional=not cfg.causal, interleaved=sched.interleaved, halo=sched.halo,
            window=sched.window,
            score_mult=layer.score_mult, score_shift=layer.score_shift,
            out_mult=layer.out_mult, out_shift=layer.out_shift))
    return out


def _score_rows(base, rows, words, stride):
    return Desc(base, (words, rows, 1, 1), (1, stride, 0, 0))


def _score_row_words(prw, given, name, what):
    """The stride of the score rows: ``given`` (at least a row of ``prw`` words) or ``prw``."""
    if given is None:
        return prw
    if given < prw:
        raise ValueError(f"{name}={given} cannot hold a {what} row of {prw} words")
    return given


def partial_launch(*, size, window, d_head, queries, keys, q_base, k_base, p_base,
                   q_row_words, k_row_words, col=0, kv_col=None, k_col=None, q_pos=0,
                   k_pos=0, bidirectional=False, interleaved=False, halo=0,
                   p_row_words=None) -> AttentionLaunch:
    """Split-score pass 1: this chip's ``d_head`` lanes of a head (Q and K as in
    :func:`attention_launch`: K's from ``k_col``, default ``kv_col``), one raw int32 partial score
    row per query out, row t at ``p_base + t * p_row_words`` (default and minimum:
    ``partial_row_words(window, size)``, ``window`` the ring's W). The rows of the head's chips,
    summed, are the reduced rows of :func:`reduced_launch` over the same keys, queries,
    positions and schedule."""
    prw = partial_row_words(window, size)
    p_row_words = _score_row_words(prw, p_row_words, "p_row_words", "partial")
    base = attention_launch(
        size=size, d_head=d_head, queries=queries, keys=keys, q_base=q_base, k_base=k_base,
        v_base=k_base, o_base=p_base, q_row_words=q_row_words, k_row_words=k_row_words,
        v_row_words=k_row_words, o_row_words=q_row_words, col=col, kv_col=kv_col, k_col=k_col,
        v_col=k_col, q_pos=q_pos, k_pos=k_pos, bidirectional=bidirectional,
        interleaved=interleaved, halo=halo, score_mult=1, score_shift=1, out_mult=1,
        out_shift=1)
    regs = dict(base.regs, AT_FLAGS=flags_value(bidirectional=bidirectional,
                                                interleaved=interleaved, halo=halo,
                                                split="partial"))
    return dataclasses.replace(base, rd4=None, wr1=_score_rows(p_base, queries, prw,
                                                               p_row_words), regs=regs)


def reduced_launch(*, size, window, d_head, queries, keys, v_base, r_base, o_base,
                   v_row_words, o_row_words, col=0, kv_col=None, v_col=None, q_pos=0,
                   k_pos=0, bidirectional=False, interleaved=False, halo=0, window_cut=0,
                   r_row_words=None, score_mult, score_shift, out_mult,
                   out_shift) -> AttentionLaunch:
    """Split-score pass 2: the reduced score rows (row t at ``r_base + t * r_row_words``, the
    format of :func:`partial_launch`) replace ``q . k``; V in and the int8 output out as in
    :func:`attention_launch` (columns ``col .. col + d_head - 1`` of the output, from
    ``v_col``, default ``kv_col``, default ``col``, of V). ``window_cut`` is ``AT_WINDOW``."""
    prw = partial_row_words(window, size)
    r_row_words = _score_row_words(prw, r_row_words, "r_row_words", "reduced")
    base = attention_launch(
        size=size, d_head=d_head, queries=queries, keys=keys, q_base=v_base, k_base=v_base,
        v_base=v_base, o_base=o_base, q_row_words=v_row_words, k_row_words=v_row_words,
        v_row_words=v_row_words, o_row_words=o_row_words, col=col, kv_col=kv_col,
        k_col=v_col, v_col=v_col, q_pos=q_pos, k_pos=k_pos,
        bidirectional=bidirectional, interleaved=interleaved, halo=halo, window=window_cut,
        score_mult=score_mult, score_shift=score_shift, out_mult=out_mult,
        out_shift=out_shift)
    regs = dict(base.regs, AT_FLAGS=flags_value(bidirectional=bidirectional,
                                                interleaved=interleaved, halo=halo,
                                                split="reduced"))
    return dataclasses.replace(base, rd3=None,
                               rd5=_score_rows(r_base, queries, prw, r_row_words), regs=regs)


#: The ``AT_`` registers whose values come from the data (the score and output scales).
DATA_REGS = ("AT_SCORE_MULT", "AT_SCORE_SHIFT", "AT_OUT_MULT", "AT_OUT_SHIFT")


def emit(asm, launch: AttentionLaunch, src=None):
    """Append the launch's SETs and ``ATTN`` to a :class:`sim.compiler.assembler.Assembler`.
    ``src`` names where the scales (:data:`DATA_REGS`) come from, e.g. the layer
    (:meth:`~sim.compiler.assembler.Assembler.set`). Only the generators the launch uses get
    descriptors."""
    for gen in ("rd3", "rd4", "rd5", "wr1"):
        if getattr(launch, gen) is not None:
            asm.set_desc(gen.upper(), getattr(launch, gen))
    for name, value in launch.regs.items():
        asm.set(name, value, src if name in DATA_REGS else None)
    asm.launch(Op.ATTN)
