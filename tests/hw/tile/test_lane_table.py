"""LaneTable (hw.tile.lane_table): banked per-lane copies behave as one memory with a write and
a combinational read port per lane."""

import pytest
from amaranth.hdl import signed

from hw.tile.lane_table import LaneTable
from sim.rtl.pysim import run_sim
from tests.helpers import seeded


@pytest.mark.parametrize("sync", [False, True])
@pytest.mark.parametrize("lanes, offset", [(4, 0), (4, -1), (2, 1), (3, 0)])
def test_reads_what_beats_wrote(lanes, offset, sync):
    """Random beats of writes, then reads of random entries by every lane; ``sync``: the
    read's data is there the cycle after, and holds while ``r_en`` is low."""
    rng = seeded(lanes * 10 + offset)
    depth = 12 if lanes == 3 else 16
    init = [int(v) for v in rng.integers(-128, 128, depth)]
    table = LaneTable(shape=signed(8), depth=depth, lanes=lanes, init=init, offset=offset,
                      sync=sync)
    assert table.banked == (lanes != 3)
    model = list(init)
    checked = []

    async def bench(ctx):
        for base in range(0, depth, lanes):
            # A beat writes entries base + j + offset (some lanes off), as a load does.
            for j in range(lanes):
                addr = (base + j + offset) % depth
                en = int(rng.random() < 0.7)
                value = int(rng.integers(-128, 128))
                ctx.set(table.w_addr[j], addr)
                ctx.set(table.w_data[j], value)
                ctx.set(table.w_en[j], en)
                if en:
                    model[addr] = value
            await ctx.tick()
            for j in range(lanes):
                ctx.set(table.w_en[j], 0)
            for _ in range(3):
                addrs = [int(a) for a in rng.integers(0, depth, lanes)]
                for j, a in enumerate(addrs):
                    ctx.set(table.r_addr[j], a)
                if sync:
                    ctx.set(table.r_en, 1)
                    await ctx.tick()
                    ctx.set(table.r_en, 0)
                    for j in range(lanes):         # another address, not read: data holds
                        ctx.set(table.r_addr[j], (addrs[j] + 1) % depth)
                    await ctx.tick()
                got = [ctx.get(table.r_data[j]) for j in range(lanes)]
                assert got == [model[a] for a in addrs], (base, addrs)
                checked.append(addrs)

    run_sim(table, [bench], max_cycles=1000)
    assert len(checked) == 3 * (depth // lanes)


def test_rejections():
    with pytest.raises(ValueError, match=r"lanes must be a positive integer, not 0"):
        LaneTable(shape=8, depth=16, lanes=0)
    with pytest.raises(ValueError, match=r"init has 3 values, not depth=16"):
        LaneTable(shape=8, depth=16, lanes=4, init=[1, 2, 3])
