"""The ring testbed: N collective engines, each with a test DMA instead of a chip, on a ring.

The collective engine's own tests, ``npu collective`` and the collective benchmarks simulate
it: it isolates the engines and the links from the rest of the chip. Whole chips on the ring
are :class:`hw.system.ChipSystem`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..layouts import ring_word_layout
from ..spec import NpuConfig
from ..spec.collective import LENGTH_BITS, MAX_CHIPS, word_bytes
from ..spec.ring import check_rtl_chips
from .collective import CollectiveEngine
from .link import RingLink

__all__ = ["StreamDma", "RingTestbed", "testbed_command_layout"]


def testbed_command_layout(chips: int) -> data.StructLayout:
    """The command of a testbed of ``chips``: an engine's
    (:func:`hw.ring.collective.command_layout`) for a group of ``count`` consecutive chips
    from ``first`` on the ring of ``chips``; each engine gets it with its group rank."""
    return data.StructLayout({
        "kind": unsigned(3), "op": unsigned(2), "wide": unsigned(1),
        "length": unsigned(LENGTH_BITS), "block": unsigned(LENGTH_BITS),
        "longer": range(chips), "chips": range(chips + 1),
        "first": range(chips), "count": range(chips + 1),
        "chunks": unsigned(16), "in_place": unsigned(1), "divisor": range(MAX_CHIPS + 1),
    })


class StreamDma(wiring.Component):
    """A chip's test DMA: two word buffers streamed in order (no address generation).

    The host fills ``in_mem`` with the words the engine's local input stream must deliver, in
    stream order (:func:`hw.spec.collective.pack_blocks` of
    :func:`~hw.spec.collective.local_blocks`), and reads the output stream's words back from
    ``out_mem`` at addresses 0, 1, ...

    Members
    -------
    o_local : Out(stream.Signature(ring_word_layout(word_bytes)))
        ``in_mem[0]``, ``in_mem[1]``, ... from the cycle after ``start``; reads ahead freely.
    i_local : In(stream.Signature(ring_word_layout(word_bytes)))
        Written to ``out_mem[0]``, ``out_mem[1]``, ...; always ready unless ``stall``.
    start : In(1)
        Restart both streams at address 0.
    stall : In(1)
        Fault injection: no new read is issued (a gap in ``o_local.valid``) and ``i_local``
        is not ready.
    host_addr, host_wdata, host_we, host_rdata :
        Host port: write ``in_mem`` and read ``out_mem`` (one cycle read latency).
    """

    def __init__(self, *, word_bytes: int, depth: int):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self.word_bytes = word_bytes
        self.depth = depth
        layout = ring_word_layout(word_bytes)
        self.in_mem = memory.Memory(shape=word_bytes * 8, depth=depth, init=[])
        self.out_mem = memory.Memory(shape=word_bytes * 8, depth=depth, init=[])
        super().__init__({
            "o_local": Out(stream.Signature(layout)),
            "i_local": In(stream.Signature(layout)),
            "start": In(1),
            "stall": In(1),
            "host_addr": In(range(depth)),
            "host_wdata": In(word_bytes * 8),
            "host_we": In(1),
            "host_rdata": Out(word_bytes * 8),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.in_mem = self.in_mem
        m.submodules.out_mem = self.out_mem

        host_w = self.in_mem.write_port()
        m.d.comb += [host_w.addr.eq(self.host_addr), host_w.data.eq(self.host_wdata),
                     host_w.en.eq(self.host_we)]
        host_r = self.out_mem.read_port()
        m.d.comb += [host_r.addr.eq(self.host_addr), self.host_rdata.eq(host_r.data)]

        # Read stream: a read is issued whenever the output register is free or being emptied.
        rd = self.in_mem.read_port()
        raddr = Signal(range(self.depth))
        valid = Signal()
        fetch = Signal()
        m.d.comb += [
            fetch.eq((~valid | self.o_local.ready) & ~self.stall),
            rd.addr.eq(raddr),
            rd.en.eq(fetch),
            self.o_local.valid.eq(valid),
            self.o_local.payload.data.eq(rd.data),
            self.o_local.payload.last.eq(0),
        ]
        with m.If(self.start):
            m.d.sync += [raddr.eq(0), valid.eq(0)]
        with m.Elif(fetch):
            m.d.sync += [raddr.eq(raddr + 1), valid.eq(1)]
        with m.Elif(self.o_local.ready):
            m.d.sync += valid.eq(0)

        wr = self.out_mem.write_port()
        waddr = Signal(range(self.depth))
        m.d.comb += [
            self.i_local.ready.eq(~self.stall),
            wr.addr.eq(waddr),
            wr.data.eq(self.i_local.payload.data),
            wr.en.eq(self.i_local.valid & self.i_local.ready),
        ]
        with m.If(self.start):
            m.d.sync += waddr.eq(0)
        with m.Elif(wr.en):
            m.d.sync += waddr.eq(waddr + 1)
        return m


class RingTestbed(wiring.Component):
    """``chips`` collective engines on a ring, each with a :class:`StreamDma`.

    With ``npu.link_bidirectional`` every chip has a second engine and DMA on a reverse ring
    (chip ``i`` to chip ``i - 1``), which runs ``rev_cmd``: the host splits an all-reduce in
    two (:func:`hw.spec.collective.bidirectional_split`: the first ``length - length // 2``
    elements around the forward ring, the rest around the reverse ring), which halves the
    bandwidth term. The reverse engines see the reverse ring as a forward one: chip ``i`` has
    rank ``chips - 1 - i`` there. Other kinds use the forward ring only.

    Parameters (keyword-only)
    -------------------------
    npu : NpuConfig
        Gives the link width (``link_bytes_per_cycle``, a power of two), latency and
        ``link_bidirectional``.
    chips : int
        Ring size, 1..1,024.
    buffer_words : int
        Depth of each DMA's input and output buffers, in words of ``max(2B, 8)`` bytes.
    fifo_words : int
        Each engine's receive and transmit buffers (:class:`~hw.ring.collective.CollectiveEngine`).
    avg : bool
        The engines' AVG divider (``CollectiveEngine``'s ``avg``; an FPGA build leaves it out).

    Members
    -------
    cmd : In(testbed_command_layout(chips))
        The collective; every engine receives it with its group rank.
    rev_cmd : In(testbed_command_layout(chips))
        The reverse ring's collective (bidirectional rings; ``count`` 0: none), in the
        reverse ring's positions.
    start : In(1)
        Pulse for one cycle to issue ``cmd`` to every engine (they must be idle) and restart
        the DMAs.
    start_chip : In(chips)
        The same for single chips: bit ``i`` issues ``cmd`` to chip ``i`` only (chips joining a
        collective at different times; words sent to a chip that has not started wait in its
        receive buffer).
    busy : Out(1)
        High from the cycle after ``start`` until every engine is idle again.
    cycles : Out(32)
        Cycles from the first ``start`` (or ``start_chip``) cycle to the last cycle in which an
        engine is busy.
    stall : In(rings * chips * latency)
        Fault injection on the links: bit ``(r * chips + i) * latency + k`` stalls register
        ``k`` of the link leaving chip ``i`` on ring ``r`` (0 forward, 1 reverse).
    dma_stall : In(rings * chips)
        Fault injection on the local streams of DMA ``r * chips + i``.
    host_ring, host_chip, host_addr, host_wdata, host_we, host_rdata :
        Host port of DMA ``host_chip`` of ring ``host_ring`` (write its input buffer, read its
        output buffer one cycle later).
    """

    def __init__(self, *, npu: NpuConfig, chips: int, buffer_words: int = 256,
                 fifo_words: int = 256, avg: bool = True):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        check_rtl_chips(chips)
        if not isinstance(buffer_words, int) or buffer_words < 1:
            raise ValueError(f"buffer_words must be a positive integer, not {buffer_words!r}")
        self.npu = npu
        self.chips = chips
        self.latency = npu.link_latency_cycles
        self.link_bytes = npu.link_bytes_per_cycle
        self.word_bytes = word_bytes(self.link_bytes)
        self.bidirectional = bool(npu.link_bidirectional)
        self.rings = 2 if self.bidirectional else 1
        self.buffer_words = buffer_words
        self.fifo_words = fifo_words

        def ring():
            engines = [CollectiveEngine(link_bytes=self.link_bytes, fifo_words=fifo_words,
                                        avg=avg, max_count=chips) for _ in range(chips)]
            dmas = [StreamDma(word_bytes=self.word_bytes, depth=buffer_words)
                    for _ in range(chips)]
            links = [RingLink(width_bytes=self.link_bytes, latency=self.latency,
                              word_bytes=self.word_bytes) for _ in range(chips)]
            return engines, dmas, links

        self.engines, self.dmas, self.links = ring()
        self.rev_engines, self.rev_dmas, self.rev_links = ring() if self.bidirectional \
            else ([], [], [])
        super().__init__({
            "cmd": In(testbed_command_layout(chips)),
            "rev_cmd": In(testbed_command_layout(chips)),
            "start": In(1),
            "start_chip": In(chips),
            "busy": Out(1),
            "cycles": Out(32),
            "stall": In(self.rings * chips * self.latency),
            "dma_stall": In(self.rings * chips),
            "host_ring": In(1),
            "host_chip": In(range(chips)),
            "host_addr": In(range(buffer_words)),
            "host_wdata": In(self.word_bytes * 8),
            "host_we": In(1),
            "host_rdata": Out(self.word_bytes * 8),
        })

    def elaborate(self, platform):
        m = Module()
        a, n = self.latency, self.chips
        cmd = self.cmd

        rings = [(self.engines, self.dmas, self.links, 0)]
        if self.bidirectional:
            rings.append((self.rev_engines, self.rev_dmas, self.rev_links, 1))
        busy = []
        for engines, dmas, links, r in rings:
            ring_cmd = cmd if r == 0 else self.rev_cmd
            for i, (engine, dma, link) in enumerate(zip(engines, dmas, links, strict=True)):
                name = f"{'rev_' if r else ''}{{}}{i}"
                m.submodules[name.format("engine")] = engine
                m.submodules[name.format("dma")] = dma
                m.submodules[name.format("link")] = link
                wiring.connect(m, dma.o_local, engine.i_local)
                wiring.connect(m, engine.o_local, dma.i_local)
                wiring.connect(m, engine.o_tx, link.i)
                go = self.start | self.start_chip[i]
                if r == 1:
                    go = go & (ring_cmd.count != 0)
                # This chip's position on the ring (i on the forward ring, n - 1 - i on the
                # reverse one) relative to the group's first chip, modulo the ring.
                where = i if r == 0 else n - 1 - i
                diff = Signal(range(-n, max(n, 2)), name=name.format("diff"))
                pos = Signal(range(max(n, 2)), name=name.format("pos"))
                m.d.comb += [
                    diff.eq(where - ring_cmd.first),
                    pos.eq(Mux(diff < 0, diff + ring_cmd.chips, diff)),
                ]
                payload = engine.i_cmd.payload
                m.d.comb += [
                    payload.kind.eq(ring_cmd.kind), payload.op.eq(ring_cmd.op),
                    payload.wide.eq(ring_cmd.wide), payload.length.eq(ring_cmd.length),
                    payload.block.eq(ring_cmd.block), payload.longer.eq(ring_cmd.longer),
                    payload.count.eq(ring_cmd.count), payload.chunks.eq(ring_cmd.chunks),
                    payload.in_place.eq(ring_cmd.in_place),
                    payload.divisor.eq(ring_cmd.divisor),
                    payload.rank.eq(Mux(pos < ring_cmd.count, pos, ring_cmd.count)),
                ]
                lane = r * n + i
                m.d.comb += [
                    engine.i_cmd.valid.eq(go),
                    dma.start.eq(go),
                    dma.stall.eq(self.dma_stall[lane]),
                    link.stall.eq(self.stall[lane * a:(lane + 1) * a]),
                    dma.host_addr.eq(self.host_addr),
                    dma.host_wdata.eq(self.host_wdata),
                    dma.host_we.eq(self.host_we & (self.host_chip == i) & (self.host_ring == r)),
                ]
                busy.append(engine.busy)
            # Forward ring: chip i -> i + 1. Reverse ring: chip i -> i - 1.
            for i in range(n):
                to = (i + 1) % n if r == 0 else (i - 1) % n
                wiring.connect(m, links[i].o, engines[to].i_rx)

        sel = Signal(range(self.rings * n))
        m.d.sync += sel.eq(self.host_ring * n + self.host_chip)
        with m.Switch(sel):
            for lane, dma in enumerate(self.dmas + self.rev_dmas):
                with m.Case(lane):
                    m.d.comb += self.host_rdata.eq(dma.host_rdata)

        any_busy = Signal()
        m.d.comb += any_busy.eq(Cat(*busy).any())
        active = Signal()
        m.d.comb += self.busy.eq(active)
        any_start = self.start | self.start_chip.any()
        with m.If(any_start & ~active):
            m.d.sync += [active.eq(1), self.cycles.eq(1)]
        with m.Elif(active):
            with m.If(any_busy | any_start):
                m.d.sync += self.cycles.eq(self.cycles + 1)
            with m.Else():
                m.d.sync += active.eq(0)
        return m
