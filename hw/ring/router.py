"""A chip's router: deliver the words for this chip, forward the others (``hw.spec.ring``).

Words on the links carry a tag (``dest``, ``src``, ``chan``; :func:`tag_layout`). The router
sits between the chip's link ports (one per dimension of its system: ``dims`` 1 on a ring, 2
on a torus) and its units:

- **Receive side.** A word from a link whose ``dest`` is this chip goes, by ``chan``, to a
  collective engine (``o_coll``, ``o_coll1``), to the receive unit (``o_p2p``: only while it
  waits for a message, ``p2p_open``, from ``p2p_src``; otherwise the word waits) or to the send
  unit's clear-to-send store (``o_cts``, the token's source; the word waits while the store is
  full). When both links offer a word for the same unit, dimension 0's goes first. Every other
  word is forwarded.
- **Routing** (:func:`hw.spec.ring.route_dim`): a word leaves by dimension 0 (along the row)
  when its ``dest`` is in this chip's row, ``row_first .. row_last``, else by dimension 1
  (along the column). So a word from dimension 0 always goes on along it, and a word from
  dimension 1 goes on along it or turns into dimension 0. A ring's router has no row: every
  word leaves by dimension 0.
- **Transmit side.** One word per transfer on each link, by fixed priority: forwarded words
  (on dimension 0: those along it, then those turning into it), then clear-to-send tokens
  (``i_cts``), then collective engine 0's words, engine 1's, then message words (``i_p2p``),
  each on the link its ``dest`` routes it to. Forwarded words first: traffic already in the
  network drains before a chip adds more.

Everything is combinational: a word is delivered or forwarded in the cycle the link offers it
(no added latency), and a chip whose units are idle forwards at the links' rate.

Members
-------
chip_id : In(chip_bits)
row_first, row_last : In(chip_bits)
    The ids of the first and last chip of this chip's row (``dims`` 2 only).
i_link, o_link : In/Out(stream) tagged words from / to dimension 0's links
i_link_y, o_link_y : the same on dimension 1 (``dims`` 2 only)
i_coll, o_coll : collective engine 0's words (tagged by the chip) / words for it (untagged)
i_coll1, o_coll1 : the same for engine 1 (``engines`` 2 only)
i_p2p : In(stream) the send unit's message words, tagged by the chip
o_p2p : Out(stream) message words for the receive unit (untagged)
p2p_open, p2p_src : In(1), In(chip_bits)
i_cts : In(stream) ``{dest}``: send a clear-to-send token to chip ``dest``
o_cts : Out(stream) ``{src}``: a token from chip ``src`` has arrived
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..layouts import ring_word_layout
from ..spec.ring import CHAN_BITS, CHAN_COLL, CHAN_COLL1, CHAN_CTS, CHAN_P2P, tag_bits

__all__ = ["tag_layout", "Router"]


def tag_layout(chip_bits: int) -> data.StructLayout:
    """A word's routing tag: ``dest`` (low bits), ``src``, ``chan``."""
    return data.StructLayout({"dest": chip_bits, "src": chip_bits, "chan": CHAN_BITS})


def _check(name, value, choices):
    if not isinstance(value, int) or isinstance(value, bool) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(str, choices))}, not {value!r}")


class Router(wiring.Component):
    """See the module docstring. ``word_bytes`` is the ring word (the collective engines'
    ``D``), ``chip_bits`` the bits of a chip id, ``dims`` the system's dimensions (1: a ring,
    2: a torus), ``engines`` the chip's collective engines (1 or 2)."""

    def __init__(self, *, word_bytes: int, chip_bits: int, dims: int = 1, engines: int = 1):
        if not isinstance(chip_bits, int) or isinstance(chip_bits, bool) or \
                not 1 <= chip_bits <= 16:
            raise ValueError(f"chip_bits must be an integer 1..16, not {chip_bits!r}")
        _check("dims", dims, (1, 2))
        _check("engines", engines, (1, 2))
        self.word_bytes = word_bytes
        self.chip_bits = chip_bits
        self.dims = dims
        self.engines = engines
        tagged = ring_word_layout(word_bytes, tag_bits=tag_bits(chip_bits))
        plain = ring_word_layout(word_bytes)
        members = {
            "chip_id": In(chip_bits),
            "i_link": In(stream.Signature(tagged)),
            "o_link": Out(stream.Signature(tagged)),
            "i_coll": In(stream.Signature(tagged)),
            "o_coll": Out(stream.Signature(plain)),
            "i_p2p": In(stream.Signature(tagged)),
            "o_p2p": Out(stream.Signature(plain)),
            "p2p_open": In(1),
            "p2p_src": In(chip_bits),
            "i_cts": In(stream.Signature(data.StructLayout({"dest": chip_bits}))),
            "o_cts": Out(stream.Signature(data.StructLayout({"src": chip_bits}))),
        }
        if dims == 2:
            members.update({
                "row_first": In(chip_bits),
                "row_last": In(chip_bits),
                "i_link_y": In(stream.Signature(tagged)),
                "o_link_y": Out(stream.Signature(tagged)),
            })
        if engines == 2:
            members.update({
                "i_coll1": In(stream.Signature(tagged)),
                "o_coll1": Out(stream.Signature(plain)),
            })
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cb = self.chip_bits
        two = self.dims == 2
        tagged = self.i_link.payload.shape()

        def along_row(dest):
            """High when a word for ``dest`` leaves by dimension 0."""
            if not two:
                return 1
            return (dest >= self.row_first) & (dest <= self.row_last)

        def first_of(valids, name):
            """Signals ``pick[k]``: ``valids[k]`` and no earlier one (fixed priority)."""
            picks, before = [], None
            for k, valid in enumerate(valids):
                pick = Signal(name=f"{name}{k}")
                m.d.comb += pick.eq(valid if before is None else valid & ~before)
                before = valid if before is None else before | valid
                picks.append(pick)
            return picks

        # --- receive side -------------------------------------------------------------------
        rxs = [self.i_link] + ([self.i_link_y] if two else [])
        tags = [data.View(tag_layout(cb), rx.payload.tag) for rx in rxs]
        mine = []
        for d, (rx, tag) in enumerate(zip(rxs, tags, strict=True)):
            mine.append(Signal(name=f"mine{d}"))
            m.d.comb += mine[d].eq(rx.valid & (tag.dest == self.chip_id))

        sinks = [(self.o_coll, lambda tag: tag.chan == CHAN_COLL)]
        if self.engines == 2:
            sinks.append((self.o_coll1, lambda tag: tag.chan == CHAN_COLL1))
        sinks.append((self.o_p2p, lambda tag: (tag.chan == CHAN_P2P) & self.p2p_open &
                      (tag.src == self.p2p_src)))
        sinks.append((self.o_cts, lambda tag: tag.chan == CHAN_CTS))
        delivered = [[] for _ in rxs]     # per link: its word taken by a unit this cycle
        for k, (sink, wants) in enumerate(sinks):
            offers = []
            for d, tag in enumerate(tags):
                offer = Signal(name=f"offer{k}_{d}")
                m.d.comb += offer.eq(mine[d] & wants(tag))
                offers.append(offer)
            picks = first_of(offers, f"deliver{k}_")      # dimension 0's word first
            m.d.comb += sink.valid.eq(Cat(*offers).any())
            payload = rxs[0].payload.as_value()
            tag = tags[0]
            if two:
                payload = Mux(picks[1], rxs[1].payload.as_value(), payload)
                tag = data.View(tag_layout(cb), Mux(picks[1], tags[1].as_value(),
                                                    tags[0].as_value()))
            if sink is self.o_cts:
                m.d.comb += sink.payload.src.eq(tag.src)
            else:
                view = data.View(tagged, payload)
                m.d.comb += [sink.payload.data.eq(view.data), sink.payload.last.eq(view.last)]
            for d, pick in enumerate(picks):
                delivered[d].append(pick & sink.ready)

        # --- transmit side ------------------------------------------------------------------
        fwd0 = Signal()                       # a word from dimension 0 going on along it
        m.d.comb += fwd0.eq(self.i_link.valid & ~mine[0])
        through = [[(0, fwd0)]]               # per output link: (input link, valid)
        if two:
            turn, fwd1 = Signal(), Signal()
            row1 = along_row(tags[1].dest)
            m.d.comb += [turn.eq(self.i_link_y.valid & ~mine[1] & row1),
                         fwd1.eq(self.i_link_y.valid & ~mine[1] & ~row1)]
            through[0].append((1, turn))
            through.append([(1, fwd1)])

        cts_word = Signal(tagged)
        cts_tag = data.View(tag_layout(cb), cts_word.tag)
        m.d.comb += [cts_word.last.eq(1), cts_tag.dest.eq(self.i_cts.payload.dest),
                     cts_tag.src.eq(self.chip_id), cts_tag.chan.eq(CHAN_CTS)]
        sources = [(self.i_cts, self.i_cts.payload.dest, cts_word.as_value())]
        for src in [self.i_coll] + ([self.i_coll1] if self.engines == 2 else []) + \
                [self.i_p2p]:
            sources.append((src, data.View(tag_layout(cb), src.payload.tag).dest,
                            src.payload.as_value()))
        source_ready = [[] for _ in sources]
        forwarded = [[] for _ in rxs]         # per input link: its word taken by a link
        txs = [self.o_link] + ([self.o_link_y] if two else [])
        for d, tx in enumerate(txs):
            valids, values, owners = [], [], []
            for link, valid in through[d]:
                valids.append(valid)
                values.append(rxs[link].payload.as_value())
                owners.append(("link", link))
            for k, (src, dest, value) in enumerate(sources):
                route = along_row(dest)
                valid = Signal(name=f"local{k}_{d}")
                m.d.comb += valid.eq(src.valid & (route if d == 0 else ~route))
                valids.append(valid)
                values.append(value)
                owners.append(("source", k))
            picks = first_of(valids, f"tx{d}_")
            chosen = values[-1]
            for pick, value in zip(reversed(picks[:-1]), reversed(values[:-1]), strict=True):
                chosen = Mux(pick, value, chosen)
            m.d.comb += [tx.valid.eq(Cat(*valids).any()), tx.payload.eq(chosen)]
            for pick, (what, k) in zip(picks, owners, strict=True):
                (forwarded if what == "link" else source_ready)[k].append(pick & tx.ready)
        for (src, _, _), terms in zip(sources, source_ready, strict=True):
            m.d.comb += src.ready.eq(Cat(*terms).any())
        # A link's word is taken when its unit or the link it goes on takes it.
        for d, rx in enumerate(rxs):
            m.d.comb += rx.ready.eq(Cat(*(delivered[d] + forwarded[d])).any())
        return m
