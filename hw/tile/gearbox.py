"""Word-width converters between the scratchpad's words and a unit's wider words.

A unit whose words are ``ratio`` scratchpad words wide (the collective engine's ``D`` bytes,
``D / N`` scratchpad words) reads through a :class:`WordPacker` and writes through a
:class:`WordUnpacker`. In both, the first scratchpad word holds the low bytes.
"""

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["words_layout", "WordPacker", "WordUnpacker"]


def words_layout(bits: int) -> data.StructLayout:
    """A plain word of ``bits`` bits plus ``last``."""
    return data.StructLayout({"data": bits, "last": 1})


def _check(narrow_bits, ratio):
    for name, value in (("narrow_bits", narrow_bits), ("ratio", ratio)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an integer, not {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be at least 1, not {value}")


class WordPacker(wiring.Component):
    """``ratio`` narrow words in, one wide word out (the first narrow word in the low bits).

    It takes a narrow word in the same cycle as the consumer takes the full wide word, so a
    steady stream moves one narrow word per cycle with no bubble; ``o.valid`` rises the cycle
    after the last narrow word of a wide word is taken. ``o.payload.last`` is the last narrow
    word's ``last``. ``busy``: a partial wide word is held.

    Members
    -------
    i : In(stream.Signature(words_layout(narrow_bits)))
    o : Out(stream.Signature(words_layout(narrow_bits * ratio)))
    busy : Out(1)
    """

    def __init__(self, *, narrow_bits: int, ratio: int):
        _check(narrow_bits, ratio)
        self._narrow, self._ratio = narrow_bits, ratio
        super().__init__({
            "i": In(stream.Signature(words_layout(narrow_bits))),
            "o": Out(stream.Signature(words_layout(narrow_bits * ratio))),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        ratio = self._ratio
        slots = [Signal(self._narrow, name=f"slot{k}") for k in range(ratio)]
        last = Signal()
        fill = Signal(range(ratio + 1))
        full = fill == ratio
        take, give = Signal(), Signal()
        m.d.comb += [
            self.o.valid.eq(full),
            self.o.payload.data.eq(Cat(*slots)),
            self.o.payload.last.eq(last),
            self.i.ready.eq(~full | self.o.ready),
            take.eq(self.i.valid & self.i.ready),
            give.eq(self.o.valid & self.o.ready),
            self.busy.eq(fill != 0),
        ]
        at = Signal(range(ratio + 1))
        m.d.comb += at.eq(Mux(give, 0, fill))
        with m.If(take):
            m.d.sync += last.eq(self.i.payload.last)
            with m.Switch(at):
                for k in range(ratio):
                    with m.Case(k):
                        m.d.sync += slots[k].eq(self.i.payload.data)
        m.d.sync += fill.eq(at + take)
        return m


class WordUnpacker(wiring.Component):
    """One wide word in, ``ratio`` narrow words out (low bits first), combinationally.

    ``o`` offers narrow word ``k`` of the wide word on ``i`` while ``i.valid``; ``i`` is taken
    with the last narrow word (the stream contract keeps its payload stable until then). No
    latency; one narrow word per cycle. ``o.payload.last`` is set on the last narrow word of a
    wide word whose ``last`` is set.

    Members
    -------
    i : In(stream.Signature(words_layout(narrow_bits * ratio)))
    o : Out(stream.Signature(words_layout(narrow_bits)))
    """

    def __init__(self, *, narrow_bits: int, ratio: int):
        _check(narrow_bits, ratio)
        self._narrow, self._ratio = narrow_bits, ratio
        super().__init__({
            "i": In(stream.Signature(words_layout(narrow_bits * ratio))),
            "o": Out(stream.Signature(words_layout(narrow_bits))),
        })

    def elaborate(self, platform):
        m = Module()
        ratio, bits = self._ratio, self._narrow
        part = Signal(range(ratio))
        at_last = part == ratio - 1
        m.d.comb += [
            self.o.valid.eq(self.i.valid),
            self.o.payload.last.eq(self.i.payload.last & at_last),
            self.i.ready.eq(self.o.ready & at_last),
        ]
        with m.Switch(part):
            for k in range(ratio):
                with m.Case(k):
                    m.d.comb += self.o.payload.data.eq(self.i.payload.data[k * bits:(k + 1) * bits])
        if ratio > 1:
            with m.If(self.o.valid & self.o.ready):
                m.d.sync += part.eq(Mux(at_last, 0, part + 1))
        return m
