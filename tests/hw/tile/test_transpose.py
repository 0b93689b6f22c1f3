"""Transposer (hw.tile.transpose): blocks in by rows, out by columns, one word per cycle."""

import pytest

from hw.tile.transpose import Transposer
from sim.rtl.pysim import run_sim
from tests.helpers import seeded, stream_through


@pytest.mark.parametrize("size, seed", [(4, 1), (3, 2), (8, 3)])
def test_transposes_blocks_with_backpressure(size, seed):
    rng = seeded(seed)
    blocks = rng.integers(-128, 128, (5, size, size))
    dut = Transposer(size=size)
    words = [{"data": [int(x) for x in blocks[b, r]],
              "last": int(b == 4 and r == size - 1)}
             for b in range(5) for r in range(size)]
    out = stream_through(dut, words, rng=rng, idle=0.3, stall=0.3, count=5 * size,
                         convert=lambda p: ([int(x) for x in p.data], int(p.last)),
                         max_cycles=2000)
    for b in range(5):
        for c in range(size):
            beat, last = out[b * size + c]
            want = [int(x) for x in blocks[b, :, c]]
            assert beat == want, f"block {b}, column {c}: {beat} != {want}"
            assert last == int(b == 4 and c == size - 1), f"block {b}, column {c}: last={last}"


def test_streams_one_word_per_cycle():
    size = 4
    dut = Transposer(size=size)
    marks = {}

    async def bench(ctx):
        ctx.set(dut.o.ready, 1)
        ctx.set(dut.i.valid, 1)
        outs = 0
        for cycle in range(40):
            ctx.set(dut.i.payload, {"data": [cycle % 100] * size, "last": 0})
            _, _, ovalid = await ctx.tick().sample(dut.o.valid)
            if ovalid:
                marks.setdefault("first", cycle)
                outs += 1
        marks["outs"] = outs

    run_sim(dut, [bench], max_cycles=100)
    assert marks["first"] == size          # latency: block of `size` words, then out
    assert marks["outs"] == 40 - size      # then one beat per cycle


def test_rejects_bad_size():
    with pytest.raises(ValueError, match="Transposer size must be an integer of at least 2"):
        Transposer(size=1)
