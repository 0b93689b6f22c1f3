"""N whole chips on the ring: each chip's ring port to the next chip through a RingLink.

Every node is a :class:`~hw.chip.Chip` running its own program from its own sequencer;
collectives are COLL launches. (The collective engines alone, with test DMAs in place of chips,
are :class:`hw.ring.testbed.RingTestbed`.)
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from .chip import Chip
from .ring.link import RingLink
from .spec import NpuConfig
from .spec.collective import check_chips
from .spec.isa import BUSY_COUNTERS, UNIT_BITS
from .spec.ring import TAG_BITS
from .tile.ports import HostSignature

__all__ = ["ChipSystem"]


class ChipSystem(wiring.Component):
    """``chips`` :class:`Chip`\\ s on a ring: chip i's ``ring.tx`` -> link -> chip (i+1)'s
    ``ring.rx`` (``link_bytes_per_cycle`` wide, ``link_latency_cycles`` registers).

    Parameters (keyword-only): ``npu`` (every chip's configuration), ``chips`` (1..8).

    Members
    -------
    host : In(HostSignature(npu)).array(chips)
        Chip ``i``'s host port (:class:`~hw.tile.ports.HostSignature`), element ``i``.
    start : In(1)
        Starts every chip's program (from pc 0) in the same cycle.
    done : Out(1)
        Every chip has halted. ``error``: some chip halted on an error.
    cycles : Out(32)
        Cycles from the cycle after ``start`` to the cycle the last chip raised ``done``.
    chip_cycles : Out(32).array(chips)
        Each chip's own ``cycles``.
    chip_busy : Out(UNIT_BITS).array(chips), chip_pc : Out(16).array(chips)
        Each chip's busy units and pc (what a watchdog reports).
    chip_done, chip_error : Out(chips)
    chip_busy_cycles : Out(32).array(chips * len(BUSY_COUNTERS))
        Chip i's counter k (``hw.spec.isa.BUSY_COUNTERS``) at ``i * len(BUSY_COUNTERS) + k``.
    link_stall : In(chips * link_latency_cycles)
        Fault injection: bit ``i * latency + k`` refuses transfers into register ``k`` of the
        link from chip i (tie to 0).

    ``coll_avg=False``: the chips' collective engines without AVG's divider (an FPGA build;
    :class:`~hw.chip.Chip`).
    """

    def __init__(self, *, npu: NpuConfig, chips: int, coll_avg: bool = True):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        check_chips(chips)
        self.npu = npu
        self.chips = chips
        self.chip = [Chip(npu=npu, coll_avg=coll_avg) for _ in range(chips)]
        super().__init__({
            "start": In(1),
            "done": Out(1),
            "error": Out(1),
            "cycles": Out(32),
            "chip_cycles": Out(32).array(chips),
            "chip_busy": Out(UNIT_BITS).array(chips),
            "chip_pc": Out(16).array(chips),
            "chip_done": Out(chips),
            "chip_error": Out(chips),
            "chip_busy_cycles": Out(32).array(chips * len(BUSY_COUNTERS)),
            "link_stall": In(chips * npu.link_latency_cycles),
            "host": In(HostSignature(npu)).array(chips),
        })

    def elaborate(self, platform):
        m = Module()
        npu = self.npu
        links = []
        for i, chip in enumerate(self.chip):
            m.submodules[f"chip{i}"] = chip
            lat = npu.link_latency_cycles
            link = RingLink(width_bytes=npu.link_bytes_per_cycle, latency=lat,
                            word_bytes=chip.ring_word_bytes, tag_bits=TAG_BITS)
            m.submodules[f"link{i}"] = link
            links.append(link)
            connect(m, flipped(self.host[i]), chip.host)
            m.d.comb += [chip.start.eq(self.start), chip.chip_id.eq(i),
                         self.chip_cycles[i].eq(chip.cycles), self.chip_busy[i].eq(chip.busy),
                         self.chip_pc[i].eq(chip.pc), self.chip_done[i].eq(chip.done),
                         self.chip_error[i].eq(chip.error),
                         link.stall.eq(self.link_stall[i * lat:(i + 1) * lat])]
            for k in range(len(BUSY_COUNTERS)):
                m.d.comb += self.chip_busy_cycles[i * len(BUSY_COUNTERS) + k].eq(
                    chip.busy_cycles[k])
        for i, chip in enumerate(self.chip):
            connect(m, chip.ring.tx, links[i].i)
            connect(m, links[i].o, self.chip[(i + 1) % self.chips].ring.rx)

        all_done = Cat(*[c.done for c in self.chip]).all()
        running = Signal()
        m.d.comb += [self.done.eq(all_done),
                     self.error.eq(Cat(*[c.error for c in self.chip]).any())]
        with m.If(self.start):
            m.d.sync += [running.eq(1), self.cycles.eq(0)]
        with m.Elif(running):
            with m.If(all_done):
                m.d.sync += running.eq(0)
            with m.Else():
                m.d.sync += self.cycles.eq(self.cycles + 1)
        return m
