"""Cycle models of the ring side of a chip: links, routers, collective engine, send and receive.

Like :mod:`sim.timing.engines`, each model follows its gateware register for register in what
decides *when* a word moves and carries no data: a ring word is its tag ``(dest, src, chan)``
and its ``last`` bit.

- :class:`LinkModel`: ``hw/ring/link.py`` (serialiser, ``latency`` skid stages, deserialiser);
- :func:`route`: ``hw/ring/router.py`` (combinational: deliver, forward along the column
  first, transmit priority), on a ring's chip (one link) or a torus's (two);
- :class:`CollectiveModel`: ``hw/ring/collective.py`` with the chip's word packer on its read
  generator and unpacker on its write generator (``hw/tile/gearbox.py``);
- :class:`SendModel`, :class:`RecvModel`: the chip's send unit (RD7, packer, clear-to-send
  tokens) and receive unit (FIFO, unpacker, WR4) of ``hw/chip.py``.
"""

from __future__ import annotations

from collections import deque

from hw.spec.collective import CollectiveRequest, step_words, steps
from hw.spec.isa import COLL_FIFO_WORDS, RECV_FIFO_WORDS
from hw.spec.ring import CHAN_COLL, CHAN_COLL1, CHAN_CTS, CHAN_P2P, COLL_CHANS, CTS_SLOTS

__all__ = ["LinkModel", "route", "CollectiveModel", "SendModel", "RecvModel"]


class LinkModel:
    """One ring link: words of ``ratio`` flits through ``latency`` skid registers.

    :meth:`out_word` and :meth:`in_ready` are registers (read before the routers decide);
    :meth:`step` moves one cycle given the word offered at the input (or None) and whether
    the receiving router takes the word at the output.
    """

    def __init__(self, *, ratio: int, latency: int):
        self.ratio = ratio
        self.latency = latency
        self.main = [None] * latency      # each stage's main register (a flit: its word)
        self.skid = [None] * latency
        self.sword = None                 # the serialiser's word (sfull when not None)
        self.scount = 0
        self.dcount = 0

    def in_ready(self) -> bool:
        head_ready = self.skid[0] is None
        if self.ratio > 1 and self.sword is not None:
            return head_ready and self.scount == self.ratio - 1
        return head_ready

    def out_word(self):
        """The word the link offers, or None."""
        tail = self.main[-1]
        if tail is None or (self.ratio > 1 and self.dcount != self.ratio - 1):
            return None
        return tail

    def busy(self) -> bool:
        return self.sword is not None or any(x is not None for x in self.main)

    def step(self, i_word, o_ready: bool):
        lat, ratio = self.latency, self.ratio
        main, skid = self.main, self.skid
        # Serialiser -> the first register's input.
        head_ready = skid[0] is None
        if ratio > 1 and self.sword is not None:
            head = self.sword
            if head_ready:
                if self.scount == ratio - 1:
                    self.sword = None
                    if i_word is not None:
                        self.sword, self.scount = i_word, 0
                else:
                    self.scount += 1
        else:
            head = i_word
            if ratio > 1 and i_word is not None and head_ready:
                self.sword, self.scount = i_word, 1
        # Deserialiser at the last register's output.
        tail_ready = (ratio > 1 and self.dcount != ratio - 1) or o_ready
        if main[-1] is not None and tail_ready and ratio > 1:
            self.dcount = 0 if self.dcount == ratio - 1 else self.dcount + 1
        # Skid registers, from the pre-cycle state.
        ins = [head] + main[:-1]
        readies = [skid[k + 1] is None for k in range(lat - 1)] + [tail_ready]
        for k in range(lat):
            inw = ins[k]
            take = inw is not None and skid[k] is None
            give = main[k] is not None and readies[k]
            if give:
                if skid[k] is not None:
                    main[k], skid[k] = skid[k], None
                elif take:
                    main[k] = inw
                else:
                    main[k] = None
            elif take:
                if main[k] is not None:
                    skid[k] = inw
                else:
                    main[k] = inw


def route(chip: int, row: tuple[int, int] | None, rxs, tx_readies, cts_word, coll_words,
          p2p_word, coll_ready_fns, p2p_open: bool, p2p_src: int, p2p_ready: bool,
          cts_ready_fn):
    """One cycle of a router (combinational), ``hw/ring/router.py``: per link (dimension 0,
    and on a torus dimension 1) ``rxs[d]`` the word it offers (or None) and ``tx_readies[d]``
    whether its outgoing link takes one; ``row`` the chip's row's first and last ids (None on
    a ring); ``cts_word``, ``coll_words[e]`` (per engine), ``p2p_word``: what the receive
    unit's clear-to-send, the collective engines and the send unit offer (None: nothing).
    ``coll_ready_fns[e](valid)`` returns whether engine e takes an offered ring word;
    ``cts_ready_fn(src)`` whether the send unit's store takes a token from ``src``.

    Returns ``(txs, rx_taken, to_coll, to_p2p, cts_from, took)``: per link the word entering
    it (None: none), per link whether its word was taken, per engine whether a word reached
    it, the message word for the receive unit (or None), the source chip of a clear-to-send
    token taken (or None), and the set of local offers transmitted (``"cts"``, ``"coll0"``,
    ``"coll1"``, ``"p2p"``).
    """
    dims = len(rxs)
    mine = [rx is not None and rx[0] == chip for rx in rxs]

    def along_row(dest):
        return row is None or row[0] <= dest <= row[1]

    # Receive side: each unit takes one word, dimension 0's first.
    delivered = [False] * dims
    to_coll = [False] * len(coll_words)
    to_p2p = None
    cts_from = None
    sinks = [("coll", e, CHAN_COLL if e == 0 else CHAN_COLL1) for e in range(len(coll_words))]
    sinks += [("p2p", 0, CHAN_P2P), ("cts", 0, CHAN_CTS)]
    for what, e, chan in sinks:
        offers = [mine[d] and rxs[d][2] == chan and
                  (what != "p2p" or (p2p_open and rxs[d][1] == p2p_src)) for d in range(dims)]
        pick = 0 if offers[0] else (1 if dims == 2 and offers[1] else None)
        valid = pick is not None
        if what == "coll":
            ready = coll_ready_fns[e](valid)
        elif not valid:
            continue
        elif what == "p2p":
            ready = p2p_ready
        else:
            ready = cts_ready_fn(rxs[pick][1])
        if valid and ready:
            delivered[pick] = True
            if what == "coll":
                to_coll[e] = True
            elif what == "p2p":
                to_p2p = rxs[pick]
            else:
                cts_from = rxs[pick][1]

    # Transmit side: per link, forwarded words first, then the local offers routed to it.
    forwarded = [False] * dims
    took = set()
    txs = [None] * dims
    locals_ = [("cts", cts_word)] + [(f"coll{e}", w) for e, w in enumerate(coll_words)] + \
        [("p2p", p2p_word)]
    for d in range(dims):
        cands = []
        if d == 0:
            if rxs[0] is not None and not mine[0]:
                cands.append((0, rxs[0]))
            if dims == 2 and rxs[1] is not None and not mine[1] and along_row(rxs[1][0]):
                cands.append((1, rxs[1]))
        elif rxs[1] is not None and not mine[1] and not along_row(rxs[1][0]):
            cands.append((1, rxs[1]))
        for name, word in locals_:
            if word is not None and along_row(word[0]) == (d == 0):
                cands.append((name, word))
        if not cands or not tx_readies[d]:
            continue
        owner, word = cands[0]
        txs[d] = word
        if isinstance(owner, int):
            forwarded[owner] = True
        else:
            took.add(owner)
    rx_taken = [delivered[d] or forwarded[d] for d in range(dims)]
    return txs, rx_taken, to_coll, to_p2p, cts_from, took


class CollectiveModel:
    """The collective engine of one chip with its RD6 packer and WR3 unpacker (``ratio``
    scratchpad words per engine word)."""

    def __init__(self, *, chip: int, ratio: int, wbytes: int, engine: int = 0):
        self.chip = chip
        self.chan = COLL_CHANS[engine]
        self.ratio = ratio
        self.wbytes = wbytes
        self.running = False
        self.steps = []
        self.words = []
        self.s = self.k = 0
        self.pend_out = False
        self.rx_level = 0
        self.tx = deque()                 # words in the transmit buffer
        self.dest = 0
        self.fill = 0                     # RD6 packer
        self.upart = 0                    # WR3 unpacker

    def start(self, req: CollectiveRequest, rank: int, dest: int):
        """Run ``req`` (in group-rank space) as group rank ``rank``, sending to ``dest``."""
        self.running = True
        self.steps = steps(req, rank)
        self.words = [step_words(req, st, self.wbytes) for st in self.steps]
        self.s = self.k = 0
        self.dest = dest

    def busy_core(self) -> bool:
        return self.running or self.fill != 0

    def tx_word(self):
        return self.tx[0] if self.tx else None

    def out_valid(self) -> bool:
        return self.pend_out

    def comb(self, rx_valid_link: bool, wg3: bool):
        """The cycle's handshakes: returns whether a word offered by the router is taken and
        stores what :meth:`update` needs."""
        ratio = self.ratio
        stepping = self.running and self.s < len(self.steps)
        st = self.steps[self.s] if stepping else None
        words = self.words[self.s] if stepping else 0
        rx_direct = self.rx_level == 0
        rx_valid = rx_valid_link if rx_direct else self.rx_level > 0
        local_valid = self.fill == ratio
        o_local_ready = wg3 and self.upart == ratio - 1
        fire = False
        if stepping and words:
            can_accept = (not st.tx or len(self.tx) < COLL_FIFO_WORDS) and \
                (not self.pend_out or o_local_ready)
            fire = can_accept and (not st.rx or rx_valid) and (not st.local or local_valid)
        rx_take = fire and st.rx
        self._c = (stepping, st, words, rx_direct, rx_take, fire, o_local_ready)
        return self.rx_level < COLL_FIFO_WORDS or (rx_direct and rx_take)

    def pack_ready(self) -> bool:
        """The RD6 packer takes a scratchpad word this cycle (after :meth:`comb`)."""
        fire, st = self._c[5], self._c[1]
        return self.fill != self.ratio or (fire and st.local)

    def update(self, rx_in: bool, rx6_pop: bool, tx_taken: bool, wg3: bool):
        stepping, st, words, rx_direct, rx_take, fire, o_local_ready = self._c
        ratio = self.ratio
        end = self.running and self.s >= len(self.steps) and not self.pend_out and not self.tx
        if tx_taken:
            self.tx.popleft()
        if rx_in and not (rx_direct and rx_take):
            self.rx_level += 1
        if rx_take and not rx_direct:
            self.rx_level -= 1
        if self.pend_out and o_local_ready:
            self.pend_out = False
        if wg3:
            self.upart = 0 if self.upart == ratio - 1 else self.upart + 1
        give = fire and st.local
        self.fill = (0 if give else self.fill) + rx6_pop
        if fire:
            if st.tx:
                self.tx.append((self.dest, self.chip, self.chan, self.k == words - 1))
            self.pend_out = st.out
            if self.k == words - 1:
                self.k = 0
                self.s += 1
            else:
                self.k += 1
        elif stepping and words == 0:
            self.s += 1
        if end:
            self.running = False


class SendModel:
    """The send unit: RD7 -> packer -> the router, to ``dest``, once it holds a clear-to-send
    token from ``dest`` (a store of :data:`~hw.spec.ring.CTS_SLOTS` tokens' sources)."""

    def __init__(self, *, chip: int, ratio: int):
        self.chip = chip
        self.ratio = ratio
        self.active = False
        self.clear = False
        self.dest = 0
        self.cts = set()                  # sources of the clear-to-send tokens held
        self.fill = 0
        self.total = self.taken = 0       # scratchpad words of the message, taken so far

    def start(self, dest: int, words: int):
        self.active = True
        self.clear = False
        self.dest = dest
        self.total, self.taken = words, 0

    def busy_core(self) -> bool:
        return self.active or self.fill != 0

    def cts_ready(self, src: int) -> bool:
        """Whether the store takes a token from ``src`` this cycle (it has room, or holds one
        from ``src`` already)."""
        return len(self.cts) < CTS_SLOTS or src in self.cts

    def word(self):
        """The ring word offered to the router, or None."""
        if self.clear and self.fill == self.ratio:
            return (self.dest, self.chip, CHAN_P2P, self.taken == self.total)
        return None

    def pack_ready(self, sent: bool) -> bool:
        return self.fill != self.ratio or sent

    def update(self, rx7_pop: bool, sent: bool, cts_from):
        take = self.active and not self.clear and self.dest in self.cts
        last = sent and self.taken == self.total
        if cts_from is not None:
            self.cts.add(cts_from)
        if take:                          # a token that arrives meanwhile is consumed too
            self.cts.discard(self.dest)
            self.clear = True
        self.fill = (0 if sent else self.fill) + rx7_pop
        self.taken += rx7_pop
        if last:
            self.active = False
            self.clear = False


class RecvModel:
    """The receive unit: a clear-to-send token to ``src``, then that chip's message words ->
    FIFO -> unpacker -> WR4, until ``last``."""

    def __init__(self, *, chip: int, ratio: int):
        self.chip = chip
        self.ratio = ratio
        self.open = False
        self.cts_due = False
        self.src = 0
        self.fifo = deque()               # each word's `last`
        self.upart = 0

    def start(self, src: int):
        self.open = True
        self.cts_due = True
        self.src = src

    def busy_core(self) -> bool:
        return self.open or self.cts_due or bool(self.fifo)

    def cts_word(self):
        return (self.src, self.chip, CHAN_CTS, True)

    def out_valid(self) -> bool:
        return bool(self.fifo)

    def fifo_ready(self) -> bool:
        return len(self.fifo) < RECV_FIFO_WORDS

    def update(self, word_in, cts_sent: bool, wg4: bool):
        if cts_sent:
            self.cts_due = False
        if wg4:
            if self.upart == self.ratio - 1:
                self.upart = 0
                self.fifo.popleft()
            else:
                self.upart += 1
        if word_in is not None:
            self.fifo.append(word_in[3])
            if word_in[3]:
                self.open = False
