"""Router (hw.ring.router): deliver by destination and channel, forward the rest, CTS tokens."""

import pytest

from hw.ring.router import Router
from hw.spec.ring import CHAN_COLL, CHAN_CTS, CHAN_P2P
from sim.rtl.pysim import collect, run_sim, send_all
from tests.helpers import seeded

ME = 2
CHIP_BITS = 3


def tag(dest, src, chan):
    return dest | src << CHIP_BITS | chan << (2 * CHIP_BITS)


def word(k, dest, src, chan, last=0):
    return {"data": [k, k ^ 0x5A5A], "last": last, "tag": tag(dest, src, chan)}


def as_tuple(p):
    return (int(p.data[0]), int(p.last))


@pytest.mark.parametrize("seed", [1, 2])
def test_delivers_forwards_and_filters(seed):
    """Words from the link: those for this chip reach the collective engine, the receive unit
    (only from the source it waits for, so a word from another source waits) or the send
    unit's clear-to-send store (a token waits while the store is not ready); the others go on
    to the next chip in order. Local words reach the link too."""
    rng = seeded(seed)
    dut = Router(word_bytes=8, chip_bits=CHIP_BITS)
    stream = []
    for k in range(40):
        kind = int(rng.integers(0, 4))
        if kind == 0:
            stream.append(word(k, ME, 1, CHAN_COLL))
        elif kind == 1:
            stream.append(word(k, ME, 3, CHAN_P2P, last=int(rng.integers(0, 2))))
        elif kind == 2:
            stream.append(word(k, ME, int(rng.integers(0, 8)), CHAN_CTS, last=1))
        else:
            stream.append(word(k, int(rng.choice([0, 1, 3, 4])), 1, CHAN_COLL))
    local = [word(100 + k, 5, ME, CHAN_COLL) for k in range(5)]
    want_coll = [(w["data"][0], w["last"]) for w in stream if w["tag"] == tag(ME, 1, CHAN_COLL)]
    want_p2p = [(w["data"][0], w["last"]) for w in stream if w["tag"] == tag(ME, 3, CHAN_P2P)]
    want_fwd = [w["data"][0] for w in stream if w["tag"] & 7 != ME]
    want_cts = [(w["tag"] >> CHIP_BITS) & 7 for w in stream if (w["tag"] >> 2 * CHIP_BITS) == 2]
    got = {}

    async def link_in(ctx):
        await send_all(ctx, dut.i_link, stream, rng=rng, idle=0.2)

    async def coll_in(ctx):
        await send_all(ctx, dut.i_coll, local, rng=rng, idle=0.5)

    async def coll_out(ctx):
        got["coll"] = await collect(ctx, dut.o_coll, len(want_coll), rng=rng, stall=0.3,
                                    convert=as_tuple)

    async def p2p_out(ctx):
        ctx.set(dut.p2p_src, 3)
        ctx.set(dut.p2p_open, 1)
        got["p2p"] = await collect(ctx, dut.o_p2p, len(want_p2p), rng=rng, stall=0.3,
                                   convert=as_tuple)

    async def link_out(ctx):
        got["link"] = await collect(ctx, dut.o_link, len(want_fwd) + len(local), rng=rng,
                                    stall=0.3, convert=lambda p: int(p.data[0]))

    async def tokens(ctx):
        got["cts"] = await collect(ctx, dut.o_cts, len(want_cts), rng=rng, stall=0.3,
                                   convert=lambda p: int(p.src))

    ctx_id = []

    async def setup(ctx):
        ctx.set(dut.chip_id, ME)
        ctx_id.append(1)

    run_sim(dut, [setup, link_in, coll_in, coll_out, p2p_out, link_out, tokens],
            max_cycles=3000)
    assert got["coll"] == want_coll
    assert got["p2p"] == want_p2p
    assert [w for w in got["link"] if w < 100] == want_fwd, "forwarded words out of order"
    assert [w for w in got["link"] if w >= 100] == [100 + k for k in range(5)]
    assert got["cts"] == want_cts


def test_a_message_from_another_source_waits():
    """The receive unit waits for chip 3; a message word from chip 4 is held at the router."""
    dut = Router(word_bytes=8, chip_bits=CHIP_BITS)
    got = {}

    async def bench(ctx):
        ctx.set(dut.chip_id, ME)
        ctx.set(dut.p2p_src, 3)
        ctx.set(dut.p2p_open, 1)
        ctx.set(dut.o_p2p.ready, 1)
        ctx.set(dut.i_link.payload, word(7, ME, 4, CHAN_P2P))
        ctx.set(dut.i_link.valid, 1)
        await ctx.tick().repeat(5)
        got["held"] = (ctx.get(dut.i_link.ready), ctx.get(dut.o_p2p.valid))
        ctx.set(dut.p2p_src, 4)
        await ctx.delay(1e-9)
        got["taken"] = (ctx.get(dut.i_link.ready), ctx.get(dut.o_p2p.valid))

    run_sim(dut, [bench], max_cycles=50)
    assert got["held"] == (0, 0) and got["taken"] == (1, 1)


def test_a_torus_router_routes_the_column_first():
    """Chip 5 of a 4 x 4 torus (row 4..7), Router(dims=2, engines=2): words from the column for
    its row turn into the row, others go on along the column, words along the row stay on it
    (ahead of turning ones), engine 1's words are delivered on their own channel, and local
    words leave by the dimension their destination needs."""
    from hw.spec.ring import CHAN_COLL1

    rng = seeded(5)
    dut = Router(word_bytes=8, chip_bits=4, dims=2, engines=2)

    def tag4(dest, src, chan):
        return dest | src << 4 | chan << 8

    def w(k, dest, src, chan, last=0):
        return {"data": [k, k], "last": last, "tag": tag4(dest, src, chan)}

    from_row = [w(k, int(rng.choice([5, 6, 7])), 4, CHAN_COLL) for k in range(20)]
    from_col = [w(100 + k, int(rng.choice([5, 6, 13, 9])), 1,
                  int(rng.choice([CHAN_COLL, CHAN_COLL1]))) for k in range(20)]
    local0 = [w(200 + k, 6, 5, CHAN_COLL) for k in range(4)]          # along the row
    local1 = [w(300 + k, 9, 5, CHAN_COLL1) for k in range(4)]         # along the column
    words = from_row + from_col
    want = {
        "coll0": [x["data"][0] for x in words if x["tag"] & 0xF == 5 and x["tag"] >> 8 == 0],
        "coll1": [x["data"][0] for x in words if x["tag"] & 0xF == 5 and x["tag"] >> 8 == 3],
        "x": sorted([x["data"][0] for x in words if x["tag"] & 0xF in (6, 7)] +
                    [x["data"][0] for x in local0]),
        "y": sorted([x["data"][0] for x in words if x["tag"] & 0xF in (9, 13)] +
                    [x["data"][0] for x in local1]),
    }
    got = {}

    async def setup(ctx):
        ctx.set(dut.chip_id, 5)
        ctx.set(dut.row_first, 4)
        ctx.set(dut.row_last, 7)

    def sender(port, stream):
        async def run(ctx):
            await send_all(ctx, port, stream, rng=rng, idle=0.3)
        return run

    def receiver(name, port, count):
        async def run(ctx):
            got[name] = await collect(ctx, port, count, rng=rng, stall=0.3,
                                      convert=lambda p: int(p.data[0]))
        return run

    run_sim(dut, [setup, sender(dut.i_link, from_row), sender(dut.i_link_y, from_col),
                  sender(dut.i_coll, local0), sender(dut.i_coll1, local1),
                  receiver("coll0", dut.o_coll, len(want["coll0"])),
                  receiver("coll1", dut.o_coll1, len(want["coll1"])),
                  receiver("x", dut.o_link, len(want["x"])),
                  receiver("y", dut.o_link_y, len(want["y"]))], max_cycles=3000)
    for name in ("coll0", "coll1", "x", "y"):
        assert sorted(got[name]) == sorted(want[name]), name
        # The words of each source (link or engine) keep their order.
        for src in (from_row, from_col, local0, local1):
            mine = [v for v in got[name] if v in {x["data"][0] for x in src}]
            assert mine == sorted(mine), f"{name}: {mine}"


@pytest.mark.parametrize("kw, match", [
    ({"chip_bits": 0}, "chip_bits must be an integer 1..16"),
    ({"chip_bits": 4, "dims": 3}, "dims must be one of 1, 2, not 3"),
    ({"chip_bits": 4, "engines": 0}, "engines must be one of 1, 2, not 0"),
])
def test_bad_router_parameters(kw, match):
    with pytest.raises(ValueError, match=match):
        Router(word_bytes=8, **kw)
