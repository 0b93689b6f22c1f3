"""Sequence parallelism (``--strategy sequence``): the tokens split in chunks across the chips.

Chip c holds every layer's weights and the tokens ``[start_c, stop_c)`` of each sample
(``numpy.array_split``: 10 tokens on 3 chips = 4, 3, 3) and runs every block on its chunk.
Everything but attention is row-wise, so only the keys cross chips: after its QKV matmul a chip
sends the K and V rows of its tokens to the chips whose queries see them (``SEND``/``RECV`` of
the K|V words of each row) and runs each head's ``ATTN`` over its own queries and a key range
``[lo_c, hi_c)`` that includes the received rows, at their absolute positions (``AT_K_POS`` =
``lo_c``, ``AT_Q_POS`` = ``start_c``). Per layer, for a model window w (H = w - 1):

- causal window: ``lo_c = max(0, start_c - H)``, ``hi_c = stop_c`` (the halo of the previous
  H tokens, from as many preceding chips as hold them when chunks are shorter than H);
- bidirectional window: also the next H tokens, ``hi_c = min(seq, stop_c + H)``;
- full attention (w = 0): every key the chunk's queries see (causal ``[0, stop_c)``,
  bidirectional ``[0, seq)``), passed around the ring: at step k chip c forwards the chunk it
  received at step k - 1 (its own at step 0) to chip c + 1, so every link carries each chunk
  once. A query whose keys fit the K/V ring (``hi - lo <= attn_window``) sees its whole row
  in one ``ATTN``; beyond it (ring attention) the row is split into launches over chunks of
  keys whose partial softmaxes merge exactly in the engine's state rows, in the order
  ``hw.spec.attention.block_order`` defines (``sim.golden.ring_softmax``). Causal ring
  attention may run in the **zig-zag order** (:func:`_compile_zigzag`, ``order``): chip c
  holds an early and a late block of the sequence, which evens out the attention work, with
  the plain order's integers.

The chip's Q/K/V tensor has one row per position of ``[lo_c, hi_c)`` (the QKV matmul writes the
chunk's rows, received rows fill the others), so one ``ATTN`` per head reads its keys with one
stride: preload when every key fits the ring (``hi - lo <= attn_window``), else the interleaved
schedule with ``HALO`` = the keys before the chunk (causal) or those plus H (bidirectional,
``2 w - 1 <= attn_window``), and ``AT_WINDOW`` = w. Every transfer of a layer has a place in one
global order (by hop distance, then by source chip; the ring by step), and each chip issues its
sends and receives in that order, which cannot deadlock: the earliest unfinished transfer has
both partners at it. The integers equal the single-chip golden's: every query sees exactly the
keys of ``sim.golden.float_model.attention_mask`` and softmax and P.V do not depend on the order
of the keys.

Grouped-query attention: a row's K and V are ``n_kv_heads`` heads wide, so the rows sent and
received (and the halo store below) are the words of ``2 n_kv_heads d_head`` lanes (heads
packed: :class:`sim.compiler.blocks.QkvLayout`; the first word may hold Q's last lanes); query head
h attends the columns of K/V head ``h // kv_group`` (``ATTN`` ``kv_col``). RoPE rotates Q and K in
the QKV tensor right after the QKV matmul (``sim.golden.rope``, the block emitter's), at each chip's
own positions: its tables hold the rows of positions ``start_c ..`` (one chip in passes: every
pass's positions, each pass reading from its start), so the K rows sent are already rotated at their
absolute positions and the receivers use them as they are. The rotated projections Q' and K' sit
after V in the row and are never sent.

**One chip, a sequence longer than ``max_seq_len``** (``--chips 1``): the tokens run in passes
of at most ``max_seq_len`` (``numpy.array_split`` into ``ceil(seq / max_seq_len)``), each pass
through every layer, and each layer keeps the K/V rows of the last H tokens it saw in a halo
store, copied into the rows before the next pass's keys (``VEC REQUANT`` with the identity
``(2**15, 15)``, exact on int8). Causal windows only: a bidirectional window would need the
next pass's keys of every layer before that pass has run, full attention every earlier key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hw.spec import ConfigError, ModelConfig, NpuConfig
from hw.spec.attention import (
    FLAG_STATE_IN,
    FLAG_STATE_OUT,
    POS_BITS,
    STATE_LANE_BYTES,
    block_order,
)
from hw.spec.isa import Unit
from hw.spec.timing import attention as attn_timing

from . import attention_launch as al_
from . import p2p_launch as pl
from . import vector_launch as vl
from .alloc import Allocator, Tensor
from .assembler import Assembler
from .blocks import BlockEmitter, Shard, pad_to
from .compat import Limits
from .descriptors import Desc
from .program import ChipProgram, Placement, SystemProgram, finish, split_ranges
from .quantize import QModel
from .single import check_single_chip

__all__ = ["split_tokens", "key_span", "Transfer", "plan_transfers", "check_sequence",
           "compile_sequence", "merge_order", "merge_launches"]

#: ``requant(x, 2**15, 15) = x`` for every int8 x: the vector unit's exact copy.
_COPY_MULT, _COPY_SHIFT = 1 << 15, 15


def split_tokens(seq: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each chunk (``numpy.array_split``: the first ones one longer)."""
    return [(r.start, r.stop) for r in split_ranges(seq, parts)]


def key_span(chunk: tuple[int, int], seq: int, window: int, causal: bool) -> tuple[int, int]:
    """``[lo, hi)``: the keys the queries of ``chunk`` see (window 0 = full attention)."""
    start, stop = chunk
    if window:
        halo = window - 1
        return max(0, start - halo), stop if causal else min(seq, stop + halo)
    return 0, stop if causal else seq


@dataclass(frozen=True)
class Transfer:
    """K/V rows of positions ``[start, stop)`` from chip ``src`` to chip ``dst``; ``forward``:
    ``src`` received them itself (the ring of full attention) and passes them on."""

    src: int
    dst: int
    start: int
    stop: int
    forward: bool = False

    @property
    def rows(self) -> int:
        return self.stop - self.start


def plan_transfers(chunks: list[tuple[int, int]], seq: int, window: int,
                   causal: bool) -> list[list[Transfer]]:
    """Every transfer of one layer, in phases: a chip sends at most one message and receives
    at most one in each phase, and runs its phases in order, its send before its receive.

    Windows: a phase per hop distance d and direction (``c -> c + d`` for every c, then
    ``c -> c - d``). The ring of full attention: a phase per step k, where chip c passes the
    chunk it received in step k - 1 (its own in step 0) on to chip c + 1.
    """
    chips = len(chunks)
    if chips == 1:
        return []
    if window == 0:
        phases = []
        for k in range(chips - 1):
            step = []
            for c in range(chips):
                src_chunk, dst = c - k, c + 1
                if causal and (src_chunk < 0 or dst >= chips):
                    continue
                a, b = chunks[src_chunk % chips]
                step.append(Transfer(c, dst % chips, a, b, forward=k > 0))
            phases.append(step)
        return phases
    by_phase = {}
    for dst, chunk in enumerate(chunks):
        lo, hi = key_span(chunk, seq, window, causal)
        for src, (a, b) in enumerate(chunks):
            start, stop = max(a, lo), min(b, hi)
            if src != dst and start < stop:
                key = (abs(dst - src), dst < src)
                by_phase.setdefault(key, []).append(Transfer(src, dst, start, stop))
    return [sorted(by_phase[k], key=lambda t: t.src) for k in sorted(by_phase)]


def check_sequence(npu: NpuConfig, cfg: ModelConfig, chips: int, seq: int | None = None,
                   limits: Limits | None = None):
    """Compatibility of a model with sequence parallelism on ``chips`` chips (ConfigError, or
    each refusal reported to ``limits``): every chunk within ``max_seq_len`` (one chip:
    passes, causal windows only) and each chunk's keys within the K/V ring."""
    seq = cfg.seq_len if seq is None else seq
    limits = Limits() if limits is None else limits
    # What does not depend on the sequence: the model as one token would run it.
    check_single_chip(npu, replace(cfg, seq_len=1, window=min(cfg.window, 1)), limits)

    def _refuse(key, value, problem, path, limit=None):
        limits.refuse(problem, path=path, key=key, value=value, limit=limit)

    ring, w = npu.attn_window, cfg.window
    if seq < chips:
        _refuse("seq_len", seq, f"is less than the {chips} chips: sequence parallelism needs a "
                "token per chip", cfg.path, chips)
        return
    if seq > 1 << POS_BITS:
        _refuse("seq_len", seq, f"exceeds {1 << POS_BITS}: token positions are {POS_BITS}-bit "
                "(AT_Q_POS, AT_K_POS)", cfg.path, 1 << POS_BITS)
    passes = _passes(npu, cfg, chips, seq)
    if chips > 1 and max(b - a for a, b in split_tokens(seq, chips)) > npu.max_seq_len:
        _refuse("max_seq_len", npu.max_seq_len, f"is less than a chunk of "
                f"{math.ceil(seq / chips)} tokens ({seq} tokens on {chips} chips): use at least "
                f"{math.ceil(seq / npu.max_seq_len)} chips", npu.path, math.ceil(seq / chips))
    if len(passes) > 1 and not (cfg.causal and w):
        kind = "full attention" if not w else "a bidirectional window"
        _refuse("seq_len", seq, f"exceeds max_seq_len={npu.max_seq_len}: one chip runs longer "
                f"sequences in passes only for causal windowed attention ({kind} needs keys of "
                f"tokens after the pass, or every earlier one); use at least "
                f"{math.ceil(seq / npu.max_seq_len)} chips", npu.path, npu.max_seq_len)
    if w and cfg.causal and w > ring:
        _refuse("window", w, f"exceeds attn_window={ring}: a causal window must fit the K/V "
                "ring", npu.path, ring)
    if w and not cfg.causal and 2 * w - 1 > ring:
        _refuse("window", w, f"does not fit attn_window={ring}: a bidirectional window needs "
                f"2 window - 1 <= {ring}", npu.path, ring)
    if not w and _merge_blocks(npu, cfg, chips, seq) and npu.array_size % STATE_LANE_BYTES:
        _refuse("array_size", npu.array_size, f"is not a multiple of {STATE_LANE_BYTES}: full "
                f"attention over more than attn_window={ring} keys merges partial softmaxes "
                "through state rows of int32 lanes in whole words", npu.path)


def _merge_blocks(npu, cfg, chips, seq) -> list[tuple[int, int]] | None:
    """Full attention whose queries see more keys than the K/V ring holds: the query blocks
    whose partial softmaxes are merged (each chip's chunk, or one chip's blocks of
    ``attn_window`` rows), None when every query's keys fit one ``ATTN``."""
    if cfg.window:
        return None
    chunks = split_tokens(seq, chips)
    if max(hi - lo for lo, hi in (key_span(c, seq, 0, cfg.causal) for c in chunks)) \
            <= npu.attn_window:
        return None
    if chips == 1:
        return [(a, min(a + npu.attn_window, seq)) for a in range(0, seq, npu.attn_window)]
    return chunks


def merge_order(npu, cfg, chips, seq) -> list | None:
    """The golden's ``kv_order`` of a sequence-parallel run (``hw.spec.attention.block_order``
    of :func:`_merge_blocks`), None without merging."""
    blocks = _merge_blocks(npu, cfg, chips, seq)
    return None if blocks is None else block_order(blocks, causal=cfg.causal,
                                                   ring=npu.attn_window)


def _passes(npu, cfg, chips, seq) -> list[tuple[int, int]]:
    if chips > 1 or seq <= npu.max_seq_len:
        return [(0, seq)]
    return split_tokens(seq, math.ceil(seq / npu.max_seq_len))


#: The orders of the tokens over the chips (:func:`compile_sequence`).
ORDERS = ("auto", "plain", "zigzag")


def zigzag_halves(seq: int, chips: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The zig-zag order's tokens of each chip: the sequence in ``2 P`` blocks of ``seq / (2
    P)`` (P chips), pair ``j`` the blocks ``j`` and ``2 P - 1 - j``, held by chip
    :func:`_zigzag_pair`."""
    h = seq // (2 * chips)
    pairs = [((j * h, j * h + h), ((2 * chips - 1 - j) * h, (2 * chips - j) * h))
             for j in range(chips)]
    return [pairs[_zigzag_pair(c, chips)] for c in range(chips)]


def _zigzag_pair(c: int, chips: int) -> int:
    """The pair of blocks chip ``c`` holds: neighbours swap pairs (chip 0 pair 1, chip 1 pair
    0, ...), so that the pair whose late block's own chunk needs its partner's block (pair
    ``2 m``: block ``2 P - 1 - 2 m`` needs ``2 P - 2 - 2 m``) receives it in the ring's first
    step, from the chip before it."""
    return c ^ 1 if (c ^ 1) < chips else c


def zigzag_refusal(npu, cfg, chips, seq) -> str | None:
    """None when the zig-zag order applies to this run, else why it does not."""
    if chips < 2 or cfg.window or not cfg.causal:
        return "the zig-zag order evens out causal full attention on several chips"
    if _merge_blocks(npu, cfg, chips, seq) is None:
        return "every query's keys fit one ATTN: no ring attention to even out"
    if seq % (2 * chips):
        return f"seq_len {seq} is not a multiple of 2 x {chips} chips (the zig-zag blocks)"
    if cfg.rope:
        return "RoPE's tables hold one run of positions a chip, the zig-zag order two"
    runs = block_order(split_tokens(seq, chips), causal=True, ring=npu.attn_window)
    if not all(any(r0 <= a and z <= r1 for r0, r1, _ in runs)
               for pair in zigzag_halves(seq, chips) for a, z in pair):
        return (f"a zig-zag block of {seq // (2 * chips)} tokens straddles the plain order's "
                f"query runs of attn_window={npu.attn_window} rows")
    return None


def compile_sequence(npu: NpuConfig, qm: QModel, chips: int, *, seq: int | None = None,
                     samples: int = 1, contents: bool = True, check: bool = True,
                     emit: bool = True, only: set[int] | None = None,
                     order: str = "auto") -> SystemProgram:
    """Programs for ``chips`` chips that split the tokens of each of ``samples`` sequences
    (one chip: passes of at most ``max_seq_len`` tokens). ``contents=False``, ``check=False``
    and ``emit=False`` as for :func:`~sim.compiler.grid.compile_grid`: the planner's layout of
    each chip's scratchpad from the shapes alone, without the checks and the programs (and
    ``only``: of just those chips). ``order``: ``plain`` (chip c the c-th chunk), ``zigzag``
    (causal ring attention: :func:`_compile_zigzag`, the same integers) or ``auto``: zig-zag
    where it applies (:func:`zigzag_refusal`) and its blocks hold at least ``attn_window / 2``
    queries (shorter ones pay each launch's fixed cost more often than the balance saves:
    ``docs/architecture.md``, Sequence parallelism)."""
    cfg = qm.cfg
    seq = cfg.seq_len if seq is None else seq
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
    if check:
        check_sequence(npu, cfg, chips, seq)
    if emit and only is not None:
        raise ValueError("only= lays out some chips (emit=False); a program needs every chip")
    kw = {"contents": contents, "check": check, "emit": emit}
    if chips == 1:
        return _compile_passes(npu, qm, seq, samples, **kw)
    why = zigzag_refusal(npu, cfg, chips, seq)
    if order == "zigzag" and why is not None:
        raise ValueError(f"--strategy sequence on {chips} chips cannot run the zig-zag order: "
                         f"{why}")
    if order == "zigzag" or (order == "auto" and why is None and
                             2 * seq // (2 * chips) >= npu.attn_window):
        return _compile_chips(npu, qm, chips, seq, samples, only=only, zigzag=True, **kw)
    return _compile_chips(npu, qm, chips, seq, samples, only=only, **kw)


def _layout(npu, cfg, chips, seq, states):
    """The scratchpads alone (``emit=False``; None for the chips not laid out)."""
    return SystemProgram(npu, cfg, "sequence", [None if st is None else
                                                ChipProgram(c, st.asm, st.al)
                                                for c, st in enumerate(states)], seq,
                         max(st.em.seq_pad for st in states if st is not None), [], [], {}, [])


class _Chip:
    """One chip's compiler state: emitter, weights, tensors."""

    def __init__(self, npu, qm, c, tokens, *, kv_rows, transfer, contents=True,
                 rope_span=None):
        cfg = qm.cfg
        self.al, self.asm = Allocator(npu, transfer_bank=transfer), Assembler()
        self.em = BlockEmitter(npu, qm, self.asm, self.al, seq=tokens, chip=c,
                               contents=contents, rope_span=rope_span)
        self.shard = Shard.whole(cfg)
        self.weights = [self.em.place_layer(i, self.shard) for i in range(cfg.n_layers)]
        n, em = npu.array_size, self.em
        # A row is [Q | K | V] (and under RoPE [Q' | K'] after them, never sent), heads packed
        # (QkvLayout): the words that hold K and V (n_kv_heads heads: grouped-query attention)
        # from the word of K's first lane (its first lanes may be Q's: harmless in the rows of
        # other chips' positions a chip receives, whose queries it never runs).
        self.lay = lay = em.qkv_layout(self.shard)
        self.kv_first = lay.k // n
        self.kv_words = -(-lay.main // n) - self.kv_first
        self.kv = self.al.alloc("qkv", kv_rows, em.qkv_width(self.shard), 1, "kv_cache",
                                transfer=transfer)

    #: The cycles the state rows add to this chip's launches (:func:`_merge_cycles`).
    merge_cycles = 0

    def activations(self, rows, merge_rows: int = 0):
        """The block's tensors; ``merge_rows``: the query rows of the state rows each head
        keeps while its partial softmaxes merge (ring attention)."""
        self.acts = self.em.alloc_activations(rows, self.shard, qkv=self.kv)
        self.state = None
        self.merge_rows = merge_rows
        if merge_rows:
            self.srw = max(al_.state_row_words(self.em.cfg.d_head, self.lay.q_col(k),
                                               self.em.n) for k in range(self.em.cfg.n_heads))
            self.state = self.al.alloc("ring.state", self.em.cfg.n_heads * merge_rows, 0, 1,
                                       "activations", row_words_=self.srw)

    def merge_launches(self, layer, q0, q1, chunks, *, lo, state_row=0):
        """The launches of query rows ``q0 .. q1 - 1`` (positions; Q/K/V tensor rows from
        position ``lo``) over their key ``chunks`` in merge order (:func:`merge_launches`);
        head h's state rows from row ``state_row`` of its own ``merge_rows``
        (:meth:`activations`)."""
        out, cycles = merge_launches(self.em, self.kv, self.lay, self.acts.o, self.q_lo,
                                     self.state, self.merge_rows, self.srw, layer, q0, q1,
                                     chunks, lo=lo, state_row=state_row)
        self.merge_cycles += cycles
        return out

    def emit_launches(self, launches):
        for _, heads in launches:
            for launch in heads:
                al_.emit(self.asm, launch)

    def kv_rows(self, row: int, rows: int) -> Desc:
        """The K|V words of ``rows`` rows of the Q/K/V tensor from ``row``."""
        kv = self.kv
        return Desc(kv.base + row * kv.row_words + self.kv_first, (self.kv_words, rows, 1, 1),
                    (1, kv.row_words, 0, 0))

    def kv_view(self, row: int, rows: int) -> vl.Rows:
        return vl.Rows(self.kv.base + row * self.kv.row_words + self.kv_first, rows,
                       self.kv.row_words, 1)

    def attention(self, layer, *, queries, q_row, q_pos, keys, k_pos, causal, window):
        """One ``ATTN`` per head: ``queries`` rows from ``q_row``, ``keys`` rows from row 0
        (query head h on the columns of its K/V head ``h // kv_group``)."""
        em, kv, npu = self.em, self.kv, self.em.npu
        L = em.qm.layers[layer]
        if keys <= npu.attn_window:
            interleaved, halo = False, 0
        else:
            ahead = q_pos - k_pos
            interleaved, halo = True, min(keys, ahead + (0 if causal else window - 1))
        o = self.acts.o
        lay = self.lay
        for k in range(em.cfg.n_heads):
            g = k // em.cfg.kv_group
            al_.emit(self.asm, al_.attention_launch(
                size=em.n, d_head=em.cfg.d_head, queries=queries, keys=keys,
                q_base=kv.base + q_row * kv.row_words, k_base=kv.base, v_base=kv.base,
                o_base=o.base, q_row_words=kv.row_words, k_row_words=kv.row_words,
                v_row_words=kv.row_words, o_row_words=o.row_words, col=lay.q_col(k),
                k_col=lay.k_col(g), v_col=lay.v_col(g), q_pos=q_pos, k_pos=k_pos,
                bidirectional=not causal,
                interleaved=interleaved, halo=halo, window=window,
                score_mult=L.score_mult, score_shift=L.score_shift, out_mult=L.out_mult,
                out_shift=L.out_shift))

    def input_requant(self, x):
        if self.em.qm.cfg.norm == "post":
            self.em.requant_input(x, self.acts.x8, 0)


def merge_launches(em, kv, lay, o, o_lo, state, merge_rows, srw, layer, q0, q1, chunks, *,
                   lo, state_row=0, q_rows=None) -> tuple[list, int]:
    """The launches of query rows ``q0 .. q1 - 1`` (positions; rows of the Q/K/V tensor
    ``kv`` from position ``lo``, heads laid out by ``lay``) over their key ``chunks`` in merge
    order, and the cycles their state rows add (:func:`_merge_cycles`): ``[((k0, k1), [launch
    of each head])]``. Head h keeps its state rows in ``state`` from row ``h * merge_rows +
    state_row`` (``srw`` words a row); the last chunk writes the output rows ``o`` from
    position ``o_lo``; ``q_rows``: ``(Q row of kv, row of o)`` of the queries instead (the
    zig-zag order, whose queries are not at their positions' rows). One chunk: plain
    launches. Ring attention, one chip in passes and a split-KV decode's prefill
    (``sim.compiler.decode_split``) use it."""
    cfg, npu = em.cfg, em.npu
    L = em.qm.layers[layer]
    rw = kv.row_words
    q_row, o_row = (q0 - lo, q0 - o_lo) if q_rows is None else q_rows
    out, cycles = [], 0
    for c, (k0, k1) in enumerate(chunks):
        heads = []
        for k in range(cfg.n_heads):
            g = k // cfg.kv_group
            common = {"size": em.n, "d_head": cfg.d_head, "queries": q1 - q0,
                      "keys": k1 - k0, "q_base": kv.base + q_row * rw,
                      "q_row_words": rw, "k_base": kv.base + (k0 - lo) * rw,
                      "v_base": kv.base + (k0 - lo) * rw, "k_row_words": rw,
                      "v_row_words": rw, "col": lay.q_col(k),
                      "k_col": lay.k_col(g), "v_col": lay.v_col(g),
                      "q_pos": q0, "k_pos": k0,
                      "bidirectional": al_.chunk_bidirectional(
                          q0, q1, k0, k1, causal=cfg.causal, ring=npu.attn_window),
                      "score_mult": L.score_mult, "score_shift": L.score_shift,
                      "out_mult": L.out_mult, "out_shift": L.out_shift}
            dest = {"o_base": o.base + o_row * o.row_words, "o_row_words": o.row_words}
            if len(chunks) == 1:
                heads.append(al_.attention_launch(**common, **dest))
                continue
            mode = "first" if c == 0 else "last" if c == len(chunks) - 1 else "middle"
            launch = al_.state_launch(
                mode=mode, s_base=state.base + (k * merge_rows + state_row) * srw,
                s_row_words=srw, **common, **(dest if mode == "last" else {}))
            heads.append(launch)
            cycles += _merge_cycles(npu, launch.regs)
        out.append(((k0, k1), heads))
    return out, cycles


def _merge_cycles(npu, regs) -> int:
    """What a launch's state rows cost in the engine: its exact cycles
    (``hw.spec.timing.attention.launch_cycles``) less those of the same launch without them
    (longer Q rows in, state words out, the last chunk's merge and normalisation)."""
    timing = {"window": npu.attn_window, "length": npu.softmax_len, "size": npu.array_size,
              "d_head": npu.d_head_max, "pipeline": npu.attention_pipeline}
    plain = dict(regs, AT_FLAGS=regs["AT_FLAGS"] & ~(FLAG_STATE_IN | FLAG_STATE_OUT))
    return attn_timing.launch_cycles(regs, **timing) - attn_timing.launch_cycles(plain, **timing)


def _check_message(npu, words, what):
    ratio = npu.ring_word_bytes // npu.array_size
    if words % ratio:
        raise ConfigError(f"cannot carry {what}: {words} scratchpad words are not whole ring "
                          f"words of {ratio} (K|V words per row x rows)", path=npu.path,
                          key="link_bytes_per_cycle", value=npu.link_bytes_per_cycle)


def _compile_chips(npu, qm, chips, seq, samples, zigzag=False, **kw):
    compile_ = _compile_zigzag if zigzag else _compile_chips_in
    try:
        return compile_(npu, qm, chips, seq, samples, transfer=True, **kw)
    except ConfigError as exc:
        if "regions overlap" not in str(exc):
            raise
        return compile_(npu, qm, chips, seq, samples, transfer=False, **kw)


def _compile_zigzag(npu, qm, chips, seq, samples, *, transfer, contents, check, emit,
                    only=None):
    """Causal ring attention in the zig-zag order: the sequence in ``2 P`` blocks of ``h``
    tokens, chip c holding blocks c and ``2 P - 1 - c`` (:func:`zigzag_halves`), so every chip
    has one early and one late block and the same attention work.

    The integers are the plain order's (``meta["kv_order"]``, ``block_order`` of the ``P``
    chunks of ``2 h`` tokens): every query merges the same key chunks in the same order, each
    launch over a whole plain chunk, which the zig-zag blocks ``2 k`` and ``2 k + 1`` make up
    (the own chunk cut at the query block's end: the keys after it are masked, and a state
    depends only on its visible keys). So a chip's Q/K/V tensor holds every position's K/V
    at its position's row (rows ``0 .. seq - 1``; the QKV matmul writes the chip's ``2 h``
    rows below them, and two exact ``VEC`` copies move their K|V words to their positions);
    every chip needs keys of every other (its late block sees nearly all), so the ring passes
    every chip's pair of blocks (one message of two runs of rows) to every other, ``P - 1``
    steps; and a launch runs as soon as both halves of its chunk have arrived, each query
    block's launches in their merge order (own chunk, then the earlier chunks descending)."""
    cfg, n = qm.cfg, npu.array_size
    h = seq // (2 * chips)
    halves = zigzag_halves(seq, chips)
    plain = split_tokens(seq, chips)
    order = block_order(plain, causal=True, ring=npu.attn_window)
    link = npu.link_bytes_per_cycle
    states = []
    for c in range(chips):
        if only is not None and c not in only:
            states.append(None)
            continue
        a = halves[c][0][0]
        st = _Chip(npu, qm, c, 2 * h, kv_rows=max(seq, a + pad_to(2 * h, n)),
                   transfer=transfer, contents=contents)
        st.xs = [st.em.alloc_residual(f"x{s}", 1) for s in range(samples)]
        st.activations(st.em.seq_pad, merge_rows=2 * h)
        st.q_lo = 0
        if check:
            st.al.check_capacity()
        states.append(st)
    if not emit:
        return _layout(npu, cfg, chips, seq, states)
    for c in range(chips):
        _check_message(npu, states[c].kv_words * 2 * h,
                       f"the K/V rows of chip {c}'s zig-zag blocks")

    def pair(st, j) -> Desc:
        """Chip j's two blocks' K|V words, at their positions' rows."""
        kv = st.kv
        (a, _), (b, _) = halves[j]
        return Desc(kv.base + a * kv.row_words + st.kv_first, (st.kv_words, h, 2, 1),
                    (1, kv.row_words, (b - a) * kv.row_words, 0))

    comms = []
    for s in range(samples):
        for i in range(cfg.n_layers):
            for c, st in enumerate(states):

                def attend(c=c, st=st, i=i, s=s):
                    kv, rw = st.kv, st.kv.row_words
                    (a, _), (b, _) = halves[c]
                    if b != a + h:
                        # The late block's whole rows (Q too) from below the early one's to
                        # its positions' rows, before a RECV fills the rows it leaves.
                        st.em._vec(vl.requant_launch(
                            size=n, length=rw * n, a=vl.Rows(kv.base + (a + h) * rw, h, rw, 1),
                            out=vl.Rows(kv.base + b * rw, h, rw, 1), mult=_COPY_MULT,
                            shift=_COPY_SHIFT))
                        st.asm.wait(Unit.VEC)
                    runs = []
                    for half, (q0, q1) in enumerate(halves[c]):
                        _, _, chunks = next(r for r in order if r[0] <= q0 and q1 <= r[1])
                        # The chunk of the block's own positions, cut at its end (the keys
                        # after it are masked: the same state, without waiting for them).
                        chunks = [(k0, min(k1, max(q1, k0 + 2))) for k0, k1 in chunks]
                        launches, cycles = merge_launches(
                            st.em, kv, st.lay, st.acts.o, 0, st.state, st.merge_rows, st.srw,
                            i, q0, q1, chunks, lo=0, state_row=half * h,
                            q_rows=(q0, half * h))
                        st.merge_cycles += cycles
                        runs.append(launches)
                    have = {a // h for a, _ in halves[c]}      # zig-zag blocks held

                    def ready():
                        for run in runs:
                            while run and all(z in have for z in range(
                                    run[0][0][0] // h, -(-run[0][0][1] // h))):
                                for launch in run.pop(0)[1]:
                                    al_.emit(st.asm, launch)

                    pending = None
                    for k in range(chips - 1):
                        if pending is not None:
                            st.asm.wait(Unit.RECV)
                            have.update(a // h for a, _ in halves[pending])
                        j, dst, src = (c - k) % chips, (c + 1) % chips, (c - 1) % chips
                        launch = pl.send_launch(dest=dst, desc=pair(st, j), size=n,
                                                link_bytes=link)
                        pl.emit(st.asm, launch)
                        comms.append({"kind": "send", "from": c, "to": dst,
                                      "bytes": launch.words * n, "layer": i, "sample": s,
                                      "tokens": [list(t) for t in halves[j]],
                                      "what": "K/V ring (zig-zag)"})
                        pending = (c - k - 1) % chips
                        pl.emit(st.asm, pl.recv_launch(src=src, desc=pair(st, pending), size=n,
                                                       link_bytes=link))
                        ready()
                    st.asm.wait(Unit.RECV)
                    have.update(a // h for a, _ in halves[pending])
                    ready()
                    assert not any(runs), f"chip {c}: chunks never attended"
                    st.asm.wait(Unit.SEND | Unit.RECV)

                st.em.emit_block(i, st.weights[i], st.shard, st.acts, st.xs[s], 1,
                                 pos_base=halves[c][0][0],
                                 qkv_out=_rows_view(st.kv, halves[c][0][0]), attend=attend)
    programs, inputs, outputs = [], [[] for _ in range(samples)], [[] for _ in range(samples)]
    for c, st in enumerate(states):
        programs.append(finish(npu, ChipProgram(c, st.asm, st.al, role={
            "layers": list(range(cfg.n_layers)), "tokens": [list(t) for t in halves[c]],
            "keys": [0, seq]}), check=check))
    holder = {a // h: (c, half) for c, pr in enumerate(halves) for half, (a, _) in enumerate(pr)}
    for s in range(samples):
        for z in range(2 * chips):
            c, half = holder[z]
            x = states[c].xs[s]
            place = Placement(c, x.base + half * h * x.row_words, h, x.cols, x.row_words,
                              tokens=(z * h, z * h + h))
            inputs[s].append(place)
            outputs[s].append(place)
    meta = _meta(npu, cfg, chips, plain, [(0, seq)] * chips, [[c] for c in plain], [],
                 comms, samples)
    meta.update({"order": "zigzag", "chunks": [[list(t) for t in pr] for pr in halves],
                 "chunk_tokens": [2 * h] * chips, "halo_tokens": [seq - 2 * h] * chips,
                 "phases_per_layer": chips - 1, "transfers_per_layer": chips * (chips - 1),
                 "mode": "ring", "kv_order": order,
                 "merge_cycles": [st.merge_cycles for st in states]})
    return SystemProgram(npu, cfg, "sequence", programs, seq,
                         max(st.em.seq_pad for st in states), inputs, outputs, meta, comms)


def _compile_chips_in(npu, qm, chips, seq, samples, *, transfer, contents, check, emit,
                      only=None):
    cfg, n = qm.cfg, npu.array_size
    chunks = split_tokens(seq, chips)
    spans = [key_span(c, seq, cfg.window, cfg.causal) for c in chunks]
    blocks = _merge_blocks(npu, cfg, chips, seq)
    link = npu.link_bytes_per_cycle
    states = []
    for c, ((start, stop), (lo, hi)) in enumerate(zip(chunks, spans, strict=True)):
        if only is not None and c not in only:
            states.append(None)
            continue
        tokens = stop - start
        # RoPE's tables hold the chunk's own positions (its padded rows too).
        st = _Chip(npu, qm, c, tokens, kv_rows=max(hi - lo, start - lo + pad_to(tokens, n)),
                   transfer=transfer, contents=contents, rope_span=(start, pad_to(tokens, n)))
        st.xs = [st.em.alloc_residual(f"x{s}", 1) for s in range(samples)]
        st.activations(st.em.seq_pad, merge_rows=tokens if blocks else 0)
        st.q_lo = start
        if check:
            st.al.check_capacity()
        states.append(st)
    if not emit:
        return _layout(npu, cfg, chips, seq, states)
    phases = plan_transfers(chunks, seq, cfg.window, cfg.causal)
    order = block_order(blocks, causal=cfg.causal, ring=npu.attn_window) if blocks else None
    for t in (t for phase in phases for t in phase):
        _check_message(npu, states[t.src].kv_words * t.rows,
                       f"the K/V rows of tokens {t.start}..{t.stop - 1}")
    what = "K/V ring" if cfg.window == 0 else "K/V halo"
    comms = []
    for s in range(samples):
        for i in range(cfg.n_layers):
            for c, st in enumerate(states):
                start, stop = chunks[c]
                lo, hi = spans[c]

                def ring_attend(c=c, st=st, i=i, s=s, lo=lo, start=start, stop=stop):
                    """Ring attention: the own chunk's launches while the first transfer
                    runs, then each chunk's as it arrives (its forwarding issued first), the
                    states merged in the ring's order (``block_order``)."""
                    groups = {}
                    for q0, q1, run in order:
                        if not start <= q0 < stop:
                            continue        # another chip's queries
                        for chunk, heads in st.merge_launches(i, q0, q1, run, lo=lo,
                                                              state_row=q0 - start):
                            b = next(b for b, (a, z) in enumerate(blocks) if a <= chunk[0] < z)
                            groups.setdefault(b, []).append((chunk, heads))
                    pending = None
                    for k, phase in enumerate(phases):
                        if pending is not None:
                            st.asm.wait(Unit.RECV)      # the rows to attend and pass on
                        arrived = None
                        for t in phase:
                            if t.src == c:
                                launch = pl.send_launch(dest=t.dst, desc=st.kv_rows(
                                    t.start - lo, t.rows), size=n, link_bytes=link)
                                pl.emit(st.asm, launch)
                                comms.append({"kind": "send", "from": t.src, "to": t.dst,
                                              "bytes": launch.words * n, "layer": i,
                                              "sample": s, "tokens": [t.start, t.stop],
                                              "what": what})
                        for t in phase:
                            if t.dst == c:
                                pl.emit(st.asm, pl.recv_launch(src=t.src, desc=st.kv_rows(
                                    t.start - lo, t.rows), size=n, link_bytes=link))
                                arrived = next(b for b, (a, _) in enumerate(blocks)
                                               if a == t.start)
                        st.emit_launches(groups.pop(c if k == 0 else pending, []))
                        pending = arrived
                    if pending is not None:
                        st.asm.wait(Unit.RECV)
                        st.emit_launches(groups.pop(pending, []))
                    st.emit_launches(groups.pop(c, []))     # no transfer at all
                    assert not groups, f"chip {c}: chunks never attended {sorted(groups)}"
                    if phases:
                        st.asm.wait(Unit.SEND | Unit.RECV)

                def attend(c=c, st=st, i=i, s=s, start=start, stop=stop, lo=lo, hi=hi):
                    if order is not None:
                        return ring_attend()
                    received = False
                    for phase in phases:
                        for t in phase:
                            if t.src != c:
                                continue
                            if t.forward and received:
                                st.asm.wait(Unit.RECV)      # the rows this send passes on
                            launch = pl.send_launch(dest=t.dst, desc=st.kv_rows(
                                t.start - lo, t.rows), size=n, link_bytes=link)
                            pl.emit(st.asm, launch)
                            comms.append({"kind": "send", "from": t.src, "to": t.dst,
                                          "bytes": launch.words * n, "layer": i, "sample": s,
                                          "tokens": [t.start, t.stop], "what": what})
                        for t in phase:
                            if t.dst == c:
                                pl.emit(st.asm, pl.recv_launch(src=t.src, desc=st.kv_rows(
                                    t.start - lo, t.rows), size=n, link_bytes=link))
                                received = True
                    if phases:
                        st.asm.wait(Unit.SEND | Unit.RECV)
                    st.attention(i, queries=stop - start, q_row=start - lo, q_pos=start,
                                 keys=hi - lo, k_pos=lo, causal=cfg.causal, window=cfg.window)

                x = st.xs[s]
                if i == 0:
                    st.input_requant(x)
                st.em.emit_block(i, st.weights[i], st.shard, st.acts, x, 1, pos_base=start,
                                 qkv_out=_rows_view(st.kv, start - lo), attend=attend)
    programs, inputs, outputs = [], [[] for _ in range(samples)], [[] for _ in range(samples)]
    for c, st in enumerate(states):
        lo, hi = spans[c]
        programs.append(finish(npu, ChipProgram(c, st.asm, st.al, role={
            "layers": list(range(cfg.n_layers)), "tokens": list(chunks[c]),
            "keys": [lo, hi]}), check=check))
        for s, x in enumerate(st.xs):
            place = Placement(c, x.base, st.em.seq_pad, x.cols, x.row_words, tokens=chunks[c])
            inputs[s].append(place)
            outputs[s].append(place)
    meta = _meta(npu, cfg, chips, chunks, spans, [[c] for c in chunks], phases, comms, samples)
    meta["order"] = "plain"
    if order is not None:
        meta["kv_order"] = order
        meta["merge_cycles"] = [st.merge_cycles for st in states]
    return SystemProgram(npu, cfg, "sequence", programs, seq,
                         max(st.em.seq_pad for st in states), inputs, outputs, meta, comms)


def _rows_view(t: Tensor, row: int) -> Tensor:
    """``t`` from row ``row`` on (a tensor whose first row is that one)."""
    return replace(t, name=f"{t.name}[{row}:]", base=t.base + row * t.row_words,
                   rows=t.rows - row)


def _meta(npu, cfg, chips, chunks, spans, passes, phases, comms, samples):
    if len(passes[0]) > 1:
        mode = "passes"
    elif chips == 1:
        mode = "single"
    else:
        mode = "ring" if cfg.window == 0 else "halo"
    halo_bytes = sum(e["bytes"] for e in comms)
    return {"mode": mode, "window": cfg.window, "causal": cfg.causal,
            "chunks": [list(c) for c in chunks], "chunk_tokens": [b - a for a, b in chunks],
            "passes": [[list(p) for p in ps] for ps in passes],
            "key_spans": [list(s) for s in spans],
            "halo_tokens": [(a - lo) + (hi - b) for (a, b), (lo, hi) in zip(chunks, spans,
                                                                               strict=True)],
            "phases_per_layer": len(phases),
            "transfers_per_layer": sum(len(p) for p in phases),
            "halo_bytes": halo_bytes,
            "halo_bytes_per_layer": halo_bytes // max(1, cfg.n_layers * samples),
            "max_seq_len": npu.max_seq_len, "attn_window": npu.attn_window}


def _compile_passes(npu, qm, seq, samples, *, contents, check, emit):
    """One chip: passes of at most ``max_seq_len`` tokens, a halo store per layer."""
    cfg, n = qm.cfg, npu.array_size
    passes = _passes(npu, cfg, 1, seq)
    halo = max(cfg.window - 1, 0) if len(passes) > 1 else 0
    longest = max(b - a for a, b in passes)
    # RoPE's tables: every pass's positions, each pass reading its padded rows from its start.
    st = _Chip(npu, qm, 0, longest, kv_rows=halo + pad_to(longest, n), transfer=False,
               contents=contents, rope_span=(0, passes[-1][0] + pad_to(longest, n)))
    em = st.em
    # The pass residuals of every sample (each a tensor of one pass, padded to N rows).
    xs = [[em.alloc_residual(f"x{s}.{j}", 1) for j in range(len(passes))]
          for s in range(samples)]
    copy_len = st.kv_words * n           # the words of a row that hold its K|V lanes
    stores = [st.al.alloc(f"layers.{i}.kv_halo", halo, copy_len, 1, "kv_cache")
              for i in range(cfg.n_layers)] if halo else []
    blocks = _merge_blocks(npu, cfg, 1, seq)
    order = block_order(blocks, causal=cfg.causal, ring=npu.attn_window) if blocks else None
    st.activations(em.seq_pad, merge_rows=npu.attn_window if blocks else 0)
    st.q_lo = 0
    if check:
        st.al.check_capacity()
    if not emit:
        return _layout(npu, cfg, 1, seq, [st])
    comms, copied = [], [0]

    def copy(src: vl.Rows, dst: vl.Rows):
        em._vec(vl.requant_launch(size=n, length=copy_len, a=src, out=dst, mult=_COPY_MULT,
                                  shift=_COPY_SHIFT))
        st.asm.wait(Unit.VEC)
        copied[0] += src.rows * copy_len

    for s in range(samples):
        for j, (start, stop) in enumerate(passes):
            ahead = min(halo, start)            # halo rows before this pass's keys
            after = min(halo, stop) if j + 1 < len(passes) else 0
            for i in range(cfg.n_layers):

                def attend(i=i, start=start, stop=stop, ahead=ahead, after=after):
                    store = stores[i] if stores else None
                    if ahead:
                        copy(vl.Rows(store.base + (halo - ahead) * store.row_words, ahead,
                                     store.row_words, 1), st.kv_view(0, ahead))
                    if after:
                        last = ahead + stop - start - after
                        copy(st.kv_view(last, after),
                             vl.Rows(store.base + (halo - after) * store.row_words, after,
                                     store.row_words, 1))
                    if order is not None:
                        # Full attention beyond the ring (one pass): query blocks of
                        # attn_window rows over key chunks, merged.
                        for q0, q1, run in order:
                            st.emit_launches(st.merge_launches(i, q0, q1, run, lo=0))
                        return
                    st.attention(i, queries=stop - start, q_row=ahead, q_pos=start,
                                 keys=ahead + stop - start, k_pos=start - ahead,
                                 causal=cfg.causal, window=cfg.window)

                x = xs[s][j]
                if i == 0:
                    st.input_requant(x)
                em.emit_block(i, st.weights[i], st.shard, st.acts, x, 1, pos_base=start,
                              qkv_out=_rows_view(st.kv, ahead), attend=attend)
    chip = finish(npu, ChipProgram(0, st.asm, st.al, role={
        "layers": list(range(cfg.n_layers)), "tokens": [0, seq], "passes": len(passes)}),
                  check=check)
    inputs, outputs = [], []
    for s in range(samples):
        places = [Placement(0, x.base, em.seq_pad, x.cols, x.row_words, tokens=p)
                  for x, p in zip(xs[s], passes, strict=True)]
        inputs.append(places)
        outputs.append(places)
    spans = [(max(0, a - halo), b) for a, b in passes]
    meta = _meta(npu, cfg, 1, [(0, seq)], [(0, seq)], [passes], [], comms, samples)
    meta["pass_key_spans"] = [list(x) for x in spans]
    if order is not None:
        meta["kv_order"] = order
        meta["merge_cycles"] = [st.merge_cycles]
    meta["halo_store_bytes"] = sum(t.words for t in stores) * n
    meta["halo_copy_bytes"] = copied[0]
    return SystemProgram(npu, cfg, "sequence", [chip], seq, em.seq_pad, inputs, outputs, meta,
                         comms)
