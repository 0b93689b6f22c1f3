"""Cycles of collectives on the ring: the step-synchronous and the pipelined bounds and the
engines' exact cost.

Plain Python: the gateware's tests, the ``npu collective`` report, the benchmarks and the
timing model read these. Semantics and schedules: :mod:`hw.spec.collective`.
"""

from __future__ import annotations

import math

from ..collective import (
    CollectiveRequest,
    Kind,
    bidirectional_split,
    step_words,
    steps,
    word_bytes,
)

__all__ = ["ring_bound_cycles", "pipelined_bound_cycles", "hop_latency", "predicted_cycles",
           "system_cycles"]


def ring_bound_cycles(kind: Kind, message_bytes: int, n: int, link_bytes: int,
                      latency: int) -> int:
    """Step-synchronous ring cost: ``steps * (ceil(M / (N*B)) + a)``.

    ``steps`` is ``2(N-1)`` for all-reduce and ``N-1`` for reduce-scatter and all-gather.
    ``kind`` is a :class:`~hw.spec.collective.Kind` or its name (``"all_reduce"``).
    """
    kind = Kind[kind.upper()] if isinstance(kind, str) else Kind(kind)
    hops = 2 * (n - 1) if kind == Kind.ALL_REDUCE else n - 1
    return hops * (math.ceil(message_bytes / (n * link_bytes)) + latency)


def pipelined_bound_cycles(kind: Kind, message_bytes: int, n: int, link_bytes: int,
                           latency: int, directions: int = 1) -> int:
    """A lower bound on a ring collective whose chips forward each word as it arrives:
    ``max(S w + a, S a + w)`` with ``S`` steps (:func:`ring_bound_cycles`) and blocks of
    ``w = ceil(M / (n B d))`` cycles on each of ``d`` directions' links. Each link carries
    ``S`` blocks one after the other, the last word then ``a`` cycles on its way; and the
    last step's block cannot start before a chain of ``S`` hops of ``a`` cycles. Unlike the
    step-synchronous ``S (w + a)``, it holds where a hop's latency overlaps the blocks (links
    of hundreds of cycles)."""
    kind = Kind[kind.upper()] if isinstance(kind, str) else Kind(kind)
    hops = 2 * (n - 1) if kind == Kind.ALL_REDUCE else n - 1
    w = math.ceil(message_bytes / (n * link_bytes * directions))
    return max(hops * w + latency, hops * latency + w)


def hop_latency(link_bytes: int, latency: int) -> int:
    """Cycles from a word entering a link to it being readable from the next engine's buffer.

    The ``a`` link registers and the wait for the word's remaining ``D/B - 1`` flits; a word
    that finds the receive buffer empty and the engine ready is combined in that cycle, else
    it is read from the buffer one cycle later at the earliest.
    """
    ratio = word_bytes(link_bytes) // link_bytes
    return latency + ratio - 1


def predicted_cycles(req: CollectiveRequest, link_bytes: int, latency: int) -> int:
    """Cycles the engines take for ``req`` without stalls (the ``cycles`` of RingTestbed).

    A word-level walk of every chip's schedule with the engine's rules: a chip combines at most
    one word per cycle, once its local word is there (the test DMA's first word two cycles
    after ``start``) and its ring word is: in the cycle the word leaves the link (``hop_latency``
    after the upstream chip's link took it) if the chip's receive buffer is empty and it is
    waiting, else one cycle later at the earliest. A combined word enters its link one cycle
    later, at most one per ``c = D/B`` cycles. The walk iterates to a fixed point around the
    ring and assumes no stalls and an always-ready output stream. In closed form, for blocks of
    ``w`` words and ``S`` transmitting steps, the result is about ``S * max(w*c, hop + 1) +
    hop + 4``.
    """
    wbytes = word_bytes(link_bytes)
    c = wbytes // link_bytes
    hop = hop_latency(link_bytes, latency)
    chips = req.chips
    scheds = [steps(req, i) for i in range(chips)]
    sent = [[] for _ in range(chips)]
    done = [0] * chips
    # Each round settles one more hop of the ring's dependencies.
    for _ in range(2 * chips + 2 + 2 * max(len(x) for x in scheds)):
        new_sent = [[] for _ in range(chips)]
        for i in range(chips):
            up = sent[(i - 1) % chips]
            t = 1                 # first cycle an engine may fire (command accepted at 0)
            local_ready = 2       # the test DMA's first word is valid two cycles after start
            link_free = 0         # first cycle the link accepts the next word
            last_accept = 0
            last_rx = -1
            dropped = False
            at = 0
            for step in scheds[i]:
                count = step_words(req, step, wbytes)
                if count == 0:
                    t += 1
                for _ in range(count):
                    if step.local:
                        t = max(t, local_ready)
                    if step.rx:
                        arrive = up[at] if at < len(up) else 10 ** 9
                        at += 1
                        # straight from the link if the buffer is empty and the engine waits
                        direct = t <= arrive and last_rx < arrive
                        t = arrive if direct else max(t, arrive + 1)
                        last_rx = t
                    fire = t
                    if step.tx:
                        # the transmit buffer's read latency
                        accept = max(fire + 1, link_free)
                        link_free = accept + c
                        new_sent[i].append(accept + hop)
                        last_accept = accept
                    t = fire + 1
                    dropped = not (step.tx or step.out)
            done[i] = max(t + 2 - dropped, last_accept + 2) if scheds[i] else 2
        if new_sent == sent:
            break
        sent = new_sent
    return max(done)


def system_cycles(req: CollectiveRequest, link_bytes: int, latency: int,
                  bidirectional: bool = False) -> int:
    """Cycles of ``req`` on a :class:`~hw.ring.testbed.RingTestbed` (both rings when
    bidirectional)."""
    if not bidirectional:
        return predicted_cycles(req, link_bytes, latency)
    forward, reverse = bidirectional_split(req)
    cycles = predicted_cycles(forward, link_bytes, latency)
    if reverse is not None:
        cycles = max(cycles, predicted_cycles(reverse, link_bytes, latency))
    return cycles
