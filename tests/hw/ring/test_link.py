"""RingLink and SkidStage (hw.ring.link): order, no loss or duplication under stalls, latency."""

import numpy as np
import pytest

from hw.layouts import ring_word_layout
from hw.ring.link import RingLink, SkidStage
from sim.rtl.pysim import run_sim, send_all
from tests.helpers import stream_through


def _words(rng, count, word_bytes):
    lanes = word_bytes // 4
    return [{"data": [int(v) for v in rng.integers(0, 1 << 32, size=lanes)],
             "last": int(rng.integers(0, 2))} for _ in range(count)]


def _as_tuple(payload):
    return (tuple(int(v) for v in payload.data), int(payload.last))


@pytest.mark.parametrize("width_bytes, latency, word_bytes", [(4, 2, 8), (8, 1, 8), (2, 3, 8)])
def test_link_carries_each_words_tag(width_bytes, latency, word_bytes, rng):
    """With ``tag_bits`` every word keeps its routing tag through the flits."""
    dut = RingLink(width_bytes=width_bytes, latency=latency, word_bytes=word_bytes, tag_bits=8)
    words = [{**w, "tag": int(rng.integers(0, 256))} for w in _words(rng, 40, word_bytes)]
    got = stream_through(dut, words, rng=rng, idle=0.3, stall=0.3,
                         convert=lambda p: (_as_tuple(p), int(p.tag)), max_cycles=20_000)
    assert got == [((tuple(w["data"]), w["last"]), w["tag"]) for w in words]


@pytest.mark.parametrize("width_bytes, latency, word_bytes", [
    (4, 2, 8), (8, 1, 16), (1, 3, 8), (8, 2, 8), (2, 1, 8),
])
def test_link_delivers_every_word_in_order_under_stalls(width_bytes, latency, word_bytes, rng):
    dut = RingLink(width_bytes=width_bytes, latency=latency, word_bytes=word_bytes)
    words = _words(rng, 60, word_bytes)
    stall_rng = np.random.default_rng(int(rng.integers(1 << 31)))

    async def staller(ctx):
        async for _ in ctx.tick():
            ctx.set(dut.stall, int(stall_rng.integers(0, 1 << latency)) *
                    int(stall_rng.random() < 0.4))

    got = stream_through(dut, words, rng=rng, idle=0.3, stall=0.3, convert=_as_tuple,
                         processes=[staller], max_cycles=20_000)
    want = [(tuple(w["data"]), w["last"]) for w in words]
    for index, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"word {index}: got {g}, sent {w}"


@pytest.mark.parametrize("width_bytes, latency, word_bytes", [(4, 2, 8), (8, 3, 8), (2, 1, 8)])
def test_link_latency_and_throughput(width_bytes, latency, word_bytes, rng):
    """Back to back (word 0 sent in cycle 0), word k is at ``o`` from cycle ``L + k*r``."""
    ratio = word_bytes // width_bytes
    lat = latency + ratio - 1
    dut = RingLink(width_bytes=width_bytes, latency=latency, word_bytes=word_bytes)
    words = _words(rng, 12, word_bytes)
    arrivals = []

    async def producer(ctx):
        await send_all(ctx, dut.i, words)

    async def consumer(ctx):
        ctx.set(dut.o.ready, 1)
        cycle = 0
        while len(arrivals) < len(words):
            if ctx.get(dut.o.valid):
                arrivals.append(cycle)
            await ctx.tick()
            cycle += 1

    run_sim(dut, [producer, consumer], max_cycles=2_000)
    want = [lat + k * ratio for k in range(len(words))]
    assert arrivals == want, f"arrival cycles {arrivals}, expected {want}"


def test_skid_stage_holds_payload_under_backpressure(rng):
    dut = SkidStage(ring_word_layout(8))
    words = _words(rng, 40, 8)
    got = stream_through(dut, words, rng=rng, idle=0.5, stall=0.6, convert=_as_tuple,
                         max_cycles=5_000)
    assert got == [(tuple(w["data"]), w["last"]) for w in words]


@pytest.mark.parametrize("params, error, match", [
    ({"width_bytes": 3, "latency": 1}, ValueError, r"width_bytes must be a power of two, not 3"),
    ({"width_bytes": 0, "latency": 1}, ValueError, r"width_bytes must be a power of two, not 0"),
    ({"width_bytes": 4, "latency": 0}, ValueError, r"latency must be a positive integer, not 0"),
    ({"width_bytes": 4, "latency": True}, ValueError, r"latency must be a positive integer"),
    ({"width_bytes": 8, "latency": 1, "word_bytes": 4}, ValueError,
     r"word_bytes must be a multiple of 4 and of width_bytes=8, not 4"),
    ({"width_bytes": 4, "latency": 1, "word_bytes": 6}, ValueError,
     r"word_bytes must be a multiple of 4 and of width_bytes=4, not 6"),
])
def test_link_rejects_bad_parameters(params, error, match):
    with pytest.raises(error, match=match):
        RingLink(**params)
