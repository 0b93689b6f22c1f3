"""Run a program on one chip's RTL: load through the host port, start, wait for ``done`` (or
the watchdog), read results back; in Amaranth's simulator (:func:`run_chip_pysim`) or as
exported Verilog under cocotb + Verilator (:func:`run_chip_verilator`)."""

from __future__ import annotations

import numpy as np
from amaranth.back import verilog

from hw.chip import Chip
from hw.spec import NpuConfig
from hw.spec.isa import UNIT_NAMES
from hw.tile.ports import trace_depth

from .cocotb_tb import run_cocotb
from .pysim import SimulationTimeout, run_sim

__all__ = ["run_chip_pysim", "run_chip_verilator", "words_to_ints", "ints_to_words", "host_load",
           "host_read", "wait_done", "read_trace", "busy_units"]


def words_to_ints(words: np.ndarray) -> list[int]:
    """[count, word_bytes] uint8 -> little-endian integers (byte j is bits 8j..8j+7)."""
    words = np.asarray(words, np.uint8)
    return [int.from_bytes(w.tobytes(), "little") for w in words]


def ints_to_words(values, word_bytes: int) -> np.ndarray:
    return np.array([list(int(v).to_bytes(word_bytes, "little")) for v in values],
                    np.uint8).reshape(-1, word_bytes)


async def host_load(ctx, host, program: list[int], images: dict[int, np.ndarray]) -> int:
    """Write ``program`` through a chip's ``host.imem`` and ``images`` through ``host.wr``
    (:class:`hw.tile.ports.HostSignature`); returns the cycles it took (one word per cycle)."""
    imem, wr = host.imem, host.wr
    load = 0
    ctx.set(imem.valid, 1)
    for i, word in enumerate(program):
        ctx.set(imem.payload, {"addr": i, "data": word})
        await ctx.tick()
        load += 1
    ctx.set(imem.valid, 0)
    ctx.set(wr.valid, 1)
    for base, words in images.items():
        for i, value in enumerate(words_to_ints(words)):
            ctx.set(wr.payload, {"addr": base + i, "data": value})
            await ctx.tick().until(wr.ready)
            load += 1
    ctx.set(wr.valid, 0)
    return load


async def host_read(ctx, host, base: int, count: int, word_bytes: int):
    """Read ``count`` words from ``base`` through a chip's host read port."""
    rd_addr, rd_data = host.rd_addr, host.rd_data
    ctx.set(rd_data.ready, 1)
    values = []
    for i in range(count):
        ctx.set(rd_addr.payload, {"addr": base + i, "last": 0})
        ctx.set(rd_addr.valid, 1)
        await ctx.tick().until(rd_addr.ready)
        ctx.set(rd_addr.valid, 0)
        (value,) = await ctx.tick().sample(rd_data.payload.data).until(rd_data.valid)
        values.append(int(value))
    ctx.set(rd_data.ready, 0)
    return ints_to_words(values, word_bytes)


async def wait_done(ctx, start, done, max_cycles: int, what: str, describe=None):
    """Pulse ``start``, then wait for ``done``; raise :class:`SimulationTimeout` after
    ``max_cycles``, with ``describe(ctx)`` (what each chip was doing) in the message. (A plain
    loop rather than ``until()``: an ``until()`` still pending when the watchdog fires would
    raise again when garbage-collected.)"""
    ctx.set(start, 1)
    await ctx.tick()
    ctx.set(start, 0)
    ran = 0
    while not ctx.get(done):
        await ctx.tick()
        ran += 1
        if ran > max_cycles:
            state = f": {describe(ctx)}" if describe else ""
            raise SimulationTimeout(f"{what} within max_cycles={max_cycles}{state}")


def busy_units(bits: int) -> str:
    """The units of a busy vector, by name (``hw.spec.isa.Unit`` bits)."""
    names = [name for u, name in enumerate(UNIT_NAMES) if bits >> u & 1]
    return ", ".join(names) if names else "nothing"


async def read_trace(ctx, host) -> dict:
    """The trace buffer's entries (``hw.tile.trace``): ``{"entries": [(cycle, busy)],
    "overflow"}``."""
    count = ctx.get(host.trace_count)
    entries = []
    for k in range(count):
        ctx.set(host.trace_addr, k)
        await ctx.tick()
        value = ctx.get(host.trace_data)
        entries.append((int(value.cycle), int(value.busy)))
    return {"entries": entries, "overflow": bool(ctx.get(host.trace_overflow))}


def run_chip_pysim(npu: NpuConfig, program: list[int], images: dict[int, np.ndarray],
                   reads: list[tuple[int, int]], *, max_cycles: int = 1_000_000,
                   vcd: str | None = None, progress=None) -> dict:
    """Load ``images`` ({base word: [count, N] uint8}) and ``program``; run; read ``reads``.

    Returns ``{"regions": [words...], "cycles", "load_cycles", "busy_cycles" (per
    ``hw.spec.isa.BUSY_COUNTERS``), "trace", "error", "wall_s", "cycles_per_s"}``. Raises
    :class:`SimulationTimeout` when the program does not reach ``done`` within ``max_cycles``
    cycles after ``start``.
    """
    if len(program) > npu.imem_words:
        raise ValueError(f"program of {len(program)} instructions exceeds imem_words "
                         f"{npu.imem_words}")
    dut = Chip(npu=npu)
    out = {"regions": []}
    load_words = sum(len(w) for w in images.values()) + len(program)

    async def host(ctx):
        out["load_cycles"] = await host_load(ctx, dut.host, program, images)
        await wait_done(ctx, dut.start, dut.done, max_cycles, "chip did not halt",
                        lambda ctx: f"pc {ctx.get(dut.pc)}, busy: "
                                    f"{busy_units(ctx.get(dut.busy))}")
        out["cycles"] = ctx.get(dut.cycles)
        out["busy_cycles"] = [ctx.get(c) for c in dut.busy_cycles]
        out["error"] = bool(ctx.get(dut.error))
        out["trace"] = await read_trace(ctx, dut.host)
        for base, count in reads:
            out["regions"].append(await host_read(ctx, dut.host, base, count,
                                                  npu.word_bytes))

    stats = run_sim(dut, [host], max_cycles=load_words + max_cycles + 10 * sum(
        c for _, c in reads) + 2 * trace_depth(npu) + 100, vcd=vcd, progress=progress)
    out.update(wall_s=stats["wall_s"], cycles_per_s=stats["cycles_per_s"])
    return out


def run_chip_verilator(npu: NpuConfig, program: list[int], images: dict[int, np.ndarray],
                       reads: list[tuple[int, int]], *, max_cycles: int = 1_000_000) -> dict:
    """Same contract as :func:`sim.rtl.chip_runner.run_chip_pysim`, plus ``timeout``."""
    chip = Chip(npu=npu)
    text = verilog.convert(chip, name="npu_chip")
    bases = sorted(images)
    data = {
        "program": np.array(program, np.uint64),
        "image_bases": np.array(bases, np.int64),
        "image_sizes": np.array([len(images[b]) for b in bases], np.int64),
        "image_words": (np.concatenate([images[b] for b in bases]) if bases
                        else np.zeros((0, npu.word_bytes), np.uint8)),
        "reads": np.array(reads, np.int64).reshape(-1, 2),
        "word_bytes": npu.word_bytes,
        "imem_addr_bits": npu.imem_addr_bits,
        "addr_bits": npu.sram_addr_bits,
        "max_cycles": max_cycles,
    }
    out = run_cocotb(text, top="npu_chip", test_module="tb_chip", data=data,
                     timeout=3600.0)
    if "trace" in out:      # JSON lists back to the (cycle, busy) pairs pysim gives
        out["trace"]["entries"] = [tuple(e) for e in out["trace"]["entries"]]
    out["regions"] = [np.array(r, np.uint8).reshape(-1, npu.word_bytes) for r in out["regions"]]
    return out
