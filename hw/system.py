"""Whole chips on a ring or a torus: each chip's ring ports to the next chips through RingLinks.

A :class:`ChipNode` is one :class:`~hw.chip.Chip` with the :class:`~hw.ring.link.RingLink`\\ s
that leave it (one per dimension); :class:`ChipSystem` joins the nodes of a
:class:`~hw.spec.topology.Topology`: on a ring of N, node i's ``ring.tx`` to node i + 1's
``ring.rx``; on an X x Y torus, node (x, y)'s ``ring.tx`` to node (x + 1, y)'s ``ring.rx``
(its row) and its ``ring_y.tx`` to node (x, y + 1)'s ``ring_y.rx`` (its column), modulo the
dimensions. Every chip runs its own program from its own sequencer; collectives are COLL
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
from .spec.ring import NODE_CHIP_BITS, tag_bits
from .spec.topology import DimLink, Topology, chip_bits
from .tile.ports import HostSignature

__all__ = ["ChipNode", "ChipSystem"]


class ChipNode(wiring.Component):
    """One :class:`~hw.chip.Chip` and its outgoing :class:`~hw.ring.link.RingLink`\\ s: the
    chip's ``ring.tx`` through dimension 0's link is the node's ``ring.tx`` (and, on a torus,
    its ``ring_y.tx`` through dimension 1's link the node's ``ring_y.tx``); the ``rx`` ports
    are the chip's.

    The unit that the Verilator backend builds once and instantiates N times
    (``sim/rtl/verilator/``): nothing in it depends on the chip count, and its ring ports are
    cut at registers. Each ``tx.valid`` and ``tx.payload`` are its link's registers (its last
    pipeline register and, for words of several flits, its deserialiser), and ``tx.ready``
    reaches only the link's registers' next state. So a system of nodes has no combinational
    path from one node to another but ``rx`` -> ``rx.ready`` within the receiving chip (its
    router: :class:`~hw.ring.router.Router`).

    Parameters (keyword-only): ``npu``; ``coll_avg``, ``pe_dsp`` and ``ecp5_dsp`` as
    :class:`~hw.chip.Chip`'s;
    ``chip_bits`` (default :data:`hw.spec.ring.NODE_CHIP_BITS`: any system up to 1,024 chips);
    ``links``: one :class:`~hw.spec.topology.DimLink` per dimension (default: a ring's chip
    with the NPU's ``link_*``; two: a torus's chip).

    Members
    -------
    host : In(HostSignature(npu))
        The chip's host port.
    start, chip_id : In(1), In(chip_bits)
        The chip's ``start`` and id; on a torus ``row_first``, ``row_last`` its row's ids.
    ring, ring_y : Out(RingPortSignature(npu.ring_word_bytes, chip_bits))
        ``tx``: the link's far end (to the next node's ``rx`` along the dimension); ``rx``: the
        chip's receiver.
    link_stall, link_stall_y : In(latency of the dimension's link)
        The links' fault injection (:class:`~hw.ring.link.RingLink`'s ``stall``; tie to 0).
    done, error, cycles, busy, pc, busy_cycles
        The chip's.
    """

    def __init__(self, *, npu: NpuConfig, coll_avg: bool = True, pe_dsp: bool = False,
                 chip_bits: int | None = None, links: tuple[DimLink, ...] | None = None,
                 ecp5_dsp: bool = False):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        links = tuple(links) if links is not None else (
            DimLink(npu.link_bytes_per_cycle, npu.link_latency_cycles),)
        if len(links) not in (1, 2) or not all(isinstance(x, DimLink) for x in links):
            raise ValueError(f"links must be one or two DimLink (a ring's or a torus's chip), "
                             f"not {links!r}")
        for dim, link in enumerate(links):
            if npu.ring_word_bytes % link.bytes_per_cycle:
                raise ValueError(f"dimension {dim}'s link_bytes_per_cycle="
                                 f"{link.bytes_per_cycle} does not divide the chip's ring word "
                                 f"of {npu.ring_word_bytes} bytes")
        self.npu = npu
        self.links = links
        self.chip = Chip(npu=npu, coll_avg=coll_avg, pe_dsp=pe_dsp,
                         chip_bits=NODE_CHIP_BITS if chip_bits is None else chip_bits,
                         dims=len(links), ecp5_dsp=ecp5_dsp)
        # The chip's own ports (each ring's tx now its link's far end: the same signature),
        # and the links' fault injection.
        extra = {"link_stall": In(links[0].latency_cycles)}
        if len(links) == 2:
            extra["link_stall_y"] = In(links[1].latency_cycles)
        super().__init__({**dict(self.chip.signature.members), **extra})

    def elaborate(self, platform):
        m = Module()
        m.submodules.chip = chip = self.chip
        connect(m, flipped(self.host), chip.host)
        ports = [("ring", "link_stall")] + ([("ring_y", "link_stall_y")]
                                            if len(self.links) == 2 else [])
        for (port, stall), link_cfg in zip(ports, self.links, strict=True):
            link = RingLink(width_bytes=link_cfg.bytes_per_cycle,
                            latency=link_cfg.latency_cycles, word_bytes=chip.ring_word_bytes,
                            tag_bits=tag_bits(chip.chip_bits))
            m.submodules["link" if port == "ring" else "link_y"] = link
            connect(m, getattr(chip, port).tx, link.i)
            connect(m, link.o, flipped(getattr(self, port).tx))
            connect(m, flipped(getattr(self, port).rx), getattr(chip, port).rx)
            m.d.comb += link.stall.eq(getattr(self, stall))
        m.d.comb += [chip.start.eq(self.start), chip.chip_id.eq(self.chip_id),
                     self.done.eq(chip.done), self.error.eq(chip.error),
                     self.cycles.eq(chip.cycles), self.busy.eq(chip.busy), self.pc.eq(chip.pc)]
        if len(self.links) == 2:
            m.d.comb += [chip.row_first.eq(self.row_first), chip.row_last.eq(self.row_last)]
        for mine, its in zip(self.busy_cycles, chip.busy_cycles, strict=True):
            m.d.comb += mine.eq(its)
        return m


class ChipSystem(wiring.Component):
    """The :class:`ChipNode`\\ s of a ring or a torus (``hw.spec.topology``), each chip's
    ``ring.tx`` -> its link -> the next chip's ``ring.rx`` along its row (the ring), and on a
    torus each ``ring_y.tx`` -> its link -> the next chip's ``ring_y.rx`` along its column.

    Parameters (keyword-only): ``npu`` (every chip's configuration) and ``chips`` (a ring of
    1..1,024) or ``topology`` (a :class:`~hw.spec.topology.Topology`: a ring or an X x Y torus,
    its links per dimension, default the NPU's). Chip ids are
    :func:`~hw.spec.topology.chip_bits` of the system's chips.

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
    link_stall : In(sum over the dimensions of chips * latency)
        Fault injection: bit ``i * a0 + k`` refuses transfers into register ``k`` of the
        dimension-0 link from chip i (``a0`` its latency); on a torus bit ``chips * a0 + i * a1
        + k`` the same for chip i's dimension-1 link (tie to 0).

    ``coll_avg=False``: the chips' collective engines without AVG's divider (an FPGA build;
    :class:`~hw.chip.Chip`).
    """

    def __init__(self, *, npu: NpuConfig, chips: int | None = None,
                 topology: Topology | None = None, coll_avg: bool = True):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        if topology is None:
            if chips is None:
                raise TypeError("ChipSystem needs chips= (a ring) or topology=")
            topology = Topology.ring(chips)
        elif not isinstance(topology, Topology):
            raise TypeError(f"topology must be a Topology, not {topology!r}")
        elif chips is not None and chips != topology.chips:
            raise ValueError(f"chips={chips} is not the {topology.chips} chips of the {topology}")
        chips = topology.chips
        self.npu = npu
        self.topology = topology
        self.chips = chips
        self.links = tuple(topology.link(d, npu) for d in range(len(topology.dims)))
        bits = chip_bits(chips)
        self.node = [ChipNode(npu=npu, coll_avg=coll_avg, chip_bits=bits, links=self.links)
                     for _ in range(chips)]
        self.chip = [node.chip for node in self.node]
        self.stall_bits = chips * sum(link.latency_cycles for link in self.links)
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
            "link_stall": In(self.stall_bits),
            "host": In(HostSignature(npu)).array(chips),
        })

    def elaborate(self, platform):
        m = Module()
        topo = self.topology
        lat = [link.latency_cycles for link in self.links]
        k = len(BUSY_COUNTERS)
        n = self.chips
        for i, node in enumerate(self.node):
            m.submodules[f"node{i}"] = node
            connect(m, flipped(self.host[i]), node.host)
            m.d.comb += [node.start.eq(self.start), node.chip_id.eq(i),
                         self.chip_cycles[i].eq(node.cycles), self.chip_busy[i].eq(node.busy),
                         self.chip_pc[i].eq(node.pc), self.chip_done[i].eq(node.done),
                         self.chip_error[i].eq(node.error),
                         node.link_stall.eq(self.link_stall[i * lat[0]:(i + 1) * lat[0]])]
            if topo.is_torus:
                row = topo.row(topo.coords(i)[1])
                base = n * lat[0]
                m.d.comb += [node.row_first.eq(row[0]), node.row_last.eq(row[-1]),
                             node.link_stall_y.eq(
                                 self.link_stall[base + i * lat[1]:base + (i + 1) * lat[1]])]
            for j in range(k):
                m.d.comb += self.chip_busy_cycles[i * k + j].eq(node.busy_cycles[j])
        for i, node in enumerate(self.node):
            if topo.is_torus:
                x, y = topo.coords(i)
                east = topo.chip_at((x + 1) % topo.dims[0], y)
                south = topo.chip_at(x, (y + 1) % topo.dims[1])
                connect(m, node.ring.tx, self.node[east].ring.rx)
                connect(m, node.ring_y.tx, self.node[south].ring_y.rx)
            else:
                connect(m, node.ring.tx, self.node[(i + 1) % n].ring.rx)

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
