"""N whole chips on the ring: each chip's ring port to the next chip through a RingLink.

Unlike :class:`hw.system.RingSystem` (collective engines with test DMAs), every node here is a
:class:`~hw.tile.chip.Chip` running its own program; collectives are COLL launches.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from .ring.link import RingLink
from .spec import NpuConfig
from .spec.collective import MAX_CHIPS
from .spec.isa import INSN_BITS
from .tile.chip import Chip
from .tile.scratchpad import addr_layout

__all__ = ["ChipSystem"]


class ChipSystem(wiring.Component):
    """``chips`` :class:`Chip`\\ s on a ring: chip i's ``ring_tx`` -> link -> chip (i+1)'s
    ``ring_rx`` (``link_bytes_per_cycle`` wide, ``link_latency_cycles`` registers).

    Parameters (keyword-only): ``npu`` (every chip's configuration), ``chips`` (1..8).

    Members
    -------
    host_imem, host_wr, host_rd_addr, host_rd_data : arrays of ``chips`` ports
        Chip ``i``'s host port (:class:`Chip`), element ``i``.
    start : In(1)
        Starts every chip's program (from pc 0) in the same cycle.
    done : Out(1)
        Every chip has halted. ``error``: some chip halted on an error.
    cycles : Out(32)
        Cycles from the cycle after ``start`` to the cycle the last chip raised ``done``.
    chip_cycles : Out(32).array(chips)
        Each chip's own ``cycles``.
    """

    def __init__(self, *, npu: NpuConfig, chips: int):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        if not isinstance(chips, int) or isinstance(chips, bool) or not 1 <= chips <= MAX_CHIPS:
            raise ValueError(f"chips must be an integer 1..{MAX_CHIPS}, not {chips!r}")
        self.npu = npu
        self.chips = chips
        self.chip = [Chip(npu=npu) for _ in range(chips)]
        addr_bits = max(1, (npu.sram_words - 1).bit_length())
        word_bits = 8 * npu.word_bytes
        super().__init__({
            "start": In(1),
            "done": Out(1),
            "error": Out(1),
            "cycles": Out(32),
            "chip_cycles": Out(32).array(chips),
            "host_imem": In(stream.Signature(data.StructLayout(
                {"addr": range(npu.imem_words), "data": INSN_BITS}))).array(chips),
            "host_wr": In(stream.Signature(data.StructLayout(
                {"addr": addr_bits, "data": word_bits}))).array(chips),
            "host_rd_addr": In(stream.Signature(addr_layout(addr_bits))).array(chips),
            "host_rd_data": Out(stream.Signature(data.StructLayout(
                {"data": word_bits, "last": 1}))).array(chips),
        })

    def elaborate(self, platform):
        m = Module()
        npu = self.npu
        links = []
        for i, chip in enumerate(self.chip):
            m.submodules[f"chip{i}"] = chip
            link = RingLink(width_bytes=npu.link_bytes_per_cycle,
                            latency=npu.link_latency_cycles, word_bytes=chip._coll_bytes)
            m.submodules[f"link{i}"] = link
            links.append(link)
            connect(m, flipped(self.host_imem[i]), chip.host_imem)
            connect(m, flipped(self.host_wr[i]), chip.host_wr)
            connect(m, flipped(self.host_rd_addr[i]), chip.host_rd_addr)
            connect(m, chip.host_rd_data, flipped(self.host_rd_data[i]))
            m.d.comb += [chip.start.eq(self.start), self.chip_cycles[i].eq(chip.cycles),
                         link.stall.eq(0)]
        for i, chip in enumerate(self.chip):
            connect(m, chip.ring_tx, links[i].i)
            connect(m, links[i].o, self.chip[(i + 1) % self.chips].ring_rx)

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
