"""Run one collective on the ring testbed (:class:`hw.ring.testbed.RingTestbed`) in pysim.

:func:`simulate_collective` is the driver the tests, the benchmarks and ``npu collective``
share: it packs each chip's buffer into its test DMA in the engine's stream order, issues the
command, waits for the ring to go idle (watchdog: :class:`~sim.rtl.pysim.SimulationTimeout`)
and unpacks every chip's output.
"""

from __future__ import annotations

import numpy as np

from hw.ring.testbed import RingTestbed
from hw.spec.collective import (
    CollectiveRequest,
    Kind,
    bidirectional_split,
    check_fits,
    chunk_of,
    local_blocks,
    max_block_words,
    output_blocks,
    pack_blocks,
    reverse_rank,
    step_words,
    steps,
    unpack_blocks,
    word_bytes,
)

from .pysim import run_sim

__all__ = ["command_value", "simulate_collective"]


def command_value(req: CollectiveRequest | None) -> dict:
    """The testbed's command (:func:`hw.ring.testbed.testbed_command_layout`) for ``req``
    (None: no collective, ``count`` 0): the block geometry divided here, on the host."""
    if req is None:
        return {"kind": 0, "op": 0, "wide": 0, "length": 0, "block": 0, "longer": 0,
                "chips": 0, "first": 0, "count": 0, "chunks": 0, "in_place": 0, "divisor": 0}
    q, r = divmod(req.length, req.count)
    return {"kind": int(req.kind), "op": int(req.op), "wide": int(req.width == 64),
            "length": req.length, "block": q, "longer": r, "chips": req.chips,
            "first": req.first, "count": req.count, "chunks": req.chunks - 1,
            "in_place": int(req.in_place), "divisor": req.divisor or 0}


def buffer_words_needed(req: CollectiveRequest, wbytes: int) -> int:
    need = 1
    for chip in range(req.chips):
        sched = steps(req, chip)
        for flag in ("local", "out"):
            need = max(need, sum(step_words(req, s, wbytes) for s in sched if getattr(s, flag)))
    return need + 1


def _rings(req: CollectiveRequest, npu, inputs):
    """``[(request, {chip: rank}, {chip: vector})]`` per ring the system uses for ``req``."""
    if not npu.link_bidirectional:
        return [(req, {c: c for c in range(req.chips)}, dict(enumerate(inputs)))]
    forward, reverse = bidirectional_split(req)
    if reverse is None:
        return [(forward, {c: c for c in range(req.chips)}, dict(enumerate(inputs)))]
    cut = forward.length
    return [(forward, {c: c for c in range(req.chips)},
             {c: np.asarray(x)[:cut] for c, x in enumerate(inputs)}),
            (reverse, {c: reverse_rank(c, req.chips) for c in range(req.chips)},
             {c: np.asarray(x)[cut:] for c, x in enumerate(inputs)})]


def simulate_collective(npu, req: CollectiveRequest, inputs: list, *, stall: float = 0.0,
                        seed: int = 0, max_cycles: int = 200_000, vcd: str | None = None,
                        fifo_words: int | None = None, avg: bool = True):
    """Simulate ``req`` on a :class:`RingTestbed` built for ``npu`` with pysim.

    ``inputs[i]`` is chip ``i``'s local vector (for all-gather, its block). ``stall`` is the
    probability, per cycle and per injection point (every link register, every DMA), of a stall.
    ``fifo_words`` defaults to the largest block (at least 16 words). On a bidirectional ring
    an all-reduce is split between the two rings (:func:`bidirectional_split`). ``avg=False``
    builds the engines without AVG's divider, as an FPGA build does (an AVG gives the sum). Returns
    ``{"outputs": [each chip's result, empty outside the group], "cycles", "sim": {...}}``.
    """
    wbytes = word_bytes(npu.link_bytes_per_cycle)
    rings = _rings(req, npu, inputs)
    depth = max(buffer_words_needed(r, wbytes) for r, _, _ in rings)
    fifo_words = fifo_words or max(16, *(max_block_words(r, wbytes) for r, _, _ in rings))
    for r, _, _ in rings:
        check_fits(r, wbytes, fifo_words)
    system = RingTestbed(npu=npu, chips=req.chips, buffer_words=depth, fifo_words=fifo_words,
                         avg=avg)
    dma_sets = [system.dmas, system.rev_dmas][:len(rings)]
    plans = []   # per ring: loads, output word counts, output blocks per chip
    for r, rank, vectors in rings:
        one = chunk_of(r)
        loads, counts, blocks = [], [], []
        for chip in range(req.chips):
            v = rank[chip]
            local = local_blocks(one, v)
            size = len(np.asarray(vectors[chip])) // r.chunks if local else 0
            loads.append([w for c in range(r.chunks) for w in pack_blocks(
                np.asarray(vectors[chip])[c * size:(c + 1) * size], one, local, wbytes)]
                if local else [])
            counts.append(sum(step_words(r, s, wbytes) for s in steps(r, v) if s.out))
            blocks.append(output_blocks(one, v))
        plans.append((loads, counts, blocks))
    result = {}

    async def bench(ctx):
        for dmas, (loads, _, _) in zip(dma_sets, plans, strict=True):
            for dma, words in zip(dmas, loads, strict=True):
                for addr, word in enumerate(words):
                    ctx.set(dma.in_mem.data[addr], word)
        ctx.set(system.cmd, command_value(rings[0][0]))
        ctx.set(system.rev_cmd, command_value(rings[1][0] if len(rings) > 1 else None))
        ctx.set(system.start, 1)
        await ctx.tick()
        ctx.set(system.start, 0)
        # A plain loop rather than ctx.tick().until(): if the watchdog fires, an abandoned
        # until() generator raises again when it is garbage-collected.
        await ctx.tick()
        while ctx.get(system.busy):
            await ctx.tick()
        result["cycles"] = ctx.get(system.cycles)
        result["words"] = [[[ctx.get(dma.out_mem.data[a]) for a in range(count)]
                            for dma, count in zip(dmas, counts, strict=True)]
                           for dmas, (_, counts, _) in zip(dma_sets, plans, strict=True)]

    processes = []
    if stall > 0:
        rng = np.random.default_rng(seed)
        link_bits, dma_bits = len(system.stall), len(system.dma_stall)

        async def staller(ctx):
            async for _ in ctx.tick():
                bits = np.flatnonzero(rng.random(link_bits) < stall)
                ctx.set(system.stall, int(sum(1 << int(k) for k in bits)))
                bits = np.flatnonzero(rng.random(dma_bits) < stall)
                ctx.set(system.dma_stall, int(sum(1 << int(k) for k in bits)))

        processes.append(staller)
    stats = run_sim(system, [bench], processes=processes, max_cycles=max_cycles, vcd=vcd)
    dtype = np.int32 if req.width == 32 else np.int64
    outputs = []
    for chip in range(req.chips):
        pieces = []
        for (r, rank, vectors), (_, _, blocks), words in zip(rings, plans, result["words"],
                                                             strict=True):
            if not blocks[chip]:
                continue
            one = chunk_of(r)
            per = len(words[chip]) // r.chunks
            for c in range(r.chunks):
                parts = unpack_blocks(words[chip][c * per:(c + 1) * per], one, blocks[chip],
                                      wbytes)
                if r.in_place:      # the own block stayed where it was: the chip's input
                    own = np.asarray(vectors[chip])
                    size = len(own) // r.chunks
                    parts[one.position(rank[chip])] = own[c * size:(c + 1) * size]
                if r.kind in (Kind.REDUCE_SCATTER, Kind.SEND_RECV):
                    pieces.append(parts[blocks[chip][0]])
                else:
                    pieces.append(np.concatenate([parts[b] for b in sorted(parts)]))
        outputs.append(np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype))
    return {"outputs": outputs, "cycles": result["cycles"], "sim": stats}
