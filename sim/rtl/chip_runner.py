"""Run a program on the chip RTL in Amaranth's simulator: load through the host port, start,
wait for ``done`` (or the watchdog), read results back."""

from __future__ import annotations

import numpy as np

from hw.spec import NpuConfig
from hw.tile.chip import Chip

from .pysim import SimulationTimeout, run_sim

__all__ = ["run_chip_pysim", "words_to_ints", "ints_to_words"]


def words_to_ints(words: np.ndarray) -> list[int]:
    """[count, word_bytes] uint8 -> little-endian integers (byte j is bits 8j..8j+7)."""
    words = np.asarray(words, np.uint8)
    return [int.from_bytes(w.tobytes(), "little") for w in words]


def ints_to_words(values, word_bytes: int) -> np.ndarray:
    return np.array([list(int(v).to_bytes(word_bytes, "little")) for v in values],
                    np.uint8).reshape(-1, word_bytes)


def run_chip_pysim(npu: NpuConfig, program: list[int], images: dict[int, np.ndarray],
                   reads: list[tuple[int, int]], *, max_cycles: int = 1_000_000,
                   vcd: str | None = None) -> dict:
    """Load ``images`` ({base word: [count, N] uint8}) and ``program``; run; read ``reads``.

    Returns ``{"regions": [words...], "cycles", "load_cycles", "busy_cycles", "error",
    "wall_s", "cycles_per_s"}``. Raises :class:`SimulationTimeout` when the program does not
    reach ``done`` within ``max_cycles`` cycles after ``start``.
    """
    if len(program) > npu.imem_words:
        raise ValueError(f"program of {len(program)} instructions exceeds imem_words "
                         f"{npu.imem_words}")
    dut = Chip(npu=npu)
    out = {"regions": []}
    load_words = sum(len(w) for w in images.values()) + len(program)

    async def host(ctx):
        load = 0
        ctx.set(dut.host_imem.valid, 1)
        for i, word in enumerate(program):
            ctx.set(dut.host_imem.payload, {"addr": i, "data": word})
            await ctx.tick()
            load += 1
        ctx.set(dut.host_imem.valid, 0)
        ctx.set(dut.host_wr.valid, 1)
        for base, words in images.items():
            for i, value in enumerate(words_to_ints(words)):
                ctx.set(dut.host_wr.payload, {"addr": base + i, "data": value})
                await ctx.tick().until(dut.host_wr.ready)
                load += 1
        ctx.set(dut.host_wr.valid, 0)
        out["load_cycles"] = load
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        ran = 0
        while not ctx.get(dut.done):
            await ctx.tick()
            ran += 1
            if ran > max_cycles:
                raise SimulationTimeout(f"chip did not halt within max_cycles={max_cycles}")
        out["cycles"] = ctx.get(dut.cycles)
        out["busy_cycles"] = [ctx.get(c) for c in dut.busy_cycles]
        out["error"] = bool(ctx.get(dut.error))
        ctx.set(dut.host_rd_data.ready, 1)
        for base, count in reads:
            values = []
            for i in range(count):
                ctx.set(dut.host_rd_addr.payload, {"addr": base + i, "last": 0})
                ctx.set(dut.host_rd_addr.valid, 1)
                await ctx.tick().until(dut.host_rd_addr.ready)
                ctx.set(dut.host_rd_addr.valid, 0)
                (value,) = await ctx.tick().sample(dut.host_rd_data.payload.data).until(
                    dut.host_rd_data.valid)
                values.append(int(value))
            out["regions"].append(ints_to_words(values, npu.word_bytes))

    stats = run_sim(dut, [host], max_cycles=load_words + max_cycles + 10 * sum(
        c for _, c in reads) + 100, vcd=vcd)
    out.update(wall_s=stats["wall_s"], cycles_per_s=stats["cycles_per_s"])
    return out
