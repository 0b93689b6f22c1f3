"""Drive ``hw.tile.attention_engine.AttentionEngine`` in Amaranth's simulator from launches.

Stands in for the chip: for each launch (``sim.compiler.attention_launch.AttentionLaunch``) it
offers the configuration beat and the words the read descriptors (RD3 K, RD4 V, RD5 Q) select
from a memory image, takes the output words, and scatters their enabled bytes (``mask``: a packed
head's lanes) at the write descriptor's (WR1) addresses into a copy of the memory. A launch
without a descriptor for RD3 or RD4 (the split-score passes) streams no words there; the engine's
``uses`` must agree. Shared by the tests and the benchmark.
"""

from __future__ import annotations

import numpy as np

from hw.spec.attention import split_mode
from sim.golden.scratchpad import addr_sequence

from .pysim import collect, run_sim, send_all, stream_put

__all__ = ["cfg_payload", "run_attention_engine"]


def cfg_payload(launch) -> dict:
    """The ``i_cfg`` beat of a launch: each field from its ``AT_*`` register."""
    r = launch.regs
    return {"queries": r["AT_QUERIES"], "keys": r["AT_KEYS"], "q_pos": r["AT_Q_POS"],
            "k_pos": r["AT_K_POS"], "window": r["AT_WINDOW"], "flags": r["AT_FLAGS"],
            "score_mult": r["AT_SCORE_MULT"], "score_shift": r["AT_SCORE_SHIFT"],
            "out_mult": r["AT_OUT_MULT"], "out_shift": r["AT_OUT_SHIFT"],
            "d_head": r["AT_D_HEAD"],
            **{f"{s}_lane": r.get(f"AT_{s.upper()}_LANE", 0) for s in "qkvo"}}


def run_attention_engine(dut, mem, launches, *, addr_bits, rng=None, idle=0.0, stall=0.0,
                         max_cycles=100_000) -> tuple[np.ndarray, int, dict]:
    """Run ``launches`` one after the other on ``dut`` over the memory image ``mem``
    ([words, N] uint8, not modified).

    Returns the memory after the launches, the cycles from the first configuration beat's
    transfer to the final output word's (a partial pass last: to its last cycle busy), and the
    simulation statistics. Checks that ``last``
    marks each launch's final word and that ``busy`` is high during a launch and low after it.
    """
    def words(desc):
        if desc is None:
            return []
        return mem[addr_sequence(desc.base, desc.n, desc.s, addr_bits)]

    streams = {name: [{"data": [int(x) for x in w.view(np.int8)], "last": 0}
                      for launch in launches for w in words(getattr(launch, gen))]
               for name, gen in (("i_k", "rd3"), ("i_v", "rd4"), ("i_q", "rd5"))}
    counts = [launch.wr1.total for launch in launches]
    seeds = rng.integers(0, 2**32, size=4) if rng is not None else [None] * 4
    rngs = [np.random.default_rng(s) if s is not None else None for s in seeds]
    out, times, clock = [], {}, [0]

    async def control(ctx):
        for i, launch in enumerate(launches):
            ctx.set(dut.i_cfg.payload, cfg_payload(launch))
            uses = (ctx.get(dut.uses.k), ctx.get(dut.uses.v))
            assert uses == (launch.rd3 is not None, launch.rd4 is not None), \
                f"launch {i}: the engine uses K, V = {uses}, its descriptors say otherwise"
            await stream_put(ctx, dut.i_cfg, cfg_payload(launch))
            times.setdefault("cfg", clock[0])
            if i + 1 < len(launches):
                await ctx.tick()   # busy is visible from the cycle after the beat
                assert ctx.get(dut.busy), f"engine not busy after launch {i}'s configuration"

    async def drain(ctx):
        out.extend(await collect(ctx, dut.o, sum(counts), rng=rngs[0], stall=stall,
                                 convert=lambda p: ([int(x) & 0xFF for x in p.data],
                                                    int(p.last), int(p.mask))))
        times["last"] = clock[0]
        # A partial pass ends when the buffer's last dropped row is taken too (a few cycles
        # after its last word); every other launch with its last word.
        tail = split_mode(launches[-1].regs["AT_FLAGS"]) == "partial"
        while tail and ctx.get(dut.busy) and clock[0] - times["last"] < 10_000:
            await ctx.tick()
            times["last"] = clock[0]
        await ctx.tick()
        assert not ctx.get(dut.busy), "engine still busy after its last word"

    async def count(ctx):
        async for _ in ctx.tick():
            clock[0] += 1

    benches = [control, drain]
    for i, name in enumerate(streams):
        async def feed(ctx, name=name, i=i):
            await send_all(ctx, getattr(dut, name), streams[name], rng=rngs[1 + i], idle=idle)
        benches.append(feed)
    stats = run_sim(dut, benches, processes=[count], max_cycles=max_cycles)
    lasts = [last for _, last, _ in out]
    want = [int(i == c - 1) for c in counts for i in range(c)]
    assert lasts == want, f"`last` flags {lasts}, want each launch's final word only"
    result = mem.copy()
    start = 0
    size = mem.shape[1]
    for launch, n in zip(launches, counts, strict=True):
        d = launch.wr1
        # Each word's bytes where its mask is set (a packed head's lanes).
        for addr, (word, _, mask) in zip(addr_sequence(d.base, d.n, d.s, addr_bits),
                                         out[start:start + n], strict=True):
            enable = np.array([mask >> i & 1 for i in range(size)], bool)
            result[addr, enable] = np.array(word, np.uint8)[enable]
        start += n
    return result, times["last"] - times["cfg"], stats
