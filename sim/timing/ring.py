"""Cycle models of the ring side of a chip: links, routers, collective engine, send and receive.

Like :mod:`sim.timing.engines`, each model follows its gateware register for register in what
decides *when* a word moves and carries no data: a ring word is its tag ``(dest, src, chan)``
and its ``last`` bit.

- :class:`LinkModel`: ``hw/ring/link.py`` (serialiser, ``latency`` skid stages, deserialiser);
- :func:`route`: ``hw/ring/router.py`` (combinational: deliver, forward, transmit priority);
- :class:`CollectiveModel`: ``hw/ring/collective.py`` with the chip's RD6 word packer and WR3
  unpacker (``hw/tile/gearbox.py``);
- :class:`SendModel`, :class:`RecvModel`: the chip's send unit (RD7, packer, clear-to-send
  tokens) and receive unit (FIFO, unpacker, WR4) of ``hw/chip.py``.
"""

from __future__ import annotations

from collections import deque

from hw.spec.collective import CollectiveRequest, step_words, steps
from hw.spec.isa import COLL_FIFO_WORDS, RECV_FIFO_WORDS
from hw.spec.ring import CHAN_COLL, CHAN_CTS, CHAN_P2P
from hw.spec.timing.collective import setup_cycles

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


def route(chip: int, rx, tx_ready: bool, cts_valid: bool, cts_word, coll_word, p2p_word,
          coll_ready_fn, p2p_open: bool, p2p_src: int, p2p_ready: bool):
    """One cycle of a router (combinational). ``rx``: the word the previous link offers (or
    None); ``coll_word`` / ``p2p_word`` / ``cts_word``: what the collective engine, the send
    unit and the receive unit's clear-to-send offer (None: nothing). ``coll_ready_fn(valid)``
    returns whether the engine takes an offered ring word.

    Returns ``(tx_word, rx_taken, to_coll, to_p2p, cts_from, took)`` where ``took`` names the
    unit whose offer was transmitted (``"cts"``, ``"coll"``, ``"p2p"`` or None) and
    ``cts_from`` the source chip of a clear-to-send token that arrived (or None).
    """
    mine = rx is not None and rx[0] == chip
    chan = rx[2] if rx is not None else -1
    to_coll = mine and chan == CHAN_COLL
    to_p2p = mine and chan == CHAN_P2P and p2p_open and rx[1] == p2p_src
    cts_from = rx[1] if mine and chan == CHAN_CTS else None
    fwd = rx is not None and not mine
    took = None
    if fwd:
        tx = rx
    elif cts_valid:
        tx, took = cts_word, "cts"
    elif coll_word is not None:
        tx, took = coll_word, "coll"
    elif p2p_word is not None:
        tx, took = p2p_word, "p2p"
    else:
        tx = None
    if not tx_ready:
        took = None
    coll_ready = coll_ready_fn(to_coll)
    if rx is None:
        rx_taken = False
    elif fwd:
        rx_taken = tx_ready
    elif chan == CHAN_COLL:
        rx_taken = coll_ready
    elif chan == CHAN_P2P:
        rx_taken = p2p_ready and p2p_open and rx[1] == p2p_src
    else:
        rx_taken = True
    return (tx if tx_ready else None), rx_taken, to_coll and rx_taken, \
        to_p2p and rx_taken, cts_from, took


class CollectiveModel:
    """The collective engine of one chip with its RD6 packer and WR3 unpacker (``ratio``
    scratchpad words per engine word)."""

    def __init__(self, *, chip: int, ratio: int, wbytes: int):
        self.chip = chip
        self.ratio = ratio
        self.wbytes = wbytes
        self.running = False
        self.steps = []
        self.words = []
        self.s = self.k = 0
        self.wait = 0                     # cycles of the divider left before the first step
        self.pend_out = False
        self.rx_level = 0
        self.tx = deque()                 # words in the transmit buffer
        self.dest = 0
        self.fill = 0                     # RD6 packer
        self.upart = 0                    # WR3 unpacker

    def start(self, req: CollectiveRequest, rank: int, dest: int):
        self.running = True
        self.steps = steps(req, rank)
        self.words = [step_words(req, st, self.wbytes) for st in self.steps]
        self.s = self.k = 0
        self.wait = setup_cycles(req.kind)
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
        stepping = self.running and self.wait == 0 and self.s < len(self.steps)
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
        if self.running and self.wait:
            self.wait -= 1
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
                self.tx.append((self.dest, self.chip, CHAN_COLL, self.k == words - 1))
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
    token from ``dest``."""

    def __init__(self, *, chip: int, ratio: int):
        self.chip = chip
        self.ratio = ratio
        self.active = False
        self.clear = False
        self.dest = 0
        self.cts = set()                  # chips whose clear-to-send token is held
        self.fill = 0
        self.total = self.taken = 0       # scratchpad words of the message, taken so far

    def start(self, dest: int, words: int):
        self.active = True
        self.clear = False
        self.dest = dest
        self.total, self.taken = words, 0

    def busy_core(self) -> bool:
        return self.active or self.fill != 0

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
