"""Block transposer: scratchpad rows in, matmul A-operand columns out."""

from amaranth.hdl import Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..layouts import spad_word_layout

__all__ = ["Transposer"]


class Transposer(wiring.Component):
    """Transpose ``size`` x ``size`` byte blocks, double-buffered.

    Activations are stored token-major (a word is ``size`` channels of one token), but the
    output-stationary array wants a column of A (one channel of ``size`` tokens) per beat.
    Each group of ``size`` input words ``w[0..size-1]`` (rows of a block) comes out as ``size``
    beats, beat ``c`` carrying ``w[r][c]`` in lane ``r``. ``last`` on an input word is carried to
    the block's final output beat
    (``last`` belongs on the final word of a block).

    Timing: a block's first beat is on ``o`` the cycle after its last word is taken; while one
    buffer empties the other fills, so a steady stream moves one word in and one beat out per
    cycle, with ``size + 1`` cycles of latency.

    Members
    -------
    i : ``In(stream.Signature(spad_word_layout(size)))``
    o : ``Out(stream.Signature(spad_word_layout(size)))``
    """

    def __init__(self, *, size):
        if not isinstance(size, int) or isinstance(size, bool) or size < 2:
            raise ValueError(f"Transposer size must be an integer of at least 2, not {size!r}")
        self._size = size
        super().__init__({
            "i": In(stream.Signature(spad_word_layout(size))),
            "o": Out(stream.Signature(spad_word_layout(size))),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._size
        block = data.ArrayLayout(data.ArrayLayout(signed(8), n), n)
        bufs = [Signal(block, name=f"buf{b}") for b in range(2)]
        full = [Signal(name=f"full{b}") for b in range(2)]
        lasts = [Signal(name=f"last{b}") for b in range(2)]
        wsel, rsel = Signal(), Signal()
        row, col = Signal(range(n)), Signal(range(n))

        # Fill side.
        m.d.comb += self.i.ready.eq(~full[0] & (wsel == 0) | ~full[1] & (wsel == 1))
        with m.If(self.i.valid & self.i.ready):
            for b in range(2):
                with m.If(wsel == b):
                    m.d.sync += bufs[b][row].eq(self.i.payload.data)
                    with m.If(row == n - 1):
                        m.d.sync += [full[b].eq(1), lasts[b].eq(self.i.payload.last)]
            with m.If(row == n - 1):
                m.d.sync += [row.eq(0), wsel.eq(~wsel)]
            with m.Else():
                m.d.sync += row.eq(row + 1)

        # Drain side: column `col` of the full buffer, combinationally selected.
        for b in range(2):
            with m.If(rsel == b):
                m.d.comb += self.o.valid.eq(full[b])
                for r in range(n):
                    m.d.comb += self.o.payload.data[r].eq(bufs[b][r][col])
                m.d.comb += self.o.payload.last.eq(lasts[b] & (col == n - 1))
        with m.If(self.o.valid & self.o.ready):
            with m.If(col == n - 1):
                m.d.sync += [col.eq(0), rsel.eq(~rsel)]
                for b in range(2):
                    with m.If(rsel == b):
                        m.d.sync += full[b].eq(0)
            with m.Else():
                m.d.sync += col.eq(col + 1)
        return m
