"""Split-KV decode (``npu sim --generate N --strategy sequence --chips C``): a context longer
than one chip's KV cache, its positions cached in chunks across a chain of chips.

A decode step attends its cache in one ``ATTN`` on one chip, so one chip decodes at most
``attn_window`` positions. Here chip ``c`` caches the positions ``[s_c, e_c)`` of every block
(:func:`kv_chunks`: the context split like ``numpy.array_split``, each chunk within
``attn_window``); the prompt's positions fill the chunks in order and **every generated token's
K/V is appended on the last chip**, whose chunk runs to the end of the context (one chip, so
that its cache row and its key count are affine in the step and the step stays one static
loop body). Everything but attention (embedding, norms, projections, FFN, LM head, argmax) runs
**replicated** on every chip: a step's work outside attention is one row per sequence, about
as dear as the hop that would broadcast it, and each chip then holds the new token's Q, K and V
itself (no transfer of queries), picks the same token and feeds it back with no message.

Attention merges partial softmaxes with the engine's state rows (``docs/isa.md``, ATTN; golden
``sim.golden.ring_softmax``), the same launches as ring attention and one chip in passes
(``sim.compiler.sequence.merge_launches``). The hardware merges a state with a chunk of keys,
not two states, so the state travels to the keys, down a chain, instead of the keys to the
state (ring attention's direction)::

    chip C-1: ATTN first  (its keys s .. p)           -> state rows; SEND them to chip C-2
    chip c:   RECV state; ATTN middle (its chunk)    -> state rows; SEND them to chip c-1
    chip 0:   RECV state; ATTN last (its chunk)      -> o (normalised, int8); SEND o to chip 1
    chip c:   RECV o; SEND o to chip c+1             (every chip needs o for its O projection)

per layer and step; a message is one state row per sequence and head (the Q words and
``ceil(4 (d_head + 2) / N)`` state words) down the chain and ``B`` rows of ``o`` back. The
merge order of a query at position ``p`` is therefore the chips' chunks from the last to
the first (:func:`sim.golden.decode.split_kv_order`), which the golden decode takes. A chip's
attention is serial along the chain (the hardware has no state-with-state merge, which a
parallel split would need): split-KV decode relieves capacity, not attention latency.

**The prefill** (``P`` prompt tokens, at most ``max_seq_len``) runs replicated too: every
chip computes the Q/K/V rows of the whole prompt into its working Q/K/V tensor (one layer's at
a time, not cached), runs its attention like one chip in passes (``P > attn_window``: query
blocks of ``attn_window`` rows over key chunks, merged in ``hw.spec.attention.chunk_order``;
golden ``sim.golden.decode.prefill_order``) and copies the K|V words of its own positions into
its cache (``VEC REQUANT`` with ``(2**15, 15)``, exact on int8). Every chip thus holds the
whole model's weights and its share of the cache; the time to first token is one chip's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hw.spec import ConfigError, ModelConfig, NpuConfig
from hw.spec.attention import STATE_LANE_BYTES
from hw.spec.isa import Unit

from ..golden.decode import prefill_order
from . import attention_launch as al_
from . import p2p_launch as pl
from . import vector_launch as vl
from .alloc import Tensor
from .sequence import merge_launches, split_tokens

__all__ = ["kv_chunks", "check_split", "SplitChip"]

#: ``requant(x, 2**15, 15) = x`` for every int8 x: the vector unit's exact copy.
_COPY_MULT, _COPY_SHIFT = 1 << 15, 15


def kv_chunks(context: int, chips: int) -> list[tuple[int, int]]:
    """``[s_c, e_c)``: the positions chip ``c`` caches (``numpy.array_split`` of the
    context)."""
    return split_tokens(context, chips)


def check_split(npu: NpuConfig, cfg: ModelConfig, prompt_len: int, generate: int,
                chips: int):
    """ValueError (one line: ConfigError naming the key) unless ``chips`` chips can split the
    KV cache of a ``prompt_len + generate - 1``-token context."""
    context = prompt_len + generate - 1
    if cfg.window:
        raise ConfigError(f"is {cfg.window}: split-KV decode (--strategy sequence) merges full "
                          "attention over the chips' chunks; a windowed model decodes on one "
                          "chip's ring", path=cfg.path, key="window", value=cfg.window)
    if chips < 2:
        raise ValueError(f"split-KV decode needs at least 2 chips, not {chips}")
    if context < 2 * chips:
        raise ValueError(f"a context of {context} tokens on {chips} chips: split-KV decode "
                         "needs at least 2 positions a chip (the softmax's 2 lanes)")
    chunks = kv_chunks(context, chips)
    longest = max(b - a for a, b in chunks)
    if longest > npu.attn_window:
        raise ConfigError(f"holds {npu.attn_window} keys: a context of {context} tokens "
                          f"(prompt {prompt_len} + {generate} generated - 1) on {chips} chips "
                          f"is chunks of {longest}; use at least "
                          f"{math.ceil(context / npu.attn_window)} chips", path=npu.path,
                          key="attn_window", value=npu.attn_window)
    s = chunks[-1][0]
    if prompt_len <= s:
        raise ValueError(f"the last of {chips} chips caches positions {s}..{context - 1}, "
                         f"the generated tokens among them, and must hold a prompt token: a "
                         f"prompt of {prompt_len} tokens needs at least {s + 1} (or fewer "
                         "generated tokens)")
    if prompt_len > npu.attn_window and npu.array_size % STATE_LANE_BYTES:
        raise ConfigError(f"is not a multiple of {STATE_LANE_BYTES}: a prompt of {prompt_len} "
                          f"tokens beyond attn_window={npu.attn_window} runs in passes whose "
                          "state rows are int32 lanes in whole words", path=npu.path,
                          key="array_size", value=npu.array_size)


@dataclass
class SplitChip:
    """One chip's attention of a split-KV decode (module docstring): ``chunks`` of every
    chip, this ``chip``'s index; its ``caches`` (per layer: rows ``(p - s) * B + b`` for
    position ``p`` of sequence ``b``), working tensors ``acts`` (``acts.qkv``: the prefill's
    and a step's Q/K/V rows), the prefill's state rows ``state`` (``attn_window`` rows a head,
    ``srw`` words each; None when the prompt fits the ring) and the step's state rows
    ``sbuf`` (a row per sequence and head, whole ring words: the chain's message)."""

    em: object
    chunks: list
    chip: int
    batch: int
    prompt_len: int
    caches: dict
    acts: object
    lay: object
    srw: int
    state: Tensor | None
    sbuf: Tensor

    @property
    def own(self) -> tuple[int, int]:
        return self.chunks[self.chip]

    @property
    def last(self) -> bool:
        return self.chip == len(self.chunks) - 1

    def step_qkv(self, i: int, pos: int, b_pad: int) -> Tensor:
        """Where a step's QKV matmul writes: the last chip's cache rows of position ``pos``,
        the working rows elsewhere (the token is cached on the last chip only)."""
        t = self.caches[i] if self.last else self.acts.qkv
        first = (pos - self.own[0]) * self.batch if self.last else 0
        return Tensor(t.name, t.base + first * t.row_words, b_pad, t.cols, t.eb, t.row_words,
                      t.category)

    def prefill_attend(self, a, i: int, b: int):
        """Sequence ``b``'s prompt attention over the whole prompt's rows in ``acts.qkv``
        (one chip in passes when longer than the ring), and the copy of this chip's positions'
        K|V words into its cache."""
        em, npu, cfg = self.em, self.em.npu, self.em.cfg
        n, P, qkv, o = em.n, self.prompt_len, self.acts.qkv, self.acts.o
        order = prefill_order(P, npu.attn_window)
        L = em.qm.layers[i]
        if order is None:
            for k in range(cfg.n_heads):
                g = k // cfg.kv_group
                al_.emit(a, al_.attention_launch(
                    size=n, d_head=cfg.d_head, queries=P, keys=max(P, 2), q_base=qkv.base,
                    k_base=qkv.base, v_base=qkv.base, o_base=o.base,
                    q_row_words=qkv.row_words, k_row_words=qkv.row_words,
                    v_row_words=qkv.row_words, o_row_words=o.row_words,
                    col=self.lay.q_col(k), k_col=self.lay.k_col(g), v_col=self.lay.v_col(g),
                    score_mult=L.score_mult, score_shift=L.score_shift, out_mult=L.out_mult,
                    out_shift=L.out_shift), ("attn", i))
        else:
            for q0, q1, run in order:
                launches, _ = merge_launches(em, qkv, self.lay, o, 0, self.state,
                                             npu.attn_window, self.srw, i, q0, q1, run, lo=0)
                for _, heads in launches:
                    for launch in heads:
                        al_.emit(a, launch, ("attn", i))
        s, e = self.own
        count = min(e, P) - s
        cache, rw = self.caches[i], qkv.row_words
        first, words = self.lay.k // n, -(-self.lay.main // n) - self.lay.k // n
        vl.emit(a, vl.requant_launch(
            size=n, length=words * n, a=vl.Rows(qkv.base + s * rw + first, count, rw, 1),
            out=vl.Rows(cache.base + b * rw + first, count, self.batch * rw, 1),
            mult=_COPY_MULT, shift=_COPY_SHIFT))

    def step_attend(self, a, i: int, pos: int):
        """A step's attention at position ``pos`` for every sequence: this chip's link of the
        chain (module docstring)."""
        em, cfg = self.em, self.em.cfg
        n, link = em.n, em.npu.link_bytes_per_cycle
        c, last_chip = self.chip, len(self.chunks) - 1
        s, e = self.own
        cache, o, qkv = self.caches[i], self.acts.o, self.acts.qkv
        rw, B = cache.row_words, self.batch
        L = em.qm.layers[i]
        sbuf = pl.contiguous(self.sbuf.base, self.sbuf.words)
        o_msg = pl.contiguous(o.base, pl.message_words(B * o.row_words, n, link))
        a.wait(Unit.SEND)           # the previous layer's message has left its buffer
        if c < last_chip:
            pl.emit(a, pl.recv_launch(src=c + 1, desc=sbuf, size=n, link_bytes=link))
            a.wait(Unit.RECV)
        mode = "first" if c == last_chip else "last" if c == 0 else "middle"
        keys = pos - s + 1 if c == last_chip else e - s
        for b in range(B):
            q_row = (pos - s) * B + b if c == last_chip else b
            q_base = (cache.base if c == last_chip else qkv.base) + q_row * rw
            for k in range(cfg.n_heads):
                g = k // cfg.kv_group
                out = {"o_base": o.base + b * o.row_words, "o_row_words": o.row_words} \
                    if mode == "last" else {}
                al_.emit(a, al_.state_launch(
                    mode=mode, size=n, d_head=cfg.d_head, queries=1, keys=keys,
                    q_base=q_base, q_row_words=rw, col=self.lay.q_col(k),
                    k_base=cache.base + b * rw, v_base=cache.base + b * rw,
                    k_row_words=B * rw, v_row_words=B * rw, k_col=self.lay.k_col(g),
                    v_col=self.lay.v_col(g),
                    s_base=self.sbuf.base + (b * cfg.n_heads + k) * self.srw,
                    s_row_words=self.srw, q_pos=pos, k_pos=s, bidirectional=True,
                    score_mult=L.score_mult, score_shift=L.score_shift,
                    out_mult=L.out_mult, out_shift=L.out_shift, **out), ("attn", i))
        a.wait(Unit.ATTN)
        if c > 0:
            pl.emit(a, pl.send_launch(dest=c - 1, desc=sbuf, size=n, link_bytes=link))
            pl.emit(a, pl.recv_launch(src=c - 1, desc=o_msg, size=n, link_bytes=link))
            a.wait(Unit.RECV)
        if c < last_chip:
            pl.emit(a, pl.send_launch(dest=c + 1, desc=o_msg, size=n, link_bytes=link))
