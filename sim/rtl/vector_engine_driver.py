"""Drive ``hw.tile.vector_engine.VectorEngine`` in Amaranth's simulator from launches.

Stands in for the chip: for each launch (``sim.compiler.vector_launch.VectorLaunch``) it offers
the configuration beat, checks the engine's ``uses`` against the launch's generators, feeds the
words the read descriptors (RD3, RD4, RD5) select from the memory as the previous launches left
it, takes the output words (WR1, WR2) and scatters them at the write descriptors' addresses.
"""

from __future__ import annotations

import numpy as np

from sim.golden.scratchpad import addr_sequence

from .pysim import collect, run_sim, send_all, stream_put

__all__ = ["cfg_payload", "run_vector_engine"]

#: Engine stream -> the launch's descriptor attribute.
STREAMS = {"i_a": "rd3", "i_b": "rd4", "i_stats": "rd5", "o_data": "wr1", "o_q": "wr2"}


def cfg_payload(launch) -> dict:
    """The ``i_cfg`` beat of a launch: each field from its ``VU_*`` register."""
    r, flags = launch.regs, launch.regs["VU_FLAGS"]
    return {"op": r["VU_OP"], "rows": r["VU_ROWS"], "length": r["VU_LEN"], "n": r["VU_N"],
            "mult": r["VU_MULT"], "shift": r["VU_SHIFT"], "gshift": r["VU_GSHIFT"],
            "flags": {"out16": flags & 1, "per_channel": flags >> 1 & 1,
                      "a_bytes": flags >> 2 & 3, "b_bytes": flags >> 4 & 3,
                      "d_bytes": flags >> 6 & 3, "wr_data": flags >> 8 & 1,
                      "wr_q": flags >> 9 & 1, "pairs": flags >> 10 & 1,
                      "keep": flags >> 11 & 1}}


def _word(p) -> tuple:
    """An output word: its bytes, ``last`` and byte write enables (every byte without
    ``mask``)."""
    mask = int(p.mask) if hasattr(p, "mask") else (1 << len(p.data)) - 1
    return [int(x) & 0xFF for x in p.data], int(p.last), mask


def run_vector_engine(dut, mem, launches, *, addr_bits: int, rng=None, idle: float = 0.0,
                      stall: float = 0.0, max_cycles: int = 20_000):
    """Run ``launches`` one after the other on ``dut`` over the memory image ``mem`` ([words,
    N] uint8, not modified); each launch reads the memory as the previous ones left it.

    Returns ``(memory after the launches, cycles per launch, simulation statistics)``; a
    launch's cycles run from its ``i_cfg`` transfer to the last cycle of ``busy``. Checks that
    ``uses`` names exactly the launch's generators and that ``last`` marks each output stream's
    final word.
    """
    mem = mem.copy()
    state = {"k": -1, "out": [{} for _ in launches], "cycles": []}

    def words(desc):
        return mem[addr_sequence(desc.base, desc.n, desc.s, addr_bits)]

    def lanes(word):
        return {"data": [int(x) for x in word.view(np.int8)], "last": 0}

    async def wait_launch(ctx, k):
        while state["k"] < k:
            await ctx.tick()

    async def control(ctx):
        for k, launch in enumerate(launches):
            state["k"] = k
            ctx.set(dut.i_cfg.payload, cfg_payload(launch))
            uses = {"a": launch.rd3 is not None, "b": launch.rd4 is not None,
                    "stats": launch.rd5 is not None,
                    "data": launch.wr1 is not None, "q": launch.wr2 is not None}
            for name, want in uses.items():
                assert ctx.get(getattr(dut.uses, name)) == want, f"launch {k}: uses.{name}"
            await stream_put(ctx, dut.i_cfg, cfg_payload(launch))
            cycles = 0
            while ctx.get(dut.busy):
                await ctx.tick()
                cycles += 1
            state["cycles"].append(cycles)
            # Let the collectors take the final words, then write them back.
            while any(len(state["out"][k].get(s, [])) < getattr(launch, g).total
                      for s, g in (("o_data", "wr1"), ("o_q", "wr2"))
                      if getattr(launch, g) is not None):
                await ctx.tick()
            for s, g in (("o_data", "wr1"), ("o_q", "wr2")):
                desc = getattr(launch, g)
                if desc is None:
                    continue
                got = state["out"][k][s]
                lasts = [last for _, last, _ in got]
                assert lasts == [0] * (len(got) - 1) + [1], f"launch {k} {s}: last flags"
                # The bytes each word enables (o_data's mask; o_q writes whole words).
                for addr, (w, _, mask) in zip(addr_sequence(desc.base, desc.n, desc.s,
                                                            addr_bits), got, strict=True):
                    on = np.array([mask >> i & 1 for i in range(mem.shape[1])], bool)
                    mem[addr, on] = np.array(w, np.uint8)[on]
            state["k"] = k + 0.5

    def port(name, gen):
        """The testbench of one engine stream: per launch, feed (``i_*``) or collect (``o_*``)
        the words of its descriptor, then wait for the next launch."""
        async def bench(ctx):
            for k, launch in enumerate(launches):
                await wait_launch(ctx, k)
                desc = getattr(launch, gen)
                if desc is not None and name.startswith("i_"):
                    await send_all(ctx, getattr(dut, name), [lanes(w) for w in words(desc)],
                                   rng=rng, idle=idle)
                elif desc is not None:
                    state["out"][k][name] = await collect(
                        ctx, getattr(dut, name), desc.total, rng=rng, stall=stall,
                        convert=_word)
                while state["k"] == k:
                    await ctx.tick()
        return bench

    benches = [control] + [port(s, g) for s, g in STREAMS.items()]
    stats = run_sim(dut, benches, max_cycles=max_cycles)
    return mem, state["cycles"], stats
