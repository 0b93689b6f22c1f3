"""The ring side's cycle models (sim.timing.ring): links and routers."""

import pytest

from hw.spec.collective import word_bytes
from hw.spec.ring import CHAN_COLL, CHAN_COLL1, CHAN_CTS, CHAN_P2P
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


def _route(rx, ready, cts, coll, msg, *, chip=0, row=None, p2p_open=False, p2p_src=0,
           cts_room=True, coll1=None):
    """One cycle of a ring's router (one link) or, with ``row``, a torus's (``rx`` and
    ``ready`` per link)."""
    rxs = rx if isinstance(rx, list) else [rx]
    readies = ready if isinstance(ready, list) else [ready]
    colls = [coll] + ([coll1] if row is not None else [])
    return route(chip, row, rxs, readies, cts, colls, msg, [lambda valid: True] * len(colls),
                 p2p_open, p2p_src, True, lambda src: cts_room)


def test_router_priorities_and_delivery():
    coll = (1, 0, CHAN_COLL, False)
    msg = (2, 0, CHAN_P2P, False)
    cts = (1, 0, CHAN_CTS, True)
    # A word for another chip is forwarded ahead of this chip's own traffic.
    fwd = (3, 1, CHAN_COLL, False)
    txs, taken, _, _, _, took = _route(fwd, True, cts, coll, msg)
    assert txs == [fwd] and taken == [True] and not took
    # Then clear-to-send tokens, collective words, message words.
    assert _route(None, True, cts, coll, msg)[5] == {"cts"}
    assert _route(None, True, None, coll, msg)[5] == {"coll0"}
    assert _route(None, True, None, None, msg)[5] == {"p2p"}
    # Nothing leaves when the link is full.
    assert _route(None, False, None, coll, None)[0] == [None]
    # A message word for this chip waits unless its receive unit is open for that source.
    word = (0, 2, CHAN_P2P, True)
    assert _route(word, True, None, None, None, p2p_src=2)[1] == [False]
    out = _route(word, True, None, None, None, p2p_open=True, p2p_src=2)
    assert out[1] == [True] and out[3] == word
    # A token is taken when the store has room (or holds one from its sender), naming it.
    token = (0, 5, CHAN_CTS, True)
    assert _route(token, True, None, None, None)[4] == 5
    assert _route(token, True, None, None, None, cts_room=False)[1] == [False]


def test_torus_router_goes_along_the_column_first():
    """Chip 5 of a 4 x 4 torus (row 4..7): a word from its column for chip 6 turns into the
    row, one for chip 13 goes on along the column; its own words leave by the dimension their
    destination needs; forwarded words keep priority on each link."""
    row = (4, 7)
    turn = (6, 1, CHAN_COLL, False)
    txs, taken, *_ = _route([None, turn], [True, True], None, None, None, chip=5, row=row)
    assert txs == [turn, None] and taken == [False, True]
    down = (13, 1, CHAN_COLL, False)
    txs, taken, *_ = _route([None, down], [True, True], None, None, None, chip=5, row=row)
    assert txs == [None, down] and taken == [False, True]
    # Engine 0's words for chip 6 go along the row, engine 1's for chip 9 along the column.
    mine0, mine1 = (6, 5, CHAN_COLL, False), (9, 5, CHAN_COLL1, False)
    txs, _, _, _, _, took = _route([None, None], [True, True], None, mine0, None, chip=5,
                                   row=row, coll1=mine1)
    assert txs == [mine0, mine1] and took == {"coll0", "coll1"}
    # A word along the row goes first on the row's link; the turning one waits.
    along = (7, 4, CHAN_COLL, False)
    txs, taken, *_ = _route([along, turn], [True, True], None, mine0, None, chip=5, row=row)
    assert txs == [along, None] and taken == [True, False]
    # Words for this chip on both links: engine 0 takes the row's first.
    a, b = (5, 4, CHAN_COLL, False), (5, 1, CHAN_COLL, True)
    _, taken, to_coll, *_ = _route([a, b], [True, True], None, None, None, chip=5, row=row)
    assert taken == [True, False] and to_coll == [True, False]
