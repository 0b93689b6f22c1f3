"""The chip's trace buffer: when each unit was busy, for timelines and timing checks.

While the program runs, every cycle in which the chip's busy vector (one bit per unit,
``hw.spec.isa.Unit``) differs from the previous cycle's writes one entry ``{cycle, busy}``:
the vector from that cycle on. The first entry is the first cycle any unit is busy; busy
starts at 0 with ``start``. A unit's k-th busy interval is its k-th launch (a launch keeps its
unit busy until it is done, and the next launch of that unit waits for it), so the entries give
every launch's start and end cycle. At most ``depth`` entries: a program of L launches needs at
most 2L; ``count`` saturates at ``depth`` and ``overflow`` says entries were lost.

Members
-------
running : In(1)           the sequencer runs (entries are recorded only then)
start : In(1)             clear the buffer
cycle : In(32)            the sequencer's cycle counter
busy : In(UNIT_BITS)
rd_addr : In(range(depth)), rd_data : Out(entry)   read port, one cycle latency
count : Out(range(depth + 1)), overflow : Out(1)
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..spec.isa import UNIT_BITS

__all__ = ["entry_layout", "TraceBuffer"]


def entry_layout() -> data.StructLayout:
    return data.StructLayout({"cycle": 32, "busy": UNIT_BITS})


class TraceBuffer(wiring.Component):
    def __init__(self, *, depth: int):
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 2:
            raise ValueError(f"depth must be an integer of at least 2, not {depth!r}")
        self.depth = depth
        super().__init__({
            "running": In(1),
            "start": In(1),
            "cycle": In(32),
            "busy": In(UNIT_BITS),
            "rd_addr": In(range(depth)),
            "rd_data": Out(entry_layout()),
            "count": Out(range(depth + 1)),
            "overflow": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=entry_layout(), depth=self.depth, init=[])
        wp, rp = mem.write_port(), mem.read_port()
        prev = Signal(UNIT_BITS)
        change = self.running & (self.busy != prev)
        full = self.count == self.depth
        m.d.comb += [
            wp.addr.eq(self.count[:len(wp.addr)]),
            wp.data.eq(Cat(self.cycle, self.busy)),
            wp.en.eq(change & ~full),
            rp.addr.eq(self.rd_addr),
            self.rd_data.eq(rp.data),
        ]
        with m.If(self.start):
            m.d.sync += [prev.eq(0), self.count.eq(0), self.overflow.eq(0)]
        with m.Elif(change):
            m.d.sync += prev.eq(self.busy)
            with m.If(full):
                m.d.sync += self.overflow.eq(1)
            with m.Else():
                m.d.sync += self.count.eq(self.count + 1)
        return m
