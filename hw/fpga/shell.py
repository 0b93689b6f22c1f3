"""A serial shell around a design whose ports outnumber a package's pins (``npu fpga``).

A bare unit has far more ports than the package has pins (the 8x8 matmul unit has ~800,
CABGA381 has 205 user I/Os), and nextpnr must put every top-level port on a pin. The shell
gives the design four pins and a clock: every input port bit is driven from a shift register
loaded a byte per cycle, every output port bit is captured into a shift register read a byte per
cycle. Nothing is optimised away (every output bit is observable, every input bit controllable)
and the design's ports start and end at flip-flops, as they do inside the chip.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SerialShell"]


def _byte_ceil(bits):
    return max(8, (bits + 7) // 8 * 8)


class SerialShell(wiring.Component):
    """Wrap ``design`` so that its ports fit a package: one byte in, one byte out.

    All of ``design``'s input port bits (flattened in signature order) are the low bits of an
    input shift register that takes ``si`` into its top byte and shifts down by 8 on every
    cycle with ``si_en``. All of its output port bits are loaded into an output shift register
    on a cycle with ``capture`` and shift down by 8 otherwise; ``so`` is its low byte. The three
    control inputs are registered once, so that no pad drives the design's logic directly.

    Members
    -------
    si : ``In(8)``
    si_en : ``In(1)``
    capture : ``In(1)``
    so : ``Out(8)``
    """

    def __init__(self, design):
        if not isinstance(design, wiring.Component):
            raise TypeError(f"design must be a wiring.Component, not {design!r}")
        self._design = design
        self._inputs, self._outputs = [], []
        for _path, member, value in design.signature.flatten(design):
            (self._inputs if member.flow == In else self._outputs).append(Value.cast(value))
        super().__init__({"si": In(8), "si_en": In(1), "capture": In(1), "so": Out(8)})

    @property
    def in_bits(self):
        """Input port bits of the wrapped design."""
        return sum(len(v) for v in self._inputs)

    @property
    def out_bits(self):
        """Output port bits of the wrapped design."""
        return sum(len(v) for v in self._outputs)

    @property
    def shell_ffs(self):
        """Flip-flops the shell adds: both shift registers and the registered controls."""
        return _byte_ceil(self.in_bits) + _byte_ceil(self.out_bits) + 8 + 2

    def elaborate(self, platform):
        m = Module()
        m.submodules.design = self._design

        si, si_en, capture = Signal(8), Signal(), Signal()
        m.d.sync += [si.eq(self.si), si_en.eq(self.si_en), capture.eq(self.capture)]

        sr_in = Signal(_byte_ceil(self.in_bits))
        with m.If(si_en):
            m.d.sync += sr_in.eq(Cat(sr_in[8:], si))
        if self._inputs:
            m.d.comb += Cat(*self._inputs).eq(sr_in[:self.in_bits])

        sr_out = Signal(_byte_ceil(self.out_bits))
        with m.If(capture):
            m.d.sync += sr_out.eq(Cat(*self._outputs))
        with m.Else():
            m.d.sync += sr_out.eq(sr_out[8:])
        m.d.comb += self.so.eq(sr_out[:8])
        return m
