"""Helpers for Amaranth's built-in simulator: stream drivers, a watchdog, a cycle clock.

Every streaming testbench in the project uses these: producers call
:func:`stream_put` / :func:`send_all`, consumers :func:`stream_get` / :func:`collect`, with random
idle and backpressure from a seeded :class:`numpy.random.Generator`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext

import numpy as np
from amaranth.hdl import Module, Signal
from amaranth.sim import Simulator

__all__ = ["SimulationTimeout", "stream_put", "stream_get", "send_all", "collect", "run_sim",
           "CLOCK_PERIOD"]

#: Simulated clock period in seconds (100 MHz); only ratios of it matter.
CLOCK_PERIOD = 1e-8


class SimulationTimeout(RuntimeError):
    """The simulation did not finish within its cycle budget (the watchdog fired)."""


def _idle(rng: np.random.Generator | None, probability: float) -> bool:
    return rng is not None and probability > 0 and rng.random() < probability


async def stream_put(ctx, stream, payload, *, rng=None, idle: float = 0.0):
    """Offer ``payload`` on ``stream`` until it is accepted; maybe idle first.

    Returns after the clock edge that transferred the payload, with ``valid`` low again.
    """
    while _idle(rng, idle):
        await ctx.tick()
    ctx.set(stream.payload, payload)
    ctx.set(stream.valid, 1)
    await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def stream_get(ctx, stream, *, rng=None, stall: float = 0.0):
    """Accept one payload from ``stream``, holding ``ready`` low at random first (backpressure).

    Returns the payload as sampled at the transferring clock edge.
    """
    while _idle(rng, stall):
        await ctx.tick()
    ctx.set(stream.ready, 1)
    (payload,) = await ctx.tick().sample(stream.payload).until(stream.valid)
    ctx.set(stream.ready, 0)
    return payload


async def send_all(ctx, stream, payloads: Iterable, *, rng=None, idle: float = 0.0):
    """Send every payload in order through :func:`stream_put`."""
    for payload in payloads:
        await stream_put(ctx, stream, payload, rng=rng, idle=idle)


async def collect(ctx, stream, count: int, *, rng=None, stall: float = 0.0,
                  convert: Callable | None = None) -> list:
    """Receive ``count`` payloads; ``convert`` maps each sampled payload (e.g. to a tuple)."""
    out = []
    for _ in range(count):
        payload = await stream_get(ctx, stream, rng=rng, stall=stall)
        out.append(convert(payload) if convert else payload)
    return out


class Clock:
    """Cycle counter readable from testbenches: ``clock.cycles`` counts rising edges."""

    def __init__(self):
        self.cycles = 0

    async def process(self, ctx):
        async for _ in ctx.tick():
            self.cycles += 1


def run_sim(dut, testbenches: Iterable, *, processes: Iterable = (), max_cycles: int = 100_000,
            vcd: str | None = None, progress=None) -> dict:
    """Simulate ``dut`` until every testbench returns; raise at ``max_cycles``.

    ``testbenches`` are ``async def bench(ctx)``; ``processes`` are background models. A
    deadlock never hangs: a background watchdog raises :class:`SimulationTimeout` after
    ``max_cycles`` clock cycles. ``progress(cycles)`` is called every few thousand cycles.
    Returns ``{"cycles", "wall_s", "cycles_per_s"}``.
    """
    # A clock domain even for a combinational design (a router, a gearbox of ratio 1), so that
    # testbenches can count cycles against it.
    top = Module()
    top.submodules.dut = dut
    heartbeat = Signal()
    top.d.sync += heartbeat.eq(~heartbeat)
    sim = Simulator(top)
    sim.add_clock(CLOCK_PERIOD)
    clock = Clock()
    sim.add_process(clock.process)
    for bench in testbenches:
        sim.add_testbench(bench)
    for process in processes:
        sim.add_process(process)

    async def watchdog(ctx):
        # One timed wait, not a per-cycle loop: it costs nothing while the design runs.
        await ctx.delay(max_cycles * CLOCK_PERIOD)
        raise SimulationTimeout(f"simulation did not finish within max_cycles={max_cycles}")

    sim.add_testbench(watchdog, background=True)
    if progress is not None:
        async def report(ctx):
            async for _ in ctx.tick().repeat(4096):
                progress(clock.cycles)

        sim.add_process(report)
    start = time.perf_counter()
    with sim.write_vcd(vcd) if vcd else nullcontext():
        sim.run()
    wall = time.perf_counter() - start
    return {"cycles": clock.cycles, "wall_s": wall,
            "cycles_per_s": clock.cycles / wall if wall > 0 else 0.0}
