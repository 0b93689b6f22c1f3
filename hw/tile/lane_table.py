"""A lookup table that every lane reads at once and a load writes a beat at a time.

One :class:`amaranth.lib.memory.Memory` with ``lanes`` write ports and ``lanes`` asynchronous
read ports cannot be block or distributed RAM: synthesis builds it from flip-flops and a
``depth``:1 multiplexer per lane and bit (for the vector unit's 256-entry GELU16 table on 8 lanes,
~22,000 LUT4 of multiplexers fanning out of 8,400 flip-flops: the congestion that kept the chip
from routing). :class:`LaneTable` keeps the same ports and timing but is ``lanes x lanes`` small
memories with one write port and one asynchronous read port each, which map to distributed RAM:
copy ``c`` serves lane ``c``'s reads, bank ``k`` of it holds the entries ``e`` with
``e mod lanes = k``. A load writes ``lanes`` consecutive entries per beat, one per bank, so each
bank takes one write per cycle; each lane reads all banks of its copy and selects one.

With ``sync=True`` the reads are registered (a read port with an enable) and each bank is block
RAM (``ram_style = "block"``: one ECP5 DP16KD of ``depth / lanes`` rows per bank, instead of
distributed RAM at six LUT4 slots per 16 x 4 bits).
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["LaneTable"]


class LaneTable(wiring.Component):
    """``depth`` entries of ``shape`` read by ``lanes`` lanes in the same cycle.

    Parameters (keyword-only): ``shape``, ``depth``, ``lanes``, ``init`` (``depth`` values or
    empty), ``offset``: lane ``j``'s write address is always ``j + offset`` modulo ``lanes``
    (a load writing entries ``base + j`` with ``base`` a multiple of ``lanes`` has offset 0).

    Timing: writes take effect at the clock edge (``w_en``), reads are combinational, exactly as
    a :class:`~amaranth.lib.memory.Memory` with ``lanes`` write ports and ``lanes`` read ports
    of domain ``"comb"``. With ``lanes`` not a power of two, or ``depth`` not a multiple of it,
    it is that memory. ``sync=True``: the read ports are synchronous with the enable ``r_en``
    (``r_data`` is the entry at the ``r_addr`` of the last cycle with ``r_en`` high, and holds
    while ``r_en`` is low; a read and a write of one entry in the same cycle read the old one).

    Members
    -------
    w_addr, w_data, w_en : ``In(...).array(lanes)``, lane j's write
    r_addr : ``In(range(depth)).array(lanes)``; r_data : ``Out(shape).array(lanes)``
    r_en : ``In(1)`` (``sync`` only)
    """

    def __init__(self, *, shape, depth, lanes, init=(), offset=0, sync=False):
        for name, value in (("depth", depth), ("lanes", lanes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        init = list(init)
        if init and len(init) != depth:
            raise ValueError(f"init has {len(init)} values, not depth={depth}")
        self._shape, self._depth, self._lanes = shape, depth, lanes
        self._init, self._offset = init, offset
        self.sync = bool(sync)
        self.banked = lanes > 1 and lanes & (lanes - 1) == 0 and depth % lanes == 0
        members = {
            "w_addr": In(range(depth)).array(lanes),
            "w_data": In(shape).array(lanes),
            "w_en": In(1).array(lanes),
            "r_addr": In(range(depth)).array(lanes),
            "r_data": Out(shape).array(lanes),
        }
        if self.sync:
            members["r_en"] = In(1)
        super().__init__(members)

    def _read_port(self, mem):
        if not self.sync:
            return mem.read_port(domain="comb")
        port = mem.read_port(domain="sync", transparent_for=())
        return port

    def elaborate(self, platform):
        m = Module()
        lanes, depth = self._lanes, self._depth
        if not self.banked:
            m.submodules.mem = mem = memory.Memory(shape=self._shape, depth=depth,
                                                   init=self._init)
            wps = [mem.write_port() for _ in range(lanes)]
            for j in range(lanes):
                wp, rp = wps[j], self._read_port(mem)
                m.d.comb += [wp.addr.eq(self.w_addr[j]), wp.data.eq(self.w_data[j]),
                             wp.en.eq(self.w_en[j]), rp.addr.eq(self.r_addr[j]),
                             self.r_data[j].eq(rp.data)]
                if self.sync:
                    m.d.comb += rp.en.eq(self.r_en)
            return m
        low = (lanes - 1).bit_length()
        rows = depth // lanes
        # The lane whose writes land in bank k.
        writer = {(j + self._offset) % lanes: j for j in range(lanes)}
        for c in range(lanes):
            words = []
            for k in range(lanes):
                init = self._init[k::lanes] if self._init else []
                attrs = {"ram_style": "block"} if self.sync else None
                mem = memory.Memory(shape=self._shape, depth=rows, init=init, attrs=attrs)
                m.submodules[f"copy{c}_bank{k}"] = mem
                j = writer[k]
                wp, rp = mem.write_port(), self._read_port(mem)
                m.d.comb += [wp.addr.eq(self.w_addr[j][low:]), wp.data.eq(self.w_data[j]),
                             wp.en.eq(self.w_en[j]), rp.addr.eq(self.r_addr[c][low:])]
                if self.sync:
                    m.d.comb += rp.en.eq(self.r_en)
                words.append(rp.data)
            bank = Signal(range(lanes), name=f"lane{c}_bank")
            if self.sync:
                # The bank of the address read last (the data's), held with the data.
                with m.If(self.r_en):
                    m.d.sync += bank.eq(self.r_addr[c][:low])
            else:
                m.d.comb += bank.eq(self.r_addr[c][:low])
            with m.Switch(bank):
                for k, word in enumerate(words):
                    with m.Case(k):
                        m.d.comb += self.r_data[c].eq(word)
        return m
