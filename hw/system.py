"""N whole chips on the ring: each chip's ring port to the next chip through a RingLink.

A :class:`ChipNode` is one :class:`~hw.chip.Chip` with the :class:`~hw.ring.link.RingLink` that
leaves it; :class:`ChipSystem` joins N nodes, each node's ``ring.tx`` to the next one's
``ring.rx``. Every chip runs its own program from its own sequencer; collectives are COLL
launches. (The collective engines alone, with test DMAs in place of chips, are
:class:`hw.ring.testbed.RingTestbed`.)
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from .chip import Chip
from .ring.link import RingLink
from .spec import NpuConfig
from .spec.isa import BUSY_COUNTERS, UNIT_BITS
from .spec.ring import TAG_BITS, check_rtl_chips
from .tile.ports import HostSignature

__all__ = ["ChipNode", "ChipSystem"]


class ChipNode(wiring.Component):
    """One :class:`~hw.chip.Chip` and its outgoing :class:`~hw.ring.link.RingLink`: the chip's
    ``ring.tx`` through the link is the node's ``ring.tx``; ``ring.rx`` is the chip's.

    The unit that the Verilator backend builds once and instantiates N times
    (``sim/rtl/verilator/``): nothing in it depends on the chip count, and its ring port is cut
    at registers. ``ring.tx.valid`` and ``ring.tx.payload`` are the link's registers (its last
    pipeline register and, for words of several flits, its deserialiser), and
    ``ring.tx.ready`` reaches only the link's registers' next state. So a ring of nodes has no
    combinational path from one node to another but ``ring.rx`` -> ``ring.rx.ready`` within
    the receiving chip (its router: :class:`~hw.ring.router.Router`).

    Parameters (keyword-only): ``npu``; ``coll_avg`` as :class:`~hw.chip.Chip`'s.

    Members
    -------
    host : In(HostSignature(npu))
        The chip's host port.
    start, chip_id : In(1), In(CHIP_BITS)
        The chip's ``start`` and ring position.
    ring : Out(RingPortSignature(npu.ring_word_bytes))
        ``tx``: the link's far end (to the next node's ``rx``); ``rx``: the chip's receiver.
    link_stall : In(link_latency_cycles)
        The link's fault injection (:class:`~hw.ring.link.RingLink`'s ``stall``; tie to 0).
    done, error, cycles, busy, pc, busy_cycles
        The chip's.
    """

    def __init__(self, *, npu: NpuConfig, coll_avg: bool = True, pe_dsp: bool = False):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        self.npu = npu
        self.chip = Chip(npu=npu, coll_avg=coll_avg, pe_dsp=pe_dsp)
        # The chip's own ports (the ring's tx now the link's far end: the same signature),
        # and the link's fault injection.
        super().__init__({**dict(self.chip.signature.members),
                          "link_stall": In(npu.link_latency_cycles)})

    def elaborate(self, platform):
        m = Module()
        npu = self.npu
        m.submodules.chip = chip = self.chip
        m.submodules.link = link = RingLink(
            width_bytes=npu.link_bytes_per_cycle, latency=npu.link_latency_cycles,
            word_bytes=chip.ring_word_bytes, tag_bits=TAG_BITS)
        connect(m, flipped(self.host), chip.host)
        connect(m, chip.ring.tx, link.i)
        connect(m, link.o, flipped(self.ring.tx))
        connect(m, flipped(self.ring.rx), chip.ring.rx)
        m.d.comb += [chip.start.eq(self.start), chip.chip_id.eq(self.chip_id),
                     link.stall.eq(self.link_stall),
                     self.done.eq(chip.done), self.error.eq(chip.error),
                     self.cycles.eq(chip.cycles), self.busy.eq(chip.busy), self.pc.eq(chip.pc)]
        for mine, its in zip(self.busy_cycles, chip.busy_cycles, strict=True):
            m.d.comb += mine.eq(its)
        return m


class ChipSystem(wiring.Component):
    """``chips`` :class:`ChipNode`\\ s on a ring: chip i's ``ring.tx`` -> its link -> chip
    (i+1)'s ``ring.rx`` (``link_bytes_per_cycle`` wide, ``link_latency_cycles`` registers).

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
        check_rtl_chips(chips)
        self.npu = npu
        self.chips = chips
        self.node = [ChipNode(npu=npu, coll_avg=coll_avg) for _ in range(chips)]
        self.chip = [node.chip for node in self.node]
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
        lat = self.npu.link_latency_cycles
        k = len(BUSY_COUNTERS)
        for i, node in enumerate(self.node):
            m.submodules[f"node{i}"] = node
            connect(m, flipped(self.host[i]), node.host)
            m.d.comb += [node.start.eq(self.start), node.chip_id.eq(i),
                         self.chip_cycles[i].eq(node.cycles), self.chip_busy[i].eq(node.busy),
                         self.chip_pc[i].eq(node.pc), self.chip_done[i].eq(node.done),
                         self.chip_error[i].eq(node.error),
                         node.link_stall.eq(self.link_stall[i * lat:(i + 1) * lat])]
            for j in range(k):
                m.d.comb += self.chip_busy_cycles[i * k + j].eq(node.busy_cycles[j])
        for i, node in enumerate(self.node):
            connect(m, node.ring.tx, self.node[(i + 1) % self.chips].ring.rx)

        all_done = Cat(*[n.done for n in self.node]).all()
        running = Signal()
        m.d.comb += [self.done.eq(all_done),
                     self.error.eq(Cat(*[n.error for n in self.node]).any())]
        with m.If(self.start):
            m.d.sync += [running.eq(1), self.cycles.eq(0)]
        with m.Elif(running):
            with m.If(all_done):
                m.d.sync += running.eq(0)
            with m.Else():
                m.d.sync += self.cycles.eq(self.cycles + 1)
        return m
