"""The ring side's cycle models (sim.timing.ring): links and routers."""

import pytest

from hw.spec.collective import word_bytes
from hw.spec.ring import CHAN_COLL, CHAN_CTS, CHAN_P2P
from hw.spec.timing.collective import hop_latency
from sim.timing.ring import LinkModel, route


def _stream(link, words, stall=lambda t: False):
    """Offer ``words`` back to back; take the far end's words except when ``stall(t)``.
    Returns (cycles each word was taken in, (cycle, word) as each left)."""
    sent, got, t = [], [], 0
    while len(got) < len(words):
        offer = words[len(sent)] if len(sent) < len(words) and link.in_ready() else None
        out = link.out_word()
        take = out is not None and not stall(t)
        if take:
            got.append((t, out))
        link.step(offer, take)
        if offer is not None:
            sent.append(t)
        t += 1
    return sent, got


@pytest.mark.parametrize("link_bytes, latency", [(4, 2), (8, 4), (2, 3), (1, 1)])
def test_link_latency_and_rate(link_bytes, latency):
    """A word taken in cycle t is offered from t + latency + ratio - 1 (``ratio`` = D/B
    flits), and words leave one per ``ratio`` cycles; backpressure loses nothing."""
    ratio = word_bytes(link_bytes) // link_bytes
    words = [(1, 0, CHAN_COLL, k == 5) for k in range(6)]
    sent, got = _stream(LinkModel(ratio=ratio, latency=latency), words)
    assert [w for _, w in got] == words
    assert got[0][0] - sent[0] == latency + ratio - 1 == hop_latency(link_bytes, latency)
    assert all(b[0] - a[0] == ratio for a, b in zip(got, got[1:], strict=False))
    _, got = _stream(LinkModel(ratio=ratio, latency=latency), words, lambda t: t % 3 == 1)
    assert [w for _, w in got] == words


def test_router_priorities_and_delivery():
    never = lambda valid: True  # noqa: E731 -- the collective engine always ready here
    coll = (1, 0, CHAN_COLL, False)
    msg = (2, 0, CHAN_P2P, False)
    # A word for another chip is forwarded ahead of this chip's own traffic.
    fwd = (3, 1, CHAN_COLL, False)
    tx, taken, to_coll, to_p2p, cts, took = route(0, fwd, True, True, (1, 0, CHAN_CTS, True),
                                                  coll, msg, never, False, 0, True)
    assert tx == fwd and taken and took is None
    # Then clear-to-send tokens, collective words, message words.
    assert route(0, None, True, True, (1, 0, CHAN_CTS, True), coll, msg, never, False, 0,
                 True)[5] == "cts"
    assert route(0, None, True, False, None, coll, msg, never, False, 0, True)[5] == "coll"
    assert route(0, None, True, False, None, None, msg, never, False, 0, True)[5] == "p2p"
    # Nothing leaves when the link is full.
    assert route(0, None, False, False, None, coll, None, never, False, 0, True)[0] is None
    # A message word for this chip waits unless its receive unit is open for that source.
    word = (0, 2, CHAN_P2P, True)
    assert not route(0, word, True, False, None, None, None, never, False, 2, True)[1]
    out = route(0, word, True, False, None, None, None, never, True, 2, True)
    assert out[1] and out[3]
    # A token is always taken and names its sender.
    assert route(0, (0, 5, CHAN_CTS, True), True, False, None, None, None, never, False, 0,
                 True)[4] == 5
