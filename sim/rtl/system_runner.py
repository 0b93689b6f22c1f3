"""Run one program per chip on :class:`hw.system.ChipSystem` in Amaranth's simulator: load
every chip through its host port, start them together, wait for all to be done (or the
watchdog), read results back."""

from __future__ import annotations

import numpy as np

from hw.spec import NpuConfig
from hw.spec.isa import BUSY_COUNTERS
from hw.spec.ring import check_rtl_chips
from hw.spec.topology import Topology
from hw.system import ChipSystem
from hw.tile.ports import trace_depth

from .chip_runner import busy_units, host_load, host_read, read_trace, wait_done
from .pysim import run_sim

__all__ = ["run_system_pysim", "check_system_inputs"]


def check_system_inputs(npu, programs, images, reads) -> int:
    """The chip count of a system run; ``ValueError`` when the images or reads do not match
    the programs, a program exceeds ``imem_words`` or there are more chips than a system
    holds (shared by every system backend)."""
    chips = check_rtl_chips(len(programs))
    if len(images) != chips or len(reads) != chips:
        raise ValueError(f"{chips} programs but {len(images)} images and {len(reads)} reads")
    for i, program in enumerate(programs):
        if len(program) > npu.imem_words:
            raise ValueError(f"chip {i}'s program of {len(program)} instructions exceeds "
                             f"imem_words {npu.imem_words}")
    return chips


def run_system_pysim(npu: NpuConfig, programs: list[list[int]],
                     images: list[dict[int, np.ndarray]], reads: list[list[tuple[int, int]]], *,
                     max_cycles: int = 1_000_000, vcd: str | None = None,
                     link_stalls: float = 0.0, seed: int = 0, progress=None,
                     topology: Topology | None = None) -> dict:
    """Chip ``i`` runs ``programs[i]`` on ``images[i]``; ``reads[i]`` are read back from it.
    The chips are a ring, or ``topology`` (a ring or a torus: ``ChipSystem`` of it).

    ``link_stalls`` is the probability per cycle and per link register of a stall (from
    ``seed``): only cycles change. Returns ``{"regions": [[words per read] per chip],
    "cycles", "chip_cycles", "busy_cycles" (per chip, ``hw.spec.isa.BUSY_COUNTERS``),
    "traces" (per chip), "errors" (per chip), "wall_s", "cycles_per_s"}``. Raises
    :class:`SimulationTimeout` when not every chip is done within ``max_cycles`` cycles,
    naming what each unfinished chip was doing.
    """
    chips = check_system_inputs(npu, programs, images, reads)
    dut = ChipSystem(npu=npu, chips=chips, topology=topology)
    out = {"regions": [[] for _ in range(chips)]}
    load_words = sum(len(p) for p in programs) + sum(
        len(w) for img in images for w in img.values())

    def describe(ctx):
        done = ctx.get(dut.chip_done)
        waiting = [f"chip {i} at pc {ctx.get(dut.chip_pc[i])} busy with "
                   f"{busy_units(ctx.get(dut.chip_busy[i]))}"
                   for i in range(chips) if not done >> i & 1]
        return "; ".join(waiting)

    async def host(ctx):
        for i in range(chips):
            await host_load(ctx, dut.host[i], programs[i], images[i])
        await wait_done(ctx, dut.start, dut.done, max_cycles, "the chips did not all halt",
                        describe)
        out["cycles"] = ctx.get(dut.cycles)
        out["chip_cycles"] = [ctx.get(c) for c in dut.chip_cycles]
        k = len(BUSY_COUNTERS)
        out["busy_cycles"] = [[ctx.get(dut.chip_busy_cycles[i * k + j]) for j in range(k)]
                              for i in range(chips)]
        errors = ctx.get(dut.chip_error)
        out["errors"] = [bool(errors >> i & 1) for i in range(chips)]
        out["traces"] = [await read_trace(ctx, dut.host[i]) for i in range(chips)]
        for i in range(chips):
            for base, count in reads[i]:
                out["regions"][i].append(await host_read(
                    ctx, dut.host[i], base, count, npu.word_bytes))

    processes = []
    if link_stalls > 0:
        rng = np.random.default_rng(seed)
        bits = len(dut.link_stall)

        async def staller(ctx):
            async for _ in ctx.tick():
                hit = np.flatnonzero(rng.random(bits) < link_stalls)
                ctx.set(dut.link_stall, int(sum(1 << int(k) for k in hit)))

        processes.append(staller)
    n_reads = sum(c for r in reads for _, c in r)
    stats = run_sim(dut, [host], processes=processes,
                    max_cycles=load_words + max_cycles + 10 * n_reads
                    + 2 * chips * trace_depth(npu) + 100, vcd=vcd, progress=progress)
    out.update(wall_s=stats["wall_s"], cycles_per_s=stats["cycles_per_s"])
    return out
