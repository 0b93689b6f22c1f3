"""Run one program per chip on :class:`hw.chip_system.ChipSystem` in Amaranth's simulator: load
every chip through its host port, start them together, wait for all to be done (or the
watchdog), read results back."""

from __future__ import annotations

import numpy as np

from hw.chip_system import ChipSystem
from hw.spec import NpuConfig

from .chip_runner import ints_to_words, words_to_ints
from .pysim import SimulationTimeout, run_sim

__all__ = ["run_system_pysim"]


def run_system_pysim(npu: NpuConfig, programs: list[list[int]],
                     images: list[dict[int, np.ndarray]], reads: list[list[tuple[int, int]]], *,
                     max_cycles: int = 1_000_000, vcd: str | None = None) -> dict:
    """Chip ``i`` runs ``programs[i]`` on ``images[i]``; ``reads[i]`` are read back from it.

    Returns ``{"regions": [[words per read] per chip], "cycles", "chip_cycles",
    "busy_cycles" (per chip), "errors" (per chip), "wall_s", "cycles_per_s"}``. Raises
    :class:`SimulationTimeout` when not every chip is done within ``max_cycles`` cycles.
    """
    chips = len(programs)
    if len(images) != chips or len(reads) != chips:
        raise ValueError(f"{chips} programs but {len(images)} images and {len(reads)} reads")
    for i, program in enumerate(programs):
        if len(program) > npu.imem_words:
            raise ValueError(f"chip {i}'s program of {len(program)} instructions exceeds "
                             f"imem_words {npu.imem_words}")
    dut = ChipSystem(npu=npu, chips=chips)
    out = {"regions": [[] for _ in range(chips)]}
    load_words = sum(len(p) for p in programs) + sum(
        len(w) for img in images for w in img.values())

    async def host(ctx):
        for i in range(chips):
            port = dut.host_imem[i]
            ctx.set(port.valid, 1)
            for a, word in enumerate(programs[i]):
                ctx.set(port.payload, {"addr": a, "data": word})
                await ctx.tick()
            ctx.set(port.valid, 0)
            port = dut.host_wr[i]
            ctx.set(port.valid, 1)
            for base, words in images[i].items():
                for k, value in enumerate(words_to_ints(words)):
                    ctx.set(port.payload, {"addr": base + k, "data": value})
                    await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        ran = 0
        while not ctx.get(dut.done):
            await ctx.tick()
            ran += 1
            if ran > max_cycles:
                raise SimulationTimeout(f"the chips did not all halt within "
                                        f"max_cycles={max_cycles}")
        out["cycles"] = ctx.get(dut.cycles)
        out["chip_cycles"] = [ctx.get(c) for c in dut.chip_cycles]
        out["busy_cycles"] = [[ctx.get(c) for c in chip.busy_cycles] for chip in dut.chip]
        out["errors"] = [bool(ctx.get(chip.error)) for chip in dut.chip]
        for i in range(chips):
            addr, rdata = dut.host_rd_addr[i], dut.host_rd_data[i]
            ctx.set(rdata.ready, 1)
            for base, count in reads[i]:
                values = []
                for k in range(count):
                    ctx.set(addr.payload, {"addr": base + k, "last": 0})
                    ctx.set(addr.valid, 1)
                    await ctx.tick().until(addr.ready)
                    ctx.set(addr.valid, 0)
                    (value,) = await ctx.tick().sample(rdata.payload.data).until(rdata.valid)
                    values.append(int(value))
                out["regions"][i].append(ints_to_words(values, npu.word_bytes))
            ctx.set(rdata.ready, 0)

    n_reads = sum(c for r in reads for _, c in r)
    stats = run_sim(dut, [host], max_cycles=load_words + max_cycles + 10 * n_reads + 100,
                    vcd=vcd)
    out.update(wall_s=stats["wall_s"], cycles_per_s=stats["cycles_per_s"])
    return out
