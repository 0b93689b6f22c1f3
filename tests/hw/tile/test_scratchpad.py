"""AddrGen and Scratchpad (hw.tile.scratchpad) vs the golden address walk and a dict memory."""

import numpy as np
import pytest

from hw.tile.scratchpad import AddrGen, Scratchpad
from sim.golden.scratchpad import addr_sequence
from sim.rtl.pysim import collect, run_sim, send_all, stream_get, stream_put
from tests.helpers import seeded


def random_desc(rng, addr_bits, max_total=60):
    while True:
        n = [int(x) for x in rng.integers(0, 5, 4)]
        if np.prod([max(1, x) for x in n]) <= max_total:
            break
    s = [int(x) for x in rng.integers(-(1 << (addr_bits - 1)), 1 << (addr_bits - 1), 4)]
    return {"base": int(rng.integers(0, 1 << addr_bits)), "n": n, "s": s}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_addrgen_matches_golden(seed):
    rng = seeded(seed)
    addr_bits = 10
    dut = AddrGen(addr_bits=addr_bits)
    descs = [random_desc(rng, addr_bits) for _ in range(6)]
    descs.append({"base": 5, "n": [1, 1, 1, 1], "s": [0, 0, 0, 0]})  # a single address
    want = [addr_sequence(d["base"], d["n"], d["s"], addr_bits) for d in descs]
    got = []

    async def producer(ctx):
        await send_all(ctx, dut.i, descs, rng=rng, idle=0.3)

    async def consumer(ctx):
        for w in want:
            seq = await collect(ctx, dut.o, len(w), rng=rng, stall=0.3,
                                convert=lambda p: (int(p.addr), int(p.last)))
            got.append(seq)

    run_sim(dut, [producer, consumer], max_cycles=5000)
    for d, (w, g) in enumerate(zip(want, got, strict=True)):
        addrs = [a for a, _ in g]
        lasts = [last for _, last in g]
        bad = [i for i in range(len(w)) if addrs[i] != w[i]]
        assert not bad, f"descriptor {d}: address {bad[0]} is {addrs[bad[0]]}, want {w[bad[0]]}"
        assert lasts == [0] * (len(w) - 1) + [1], f"descriptor {d}: last flags {lasts}"


def random_wrap_desc(rng, addr_bits, wrap, ascending=False):
    """A rotated walk of a circular buffer of ``wrap`` words: blocks descending from ``off``
    (offsets below 0 fold up), or with ``ascending`` blocks ascending (offsets from ``wrap`` up
    fold down)."""
    blocks = int(rng.integers(1, 5))
    w = wrap // blocks
    wrap = w * blocks
    start = int(rng.integers(0, blocks))
    return {"base": int(rng.integers(0, (1 << addr_bits) - wrap)), "n": [w, blocks, 1, 1],
            "s": [1, w if ascending else -w, 0, 0], "wrap": wrap, "off": start * w}


@pytest.mark.parametrize("seed", [4, 5])
def test_wrapping_addrgen_matches_golden(seed):
    """RD6/WR3's generators: a circular buffer walked from an offset, and plain walks (wrap 0)
    exactly as the other generators."""
    rng = seeded(seed)
    addr_bits = 9
    dut = AddrGen(addr_bits=addr_bits, wrap=True)
    descs = [random_wrap_desc(rng, addr_bits, int(rng.integers(4, 40)), ascending=k % 2 == 1)
             for k in range(8)]
    descs += [{**random_desc(rng, addr_bits), "wrap": 0, "off": 0} for _ in range(3)]
    want = [addr_sequence(d["base"], d["n"], d["s"], addr_bits, d["wrap"], d["off"])
            for d in descs]
    got = []

    async def producer(ctx):
        await send_all(ctx, dut.i, descs, rng=rng, idle=0.3)

    async def consumer(ctx):
        for w in want:
            got.append(await collect(ctx, dut.o, len(w), rng=rng, stall=0.3,
                                     convert=lambda p: int(p.addr)))

    run_sim(dut, [producer, consumer], max_cycles=5000)
    for d, (w, g) in enumerate(zip(want, got, strict=True)):
        assert g == list(w), f"descriptor {d} {descs[d]}: {g} != {list(w)}"
    # The golden walk itself: blocks 2, 1, 0 of 3 x 2 words from block 2.
    assert list(addr_sequence(10, [2, 3, 1, 1], [1, -2, 0, 0], 9, 6, 4)) == \
        [14, 15, 12, 13, 10, 11]
    # Ascending from block 1: offsets 2..5, then 6 and 7 fold to 0 and 1.
    assert list(addr_sequence(10, [2, 3, 1, 1], [1, 2, 0, 0], 9, 6, 2)) == \
        [12, 13, 14, 15, 10, 11]


def test_addrgen_one_address_per_cycle():
    dut = AddrGen(addr_bits=8)
    desc = {"base": 0, "n": [3, 2, 2, 1], "s": [1, 8, 64, 0]}
    cycles = {}

    async def bench(ctx):
        await stream_put(ctx, dut.i, desc)
        ctx.set(dut.o.ready, 1)
        count = 0
        start = None
        async for _clk, _rst, valid, last in ctx.tick().sample(dut.o.valid, dut.o.payload.last):
            if valid:
                start = count if start is None else start
                if last:
                    cycles["span"] = count - start + 1
                    return
            count += 1

    run_sim(dut, [bench], max_cycles=200)
    assert cycles["span"] == 12


def test_rejects_bad_parameters():
    with pytest.raises(ValueError, match=r"addr_bits must be an integer of at least 1, not 0"):
        AddrGen(addr_bits=0)
    with pytest.raises(ValueError, match=r"words=100 is not a multiple of banks=3"):
        Scratchpad(words=100, banks=3, word_bytes=4, read_ports=1, write_ports=1)
    with pytest.raises(ValueError, match=r"bank depth words/banks = 24 must be a power of two"):
        Scratchpad(words=48, banks=2, word_bytes=4, read_ports=1, write_ports=1)
    with pytest.raises(ValueError, match=r"read_ports must be an integer of at least 1"):
        Scratchpad(words=64, banks=2, word_bytes=4, read_ports=0, write_ports=1)


def test_scratchpad_ports_contend_and_return_in_order():
    """Three write ports fill the memory (often the same bank), each word with random byte
    write enables (the memory starts at zeros: the disabled bytes stay 0), then five read
    ports read it back concurrently with backpressure: every byte and every order must be
    right (a bank's multiplexers pick the port its arbitration grants)."""
    rng = seeded(5)
    words, banks = 64, 4
    dut = Scratchpad(words=words, banks=banks, word_bytes=4, read_ports=5, write_ports=3)
    written_words = {int(a): int(rng.integers(0, 1 << 32)) for a in range(words)}
    masks = {a: int(rng.integers(0, 16)) if a % 3 else 15 for a in range(words)}
    contents = {a: sum(w & (0xFF << 8 * i) for i in range(4) if masks[a] >> i & 1)
                for a, w in written_words.items()}
    thirds = [list(range(k, words, 3)) for k in range(3)]
    reads = [rng.integers(0, words, 40) for _ in range(5)]
    written = [False]
    got = [[] for _ in range(5)]

    def writer(k):
        async def bench(ctx):
            addrs = thirds[k]
            await send_all(ctx, dut.wr[k].i, [
                {"addr": a, "data": written_words[a], "mask": masks[a],
                 "last": int(i == len(addrs) - 1)}
                for i, a in enumerate(addrs)], rng=rng, idle=0.2)
            written[0] += 1
        return bench

    def reader(k):
        async def request(ctx):
            while written[0] < 3:
                await ctx.tick()
            await send_all(ctx, dut.rd[k].i_addr,
                           [{"addr": int(a), "last": int(i == len(reads[k]) - 1)}
                            for i, a in enumerate(reads[k])], rng=rng, idle=0.2)

        async def receive(ctx):
            for _ in reads[k]:
                p = await stream_get(ctx, dut.rd[k].o_data, rng=rng, stall=0.3)
                got[k].append((int(p.data), int(p.last)))
        return [request, receive]

    benches = [writer(k) for k in range(3)] + sum((reader(k) for k in range(5)), [])
    run_sim(dut, benches, max_cycles=5000)
    for k in range(5):
        for i, (a, (word, last)) in enumerate(zip(reads[k], got[k], strict=True)):
            assert word == contents[int(a)], (
                f"read port {k}, read {i} of address {a}: {word:#x} != {contents[int(a)]:#x}")
            assert last == int(i == len(reads[k]) - 1), f"read port {k}, read {i}: last={last}"


def test_scratchpad_streams_one_word_per_cycle():
    dut = Scratchpad(words=32, banks=2, word_bytes=4, read_ports=1, write_ports=1)
    span = {}

    async def bench(ctx):
        ctx.set(dut.rd[0].o_data.ready, 1)
        ctx.set(dut.rd[0].i_addr.valid, 1)
        first = last = None
        for cycle in range(100):
            a = min(cycle, 15)
            ctx.set(dut.rd[0].i_addr.payload, {"addr": a, "last": int(a == 15)})
            if cycle == 16:
                ctx.set(dut.rd[0].i_addr.valid, 0)
            _, _, valid = await ctx.tick().sample(dut.rd[0].o_data.valid)
            if valid:
                first = cycle if first is None else first
                last = cycle
        span["n"] = last - first + 1

    run_sim(dut, [bench], max_cycles=500)
    assert span["n"] == 16
