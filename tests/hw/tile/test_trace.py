"""TraceBuffer (hw.tile.trace): one entry per change of the busy vector while running."""

import pytest

from hw.tile.trace import TraceBuffer
from sim.rtl.pysim import run_sim
from tests.helpers import seeded


def test_records_every_change_and_saturates():
    rng = seeded(8)
    dut = TraceBuffer(depth=8)
    vectors = [int(v) for v in rng.integers(0, 64, 20)]
    got = {}

    async def bench(ctx):
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        ctx.set(dut.running, 1)
        for cycle, busy in enumerate(vectors):
            ctx.set(dut.cycle, cycle)
            ctx.set(dut.busy, busy)
            await ctx.tick()
        ctx.set(dut.running, 0)
        ctx.set(dut.busy, 0)
        await ctx.tick()
        got["count"], got["overflow"] = ctx.get(dut.count), ctx.get(dut.overflow)
        got["entries"] = []
        for k in range(got["count"]):
            ctx.set(dut.rd_addr, k)
            await ctx.tick()
            value = ctx.get(dut.rd_data)
            got["entries"].append((int(value.cycle), int(value.busy)))

    run_sim(dut, [bench], max_cycles=200)
    changes, prev = [], 0
    for cycle, busy in enumerate(vectors):
        if busy != prev:
            changes.append((cycle, busy))
            prev = busy
    assert got["entries"] == changes[:8]
    assert got["count"] == 8 and got["overflow"] == (len(changes) > 8)


def test_rejects_a_tiny_depth():
    with pytest.raises(ValueError, match="depth must be an integer of at least 2, not 1"):
        TraceBuffer(depth=1)
