"""Ring link: chip i's transmitter to chip (i+1) mod N's receiver.

The engines exchange **words** of ``word_bytes`` bytes (:func:`hw.layouts.ring_word_layout`); the
wire between chips is ``width_bytes`` wide. A link serialises each word into ``word_bytes /
width_bytes`` **flits**, carries them through ``latency`` pipeline registers and reassembles the
word at the far end. Each register is a skid buffer (two entries, registered ``ready``): the link
runs at one flit per cycle under backpressure, never loses or duplicates a flit, and has no
combinational path from the receiver's ``ready`` to the transmitter's ``ready`` across the pipeline.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..layouts import lanes_layout, ring_word_layout

__all__ = ["flit_layout", "SkidStage", "RingLink"]


def flit_layout(width_bytes: int, tag_bits: int = 0) -> data.StructLayout:
    """A flit on the wire: ``width_bytes`` bytes plus ``last`` (sideband, like AXI ``TLAST``)
    and, with ``tag_bits``, the word's routing tag (every flit of a word carries it)."""
    extra = {"tag": unsigned(tag_bits)} if tag_bits else {}
    return lanes_layout(unsigned(8), width_bytes, **extra)


class SkidStage(wiring.Component):
    """One pipeline register with a skid entry: latency 1 cycle, throughput 1 per cycle.

    ``i.ready`` is a register (no skid entry in use) gated by ``stall``; ``o.valid`` is a register.
    ``stall`` high refuses the next input transfer (a fault-injection point: the sender sees
    ``ready`` dropped, the receiver a gap in ``valid``); it never loses or changes a payload.
    """

    def __init__(self, layout):
        self._layout = layout
        super().__init__({
            "i": In(stream.Signature(layout)),
            "o": Out(stream.Signature(layout)),
            "stall": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        main = Signal(self._layout)
        main_valid = Signal()
        skid = Signal(self._layout)
        skid_valid = Signal()

        take = Signal()
        give = Signal()
        m.d.comb += [
            self.i.ready.eq(~skid_valid & ~self.stall),
            take.eq(self.i.valid & self.i.ready),
            self.o.valid.eq(main_valid),
            self.o.payload.eq(main),
            give.eq(self.o.valid & self.o.ready),
        ]
        with m.If(give):
            with m.If(skid_valid):
                m.d.sync += [main.eq(skid), skid_valid.eq(0)]
            with m.Elif(take):
                m.d.sync += main.eq(self.i.payload)
            with m.Else():
                m.d.sync += main_valid.eq(0)
        with m.Elif(take):
            with m.If(main_valid):
                m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
            with m.Else():
                m.d.sync += [main.eq(self.i.payload), main_valid.eq(1)]
        return m


class RingLink(wiring.Component):
    """A ring link of ``width_bytes`` bytes per cycle and ``latency`` pipeline registers.

    Parameters (keyword-only)
    -------------------------
    width_bytes : int
        Flit width (``link_bytes_per_cycle``); a power of two dividing ``word_bytes``.
    latency : int
        Pipeline registers on the wire (``link_latency_cycles``), at least 1.
    word_bytes : int
        Engine word size; default ``max(2 * width_bytes, 8)``.
    tag_bits : int
        Bits of a routing tag carried beside each word (:func:`hw.layouts.ring_word_layout`;
        0: none). The chips' ring ports use :data:`hw.spec.ring.TAG_BITS`.

    Members
    -------
    i : In(stream.Signature(ring_word_layout(word_bytes)))
        Words from the transmitting engine.
    o : Out(stream.Signature(ring_word_layout(word_bytes)))
        The same words, in order, at the receiving engine.
    stall : In(latency)
        Fault injection: bit ``k`` refuses transfers into pipeline register ``k`` (tie to 0).

    Timing: with ``r = word_bytes / width_bytes`` flits per word, a word needs ``r`` cycles of
    wire (throughput ``width_bytes`` per cycle). A word transferred into ``i`` in cycle ``t``
    (its first flit enters the wire in the same cycle) is valid at ``o`` from cycle
    ``t + latency + r - 1``: the ``latency`` registers plus the wait for its last flit.
    """

    def __init__(self, *, width_bytes: int, latency: int, word_bytes: int | None = None,
                 tag_bits: int = 0):
        if not isinstance(width_bytes, int) or isinstance(width_bytes, bool) or width_bytes < 1 \
                or width_bytes & (width_bytes - 1):
            raise ValueError(f"width_bytes must be a power of two, not {width_bytes!r}")
        if not isinstance(latency, int) or isinstance(latency, bool) or latency < 1:
            raise ValueError(f"latency must be a positive integer, not {latency!r}")
        if word_bytes is None:
            word_bytes = max(2 * width_bytes, 8)
        if not isinstance(word_bytes, int) or word_bytes < width_bytes \
                or word_bytes % width_bytes or word_bytes % 4:
            raise ValueError(f"word_bytes must be a multiple of 4 and of width_bytes="
                             f"{width_bytes}, not {word_bytes!r}")
        if not isinstance(tag_bits, int) or isinstance(tag_bits, bool) or tag_bits < 0:
            raise ValueError(f"tag_bits must be a non-negative integer, not {tag_bits!r}")
        self.width_bytes = width_bytes
        self.latency = latency
        self.word_bytes = word_bytes
        self.tag_bits = tag_bits
        word = ring_word_layout(word_bytes, tag_bits=tag_bits)
        super().__init__({
            "i": In(stream.Signature(word)),
            "o": Out(stream.Signature(word)),
            "stall": In(latency),
        })

    def elaborate(self, platform):
        m = Module()
        flit = flit_layout(self.width_bytes, self.tag_bits)
        tagged = self.tag_bits > 0
        ratio = self.word_bytes // self.width_bytes
        fbits = self.width_bytes * 8

        stages = []
        for k in range(self.latency):
            stage = SkidStage(flit)
            m.submodules[f"stage{k}"] = stage
            m.d.comb += stage.stall.eq(self.stall[k])
            if stages:
                wiring.connect(m, stages[-1].o, stage.i)
            stages.append(stage)
        head, tail = stages[0].i, stages[-1].o

        if ratio == 1:
            m.d.comb += [
                head.payload.data.eq(self.i.payload.data),
                head.payload.last.eq(self.i.payload.last),
                head.valid.eq(self.i.valid),
                self.i.ready.eq(head.ready),
                self.o.payload.data.eq(tail.payload.data),
                self.o.payload.last.eq(tail.payload.last),
                self.o.valid.eq(tail.valid),
                tail.ready.eq(self.o.ready),
            ]
            if tagged:
                m.d.comb += [head.payload.tag.eq(self.i.payload.tag),
                             self.o.payload.tag.eq(tail.payload.tag)]
            return m

        # Serialiser: a word's first flit goes straight onto the wire when the serialiser is
        # empty; the rest wait in `sbuf` and leave one per cycle, low bytes first.
        sbuf = Signal(self.word_bytes * 8)
        scount = Signal(range(ratio))     # index of the flit at sbuf[:fbits]
        sfull = Signal()
        slast = Signal()
        stag = Signal(max(self.tag_bits, 1))
        with m.If(sfull):
            m.d.comb += [
                head.valid.eq(1),
                head.payload.data.eq(sbuf[:fbits]),
                head.payload.last.eq(slast & (scount == ratio - 1)),
                self.i.ready.eq(head.ready & (scount == ratio - 1)),
            ]
            with m.If(head.ready):
                m.d.sync += [sbuf.eq(sbuf >> fbits), scount.eq(scount + 1)]
                with m.If(scount == ratio - 1):
                    m.d.sync += sfull.eq(0)
                    with m.If(self.i.valid):    # next word: all its flits from sbuf
                        m.d.sync += [sbuf.eq(self.i.payload.data), scount.eq(0),
                                     sfull.eq(1), slast.eq(self.i.payload.last)]
                        if tagged:
                            m.d.sync += stag.eq(self.i.payload.tag)
        with m.Else():
            m.d.comb += [
                head.valid.eq(self.i.valid),
                head.payload.data.eq(self.i.payload.data.as_value()[:fbits]),
                head.payload.last.eq(0),
                self.i.ready.eq(head.ready),
            ]
            with m.If(self.i.valid & head.ready):
                m.d.sync += [sbuf.eq(self.i.payload.data.as_value() >> fbits), scount.eq(1),
                             sfull.eq(1), slast.eq(self.i.payload.last)]
                if tagged:
                    m.d.sync += stag.eq(self.i.payload.tag)
        if tagged:
            m.d.comb += head.payload.tag.eq(Mux(sfull, stag, self.i.payload.tag))

        # Deserialiser: collect the first ratio - 1 flits; the word is offered while its last
        # flit is on the wire's last register (no extra register, no retraction of valid).
        dbuf = Signal((ratio - 1) * fbits)
        dcount = Signal(range(ratio))
        at_last = Signal()
        m.d.comb += [
            at_last.eq(dcount == ratio - 1),
            self.o.valid.eq(tail.valid & at_last),
            self.o.payload.data.eq(Cat(dbuf, tail.payload.data)),
            self.o.payload.last.eq(tail.payload.last),
            tail.ready.eq(~at_last | self.o.ready),
        ]
        if tagged:
            m.d.comb += self.o.payload.tag.eq(tail.payload.tag)
        with m.If(tail.valid & tail.ready):
            with m.If(at_last):
                m.d.sync += dcount.eq(0)
            with m.Else():
                if ratio > 2:
                    m.d.sync += dbuf.eq(Cat(dbuf[fbits:], tail.payload.data))
                else:
                    m.d.sync += dbuf.eq(tail.payload.data)
                m.d.sync += dcount.eq(dcount + 1)
        return m
