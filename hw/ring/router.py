"""A chip's ring router: deliver the words for this chip, forward the others (``hw.spec.ring``).

Words on the links carry a tag (``dest``, ``src``, ``chan``; :func:`tag_layout`). The router
sits between the chip's ring port and its units:

- **Receive side.** A word from the previous chip whose ``dest`` is this chip goes, by
  ``chan``, to the collective engine (``o_coll``), to the receive unit (``o_p2p``: only while it
  waits for a message, ``p2p_open``, from ``p2p_src``; otherwise the word waits) or to the send
  unit's clear-to-send flags (``cts_set``, a one-cycle pulse per token, always taken). Every
  other word is forwarded to the next chip.
- **Transmit side.** One word per transfer to the next chip's link, by fixed priority:
  forwarded words, then clear-to-send tokens (``i_cts``), then collective words (``i_coll``),
  then message words (``i_p2p``). Forwarded words first: traffic already on the ring drains
  before a chip adds more.

Everything is combinational: a word is delivered or forwarded in the cycle the link offers it
(no added latency), and a chip whose units are idle forwards at the link's rate.

Members
-------
chip_id : In(CHIP_BITS)
i_link : In(stream) tagged words from the previous chip's link
o_link : Out(stream) tagged words to the next chip's link
i_coll : In(stream) the collective engine's words, tagged by the chip
o_coll : Out(stream) words for the collective engine (untagged ring words)
i_p2p : In(stream) the send unit's message words, tagged by the chip
o_p2p : Out(stream) message words for the receive unit (untagged)
p2p_open, p2p_src : In(1), In(CHIP_BITS)
i_cts : In(stream) ``{dest}``: send a clear-to-send token to chip ``dest``
cts_set : Out(1 << CHIP_BITS) bit s pulses when a token from chip s arrives
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..layouts import ring_word_layout
from ..spec.ring import CHAN_BITS, CHAN_COLL, CHAN_CTS, CHAN_P2P, CHIP_BITS, TAG_BITS

__all__ = ["tag_layout", "Router"]


def tag_layout() -> data.StructLayout:
    """A word's routing tag: ``dest`` (low bits), ``src``, ``chan``."""
    return data.StructLayout({"dest": CHIP_BITS, "src": CHIP_BITS, "chan": CHAN_BITS})


class Router(wiring.Component):
    """See the module docstring. ``word_bytes`` is the ring word (the collective engine's ``D``)."""

    def __init__(self, *, word_bytes: int):
        self.word_bytes = word_bytes
        tagged = ring_word_layout(word_bytes, tag_bits=TAG_BITS)
        plain = ring_word_layout(word_bytes)
        super().__init__({
            "chip_id": In(CHIP_BITS),
            "i_link": In(stream.Signature(tagged)),
            "o_link": Out(stream.Signature(tagged)),
            "i_coll": In(stream.Signature(tagged)),
            "o_coll": Out(stream.Signature(plain)),
            "i_p2p": In(stream.Signature(tagged)),
            "o_p2p": Out(stream.Signature(plain)),
            "p2p_open": In(1),
            "p2p_src": In(CHIP_BITS),
            "i_cts": In(stream.Signature(data.StructLayout({"dest": CHIP_BITS}))),
            "cts_set": Out(1 << CHIP_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        rx = self.i_link
        tag = data.View(tag_layout(), rx.payload.tag)
        mine = tag.dest == self.chip_id
        to_coll = mine & (tag.chan == CHAN_COLL)
        to_p2p = mine & (tag.chan == CHAN_P2P)
        to_cts = mine & (tag.chan == CHAN_CTS)
        p2p_ok = self.p2p_open & (tag.src == self.p2p_src)
        forward = ~mine

        for out in (self.o_coll, self.o_p2p):
            m.d.comb += [out.payload.data.eq(rx.payload.data),
                         out.payload.last.eq(rx.payload.last)]
        m.d.comb += [
            self.o_coll.valid.eq(rx.valid & to_coll),
            self.o_p2p.valid.eq(rx.valid & to_p2p & p2p_ok),
        ]
        with m.If(rx.valid & to_cts):
            m.d.comb += self.cts_set.eq(1 << tag.src)

        # Transmit: forwarded words, CTS tokens, collective words, message words.
        tx = self.o_link
        fwd_valid = rx.valid & forward
        cts_tag = Signal(tag_layout())
        m.d.comb += [cts_tag.dest.eq(self.i_cts.payload.dest), cts_tag.src.eq(self.chip_id),
                     cts_tag.chan.eq(CHAN_CTS)]
        pick_fwd = fwd_valid
        pick_cts = ~fwd_valid & self.i_cts.valid
        pick_coll = ~fwd_valid & ~self.i_cts.valid & self.i_coll.valid
        pick_p2p = ~fwd_valid & ~self.i_cts.valid & ~self.i_coll.valid & self.i_p2p.valid
        m.d.comb += tx.valid.eq(fwd_valid | self.i_cts.valid | self.i_coll.valid |
                                self.i_p2p.valid)
        with m.If(pick_fwd):
            m.d.comb += tx.payload.eq(rx.payload)
        with m.Elif(pick_cts):
            m.d.comb += [tx.payload.data.eq(0), tx.payload.last.eq(1),
                         tx.payload.tag.eq(cts_tag.as_value())]
        with m.Elif(pick_coll):
            m.d.comb += tx.payload.eq(self.i_coll.payload)
        with m.Else():
            m.d.comb += tx.payload.eq(self.i_p2p.payload)
        m.d.comb += [
            self.i_cts.ready.eq(pick_cts & tx.ready),
            self.i_coll.ready.eq(pick_coll & tx.ready),
            self.i_p2p.ready.eq(pick_p2p & tx.ready),
        ]
        # The receive side is ready when its word's destination takes it.
        m.d.comb += rx.ready.eq(
            Mux(forward, tx.ready,
                Mux(tag.chan == CHAN_COLL, self.o_coll.ready,
                    Mux(tag.chan == CHAN_P2P, self.o_p2p.ready & p2p_ok, 1))))
        return m
