"""One NPU chip: sequencer, scratchpad with address generators, units, host port, ring port.

Every unit follows one pattern: a launch copies the configuration registers into the unit's
``i_cfg`` and descriptors into the address generators it owns; the generators stream words
between the scratchpad and the unit. The attention engine and the vector engine share RD3-RD5
and WR1-WR2 (an ``owner`` register, set at launch, routes them); they never run at once.
The collective engine reads its local input through RD6 and writes its output through WR3,
via a word gearbox (its words are ``D = max(2B, 8)`` bytes, ``D/N`` scratchpad words each), and
owns the chip's ring port (``ring_tx``, ``ring_rx``).
"""

from amaranth.hdl import Cat, Module, Mux, Shape, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out, connect, flipped

from .ring.collective import CollectiveEngine
from .ring.router import Router, tag_layout
from .spec import NpuConfig
from .spec.collective import CHUNKS_SHIFT, COUNT_FIELD_BITS, IN_PLACE_BIT, LENGTH_BITS, Kind
from .spec.isa import (
    ADDR_LEVELS,
    BUSY_COUNTERS,
    COLL_FIFO_WORDS,
    COLL_GENS,
    COUNT_BITS,
    OPCODE_BITS,
    READ_GENS,
    RECV_FIFO_WORDS,
    REG_INDEX,
    REGS,
    UNIT_BITS,
    VALUE_BITS,
    WRAP_GENS,
    WRITE_GENS,
    Op,
    Unit,
)
from .spec.ring import CHAN_P2P, COLL_CHANS, CTS_SLOTS, NODE_CHIP_BITS
from .spec.topology import MAX_CHIPS
from .tile.attention_engine import AttentionEngine
from .tile.attention_engine import cfg_layout as attention_cfg_layout
from .tile.gearbox import WordPacker, WordUnpacker
from .tile.matmul_engine import MatmulEngine
from .tile.matmul_engine import cfg_layout as matmul_cfg_layout
from .tile.ports import HostSignature, RingPortSignature, trace_depth
from .tile.scratchpad import AddrGen, Scratchpad, desc_layout
from .tile.sequencer import LAUNCH_OPS, Sequencer
from .tile.trace import TraceBuffer
from .tile.vector_engine import CFG_REGS as VEC_CFG_REGS
from .tile.vector_engine import VectorEngine
from .tile.vector_engine import cfg_layout as vector_cfg_layout

__all__ = ["Chip", "reg_widths"]

# Scratchpad port numbers follow hw.spec.isa.READ_GENS and WRITE_GENS; the host has the last
# (lowest-priority) read and write ports.
#: Generators the attention and vector engines share (an attention launch uses RD3-RD5 and
#: WR1, less RD4 or RD3 in the split-score passes: the engine's ``uses``).
SHARED_GENS = ("RD3", "RD4", "RD5", "WR1", "WR2")
#: Which configuration register feeds each field of the matmul engine's ``i_cfg``.
MM_CFG_REGS = {"k": "MM_K", "folds": "MM_FOLDS", "mode": "MM_MODE",
               "a_unsigned": "MM_A_UNSIGNED", "b_rows": "MM_B_ROWS",
               "b_blocks": "MM_B_BLOCKS", "b_last": "MM_B_LAST"}
#: Which configuration register feeds each field of the attention engine's ``i_cfg``.
ATTN_CFG_REGS = {"queries": "AT_QUERIES", "keys": "AT_KEYS", "q_pos": "AT_Q_POS",
                 "k_pos": "AT_K_POS", "window": "AT_WINDOW", "flags": "AT_FLAGS",
                 "score_mult": "AT_SCORE_MULT", "score_shift": "AT_SCORE_SHIFT",
                 "out_mult": "AT_OUT_MULT", "out_shift": "AT_OUT_SHIFT", "d_head": "AT_D_HEAD",
                 "q_lane": "AT_Q_LANE", "k_lane": "AT_K_LANE", "v_lane": "AT_V_LANE",
                 "o_lane": "AT_O_LANE"}


#: Bits of the COLL registers the chip reads: the command's fields (``_collective``), and
#: CO_WIDTH whole (the chip compares it with 64; any other value runs as 32).
CO_REG_BITS = {"CO_KIND": CHUNKS_SHIFT + 16, "CO_OP": 2, "CO_WIDTH": VALUE_BITS,
               "CO_LEN": 2 * LENGTH_BITS, "CO_COUNT": 3 * COUNT_FIELD_BITS,
               "CO_CHIPS": 1, "CO_RANK": (MAX_CHIPS + 1).bit_length()}


def reg_widths(npu: NpuConfig, chip_bits: int = NODE_CHIP_BITS) -> tuple[int, ...]:
    """Bits of each configuration register (``hw.spec.isa.REGS`` order) that a chip built to
    ``npu`` reads: an address generator's descriptor fields (``desc_layout``), each unit's
    configuration field, the collective's (:data:`CO_REG_BITS`), and CO_NEXT, SR_DEST and SR_SRC
    (``chip_bits``). The
    sequencer keeps only these bits (:class:`~hw.tile.sequencer.Sequencer`'s ``reg_widths``):
    the registers wrap modulo ``2**VALUE_BITS``, so a field's low bits are the same either way.
    """
    ab = npu.sram_addr_bits
    widths = {}
    for gen in READ_GENS + WRITE_GENS:
        desc = desc_layout(ab, wrap=gen in WRAP_GENS)
        widths[f"{gen}.base"] = desc.members["base"].width
        for lv in range(ADDR_LEVELS):
            widths[f"{gen}.n{lv}"] = COUNT_BITS
            widths[f"{gen}.s{lv}"] = ab + 1
        if gen in WRAP_GENS:
            widths[f"{gen}.wrap"] = desc.members["wrap"].width
            widths[f"{gen}.off"] = desc.members["off"].width
    for layout, fields in ((matmul_cfg_layout(npu.array_size), MM_CFG_REGS),
                           (attention_cfg_layout(npu.d_head_max, npu.array_size), ATTN_CFG_REGS),
                           (vector_cfg_layout(), VEC_CFG_REGS)):
        widths.update({name: Shape.cast(layout.members[field]).width
                       for field, name in fields.items()})
    widths.update(CO_REG_BITS)
    widths.update({"SR_DEST": chip_bits, "SR_SRC": chip_bits, "CO_NEXT": chip_bits})
    return tuple(widths[name] for name in REGS)


def _write(m, addr, wp, src):
    """Join a write generator's addresses ``addr`` with a unit's words ``src`` into the
    scratchpad write port ``wp``: a word is written (every byte) when both are there and the
    port is free."""
    m.d.comb += [
        wp.valid.eq(addr.valid & src.valid),
        wp.payload.addr.eq(addr.payload.addr),
        wp.payload.data.eq(src.payload.data),
        wp.payload.mask.eq(-1),
        addr.ready.eq(wp.ready & src.valid),
        src.ready.eq(wp.ready & addr.valid),
    ]


class Chip(wiring.Component):
    """One NPU chip sized by an :class:`~hw.spec.NpuConfig`.

    Host side (used while the chip is stopped; loading time is reported separately):

    - ``host`` (:class:`~hw.tile.ports.HostSignature`): ``imem`` writes one 64-bit instruction
      (always ready), ``wr`` one scratchpad word; ``rd_addr`` / ``rd_data`` read one back;
    - ``start`` runs the program from pc 0; ``done`` rises at ``HALT`` (``error`` on an unknown
      opcode); ``cycles`` counts from start to done; ``busy_cycles[k]`` counts the cycles in
      which counter ``hw.spec.isa.BUSY_COUNTERS[k]`` was busy: each unit (matmul, attention,
      vector, collective, send, recv), then ``any`` unit, then ``compute`` (matmul, attention
      or vector); the trace buffer (:mod:`hw.tile.trace`, read through ``host``) holds every
      change of the busy vector;
    - ``busy`` (the units busy now, ``hw.spec.isa.Unit`` bits) and ``pc``: what a watchdog
      reports about a chip that never halts.

    Ring ports (:class:`~hw.tile.ports.RingPortSignature`), one per dimension of the system
    (``dims``: 1 on a ring, 2 on a torus): ``ring`` (dimension 0: ``ring.tx`` to the next chip
    of the ring or row, ``ring.rx`` from the previous one) and, on a torus, ``ring_y``
    (dimension 1, along the column). They carry tagged words of ``D = max(2 *
    link_bytes_per_cycle, 8)`` bytes; join each ``tx`` to the next chip's ``rx`` through a
    :class:`~hw.ring.link.RingLink` (:class:`hw.system.ChipSystem`), and tie ``chip_id`` to the
    chip's id (and, on a torus, ``row_first`` and ``row_last`` to its row's first and last
    ids). A router (:class:`~hw.ring.router.Router`) delivers the words for this chip to a
    collective engine, the receive unit or the send unit's clear-to-send store, and forwards
    the rest, the column first (``hw.spec.ring``). ``D`` must be a multiple of the scratchpad
    word (:meth:`~hw.spec.NpuConfig.ring_port_error`; the constructor raises
    :meth:`~hw.spec.NpuConfig.chip_error`).

    ``chip_bits``: bits of a chip id, the system's :func:`~hw.spec.topology.chip_bits`
    (default :data:`hw.spec.ring.NODE_CHIP_BITS`: any system of up to 1,024 chips). A torus's
    chip (``dims=2``) has two collective engines (the COLL's operand names one; engine 1 reads
    through RD8 and writes through WR5); a ring's has one (a COLL runs on it whatever its
    operand).

    ``coll_avg=False`` builds the collective engines without AVG's divider (an FPGA build:
    :class:`hw.ring.collective.CollectiveEngine`, ``avg``); a COLL AVG then gives the sum.
    ``pe_dsp=True`` takes the matmul array's products in DSPs (an FPGA build with DSPs to
    spare: :class:`hw.tile.matmul.MatmulArray`); function and timing are the same.
    ``ecp5_dsp=True`` (an ECP5 build) instantiates the ECP5's MULT18X18D, with its input and
    output registers, for the vector engine's registered products (its deep pipeline:
    :class:`hw.tile.vector.VectorUnit`); function and timing are the same.
    """

    def __init__(self, *, npu: NpuConfig, coll_avg: bool = True, pe_dsp: bool = False,
                 chip_bits: int | None = None, dims: int = 1, ecp5_dsp: bool = False):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        if (error := npu.chip_error()) is not None:
            raise error
        chip_bits = NODE_CHIP_BITS if chip_bits is None else chip_bits
        if not isinstance(chip_bits, int) or isinstance(chip_bits, bool) or \
                not 1 <= chip_bits <= NODE_CHIP_BITS:
            raise ValueError(f"chip_bits must be an integer 1..{NODE_CHIP_BITS}, not "
                             f"{chip_bits!r}")
        if dims not in (1, 2) or isinstance(dims, bool):
            raise ValueError(f"dims must be 1 (a ring) or 2 (a torus), not {dims!r}")
        self._coll_bytes = npu.ring_word_bytes
        self._npu = npu
        self._coll_avg = bool(coll_avg)
        self._pe_dsp = bool(pe_dsp)
        self._ecp5_dsp = bool(ecp5_dsp)
        self._chip_bits = chip_bits
        self._dims = dims
        self._engines = dims
        unused = set() if dims == 2 else {g for pair in COLL_GENS[1:] for g in pair}
        self._read_gens = tuple(g for g in READ_GENS if g not in unused)
        self._write_gens = tuple(g for g in WRITE_GENS if g not in unused)
        self._sp_args = {"words": npu.sram_words, "banks": npu.sram_banks,
                         "word_bytes": npu.word_bytes, "read_ports": len(self._read_gens) + 1,
                         "write_ports": len(self._write_gens) + 1}
        members = {
            "start": In(1),
            "done": Out(1),
            "error": Out(1),
            "cycles": Out(32),
            "busy_cycles": Out(32).array(len(BUSY_COUNTERS)),
            "busy": Out(UNIT_BITS),
            "pc": Out(range(npu.imem_words)),
            "chip_id": In(chip_bits),
            "host": In(HostSignature(npu)),
            "ring": Out(RingPortSignature(self._coll_bytes, chip_bits)),
        }
        if dims == 2:
            members.update({
                "row_first": In(chip_bits),
                "row_last": In(chip_bits),
                "ring_y": Out(RingPortSignature(self._coll_bytes, chip_bits)),
            })
        super().__init__(members)

    @property
    def chip_bits(self) -> int:
        return self._chip_bits

    @property
    def dims(self) -> int:
        return self._dims

    @property
    def npu(self):
        return self._npu

    @property
    def coll_avg(self) -> bool:
        """Whether the collective engine has AVG's divider (``coll_avg``)."""
        return self._coll_avg

    @property
    def pe_dsp(self) -> bool:
        """Whether the matmul array's products are DSPs (``pe_dsp``)."""
        return self._pe_dsp

    @property
    def ecp5_dsp(self) -> bool:
        """Whether registered products are instantiated ECP5 DSPs (``ecp5_dsp``)."""
        return self._ecp5_dsp

    @property
    def ring_word_bytes(self) -> int:
        """Bytes of the words on the ring port (the collective engine's ``D``)."""
        return self._coll_bytes

    def elaborate(self, platform):
        m = Module()
        npu = self._npu
        n = npu.array_size
        ab = npu.sram_addr_bits
        host = self.host

        m.submodules.seq = seq = Sequencer(imem_words=npu.imem_words,
                                           reg_widths=reg_widths(npu, self._chip_bits))
        m.submodules.spad = spad = Scratchpad(**self._sp_args)
        connect(m, flipped(host.imem), seq.imem_wr)
        m.d.comb += [
            seq.start.eq(self.start),
            self.done.eq(seq.done),
            self.error.eq(seq.error),
            self.cycles.eq(seq.cycles),
            self.pc.eq(seq.pc),
        ]

        # Host access through the last (lowest-priority) scratchpad ports.
        read_gens, write_gens = self._read_gens, self._write_gens
        host_rp = spad.rd[len(read_gens)]
        connect(m, flipped(host.rd_addr), host_rp.i_addr)
        connect(m, host_rp.o_data, flipped(host.rd_data))
        host_wp = spad.wr[len(write_gens)]
        m.d.comb += [
            host_wp.i.valid.eq(host.wr.valid),
            host_wp.i.payload.addr.eq(host.wr.payload.addr),
            host_wp.i.payload.data.eq(host.wr.payload.data),
            host_wp.i.payload.mask.eq(-1),
            host.wr.ready.eq(host_wp.i.ready),
        ]

        def reg(name):
            return seq.regs[REG_INDEX[name]]

        gens = {}
        for name in read_gens + write_gens:
            gen = AddrGen(addr_bits=ab, wrap=name in WRAP_GENS)
            m.submodules[f"gen_{name.lower()}"] = gen
            gens[name] = gen
            m.d.comb += gen.i.payload.base.eq(reg(f"{name}.base"))
            if name in WRAP_GENS:
                m.d.comb += [gen.i.payload.wrap.eq(reg(f"{name}.wrap")),
                             gen.i.payload.off.eq(reg(f"{name}.off"))]
            for lv in range(ADDR_LEVELS):
                m.d.comb += [gen.i.payload.n[lv].eq(reg(f"{name}.n{lv}")),
                             gen.i.payload.s[lv].eq(reg(f"{name}.s{lv}"))]
        for k, name in enumerate(read_gens):
            connect(m, gens[name].o, spad.rd[k].i_addr)

        def idle(names):
            # An address generator is idle when it holds no address (its state, not `ready`).
            return ~Cat(*[gens[g].o.valid for g in names]).any()

        # Matmul unit: A via RD0, B via RD1, parameters via RD2, results via WR0.
        m.submodules.matmul = mm = MatmulEngine(size=n, pe_dsp=self._pe_dsp)
        for k, port in enumerate((mm.i_a, mm.i_b, mm.i_p)):
            rd = spad.rd[k].o_data
            m.d.comb += [port.valid.eq(rd.valid), rd.ready.eq(port.ready),
                         port.payload.data.eq(rd.payload.data),
                         port.payload.last.eq(rd.payload.last)]
        _write(m, gens["WR0"].o, spad.wr[0].i, mm.o)
        mm_gens = ("RD0", "RD1", "RD2", "WR0")
        mm_busy = mm.busy | ~idle(mm_gens)
        mm_bit = LAUNCH_OPS.index(Op.MATMUL)
        go = seq.launch[mm_bit] & seq.can_launch[mm_bit]
        m.d.comb += [
            seq.can_launch[mm_bit].eq(~mm_busy),
            mm.i_cfg.valid.eq(go),
        ]
        for field, name in MM_CFG_REGS.items():
            m.d.comb += getattr(mm.i_cfg.payload, field).eq(reg(name))
        for g in mm_gens:
            m.d.comb += gens[g].i.valid.eq(go)

        # Attention (RD3 K, RD4 V, RD5 Q, WR1 out) and vector unit (RD3 A, RD4 B, RD5 stats,
        # WR1 data, WR2 q) share generators; `owner_attn` (set at launch) routes their streams.
        m.submodules.attention = at = AttentionEngine.for_npu(npu)
        m.submodules.vector = vu = VectorEngine(lanes=n, d_model_max=npu.d_model_max,
                                                pipeline=npu.vector_pipeline,
                                                ecp5_dsp=self._ecp5_dsp)
        owner_attn = Signal()
        shared_idle = idle(SHARED_GENS)
        rd_index = {name: k for k, name in enumerate(read_gens)}
        for gen, at_port, vu_port in (("RD3", at.i_k, vu.i_a), ("RD4", at.i_v, vu.i_b),
                                      ("RD5", at.i_q, vu.i_stats)):
            rd = spad.rd[rd_index[gen]].o_data
            for port, mine in ((at_port, owner_attn), (vu_port, ~owner_attn)):
                m.d.comb += [port.valid.eq(rd.valid & mine),
                             port.payload.data.eq(rd.payload.data),
                             port.payload.last.eq(rd.payload.last)]
            m.d.comb += rd.ready.eq(Mux(owner_attn, at_port.ready, vu_port.ready))
        wr_index = {name: k for k, name in enumerate(write_gens)}
        for gen, at_port, vu_port in (("WR1", at.o, vu.o_data), ("WR2", None, vu.o_q)):
            addr, wp = gens[gen].o, spad.wr[wr_index[gen]].i
            if at_port is not None:
                # WR1 writes the bytes its source enables: an attention row of a head packed
                # with others in its words, a vector row ending inside a word (``keep``).
                src_valid = Mux(owner_attn, at_port.valid, vu_port.valid)
                src_data = Mux(owner_attn, at_port.payload.data.as_value(),
                               vu_port.payload.data.as_value())
                src_mask = Mux(owner_attn, at_port.payload.mask, vu_port.payload.mask)
                m.d.comb += at_port.ready.eq(owner_attn & wp.ready & addr.valid)
            else:
                src_valid = ~owner_attn & vu_port.valid
                src_data = vu_port.payload.data.as_value()
                src_mask = -1
            m.d.comb += [
                wp.valid.eq(addr.valid & src_valid),
                wp.payload.addr.eq(addr.payload.addr),
                wp.payload.data.eq(src_data),
                wp.payload.mask.eq(src_mask),
                addr.ready.eq(wp.ready & src_valid),
                vu_port.ready.eq(~owner_attn & wp.ready & addr.valid),
            ]

        at_bit, vu_bit = LAUNCH_OPS.index(Op.ATTN), LAUNCH_OPS.index(Op.VEC)
        free = ~at.busy & ~vu.busy & shared_idle
        at_go = seq.launch[at_bit] & seq.can_launch[at_bit]
        vu_go = seq.launch[vu_bit] & seq.can_launch[vu_bit]
        m.d.comb += [seq.can_launch[at_bit].eq(free), seq.can_launch[vu_bit].eq(free),
                     at.i_cfg.valid.eq(at_go), vu.i_cfg.valid.eq(vu_go)]
        for field, name in ATTN_CFG_REGS.items():
            m.d.comb += getattr(at.i_cfg.payload, field).eq(reg(name))
        for field, name in VEC_CFG_REGS.items():
            m.d.comb += getattr(vu.i_cfg.payload, field).eq(reg(name))
        with m.If(at_go):
            m.d.sync += owner_attn.eq(1)
        with m.If(vu_go):
            m.d.sync += owner_attn.eq(0)
        # A launch starts only the generators its unit will use: an unused generator would
        # still walk one address and never finish.
        vu_uses = {"RD3": vu.uses.a, "RD4": vu.uses.b, "RD5": vu.uses.stats, "WR1": vu.uses.data,
                   "WR2": vu.uses.q}
        # The split-score passes read no V (partial) or no K (reduced).
        at_uses = {"RD3": at.uses.k, "RD4": at.uses.v, "RD5": 1, "WR1": 1, "WR2": 0}
        for g in SHARED_GENS:
            m.d.comb += gens[g].i.valid.eq((at_go & at_uses[g]) | (vu_go & vu_uses[g]))
        at_busy = at.busy | (owner_attn & ~shared_idle)
        vu_busy = vu.busy | (~owner_attn & ~shared_idle)

        m.submodules.router = router = Router(word_bytes=self._coll_bytes,
                                              chip_bits=self._chip_bits, dims=self._dims,
                                              engines=self._engines)
        connect(m, router.o_link, flipped(self.ring.tx))
        connect(m, flipped(self.ring.rx), router.i_link)
        m.d.comb += router.chip_id.eq(self.chip_id)
        if self._dims == 2:
            connect(m, router.o_link_y, flipped(self.ring_y.tx))
            connect(m, flipped(self.ring_y.rx), router.i_link_y)
            m.d.comb += [router.row_first.eq(self.row_first),
                         router.row_last.eq(self.row_last)]
        co_busy = self._collective(m, seq, spad, gens, reg, idle, router, seq.insn)
        send_busy = self._send(m, seq, spad, gens, reg, idle, router)
        recv_busy = self._recv(m, seq, spad, gens, reg, idle, router)

        busy = Cat(mm_busy, at_busy, vu_busy, co_busy, send_busy, recv_busy)
        m.d.comb += [seq.busy.eq(busy), self.busy.eq(busy)]
        # `any` counts the cycles in which some unit is busy: the sum of the per-unit counts
        # minus it is how much the units overlapped. `compute`: matmul, attention or vector.
        compute = (busy & (Unit.MATMUL | Unit.ATTN | Unit.VEC)).any()
        flags = [busy[u] for u in range(UNIT_BITS)] + [busy.any(), compute]
        assert len(flags) == len(BUSY_COUNTERS)
        for u, flag in enumerate(flags):
            with m.If(seq.running & flag):
                m.d.sync += self.busy_cycles[u].eq(self.busy_cycles[u] + 1)
        launch = self.start & ~seq.running
        with m.If(launch):
            m.d.sync += [c.eq(0) for c in self.busy_cycles]

        m.submodules.trace = trace = TraceBuffer(depth=trace_depth(npu))
        m.d.comb += [
            trace.running.eq(seq.running), trace.start.eq(launch), trace.cycle.eq(seq.cycles),
            trace.busy.eq(busy), trace.rd_addr.eq(host.trace_addr),
            host.trace_data.eq(trace.rd_data), host.trace_count.eq(trace.count),
            host.trace_overflow.eq(trace.overflow),
        ]
        return m

    def _collective(self, m, seq, spad, gens, reg, idle, router, insn):
        """The collective engines: engine e reads through its RD generator -> gearbox ->
        ``i_local`` and writes ``o_local`` -> gearbox -> its WR generator
        (``hw.spec.isa.COLL_GENS``); ``o_tx`` and ``i_rx`` through the router (words tagged
        for the next group member, on engine e's channel). A COLL launches the engine its
        operand names (``insn``, the instruction being executed; engine 0 on a chip with one).

        Returns the collective unit's busy flag: an engine is busy, its generators hold an
        address, or its read gearbox holds a partial word.
        """
        n = self._npu.word_bytes
        ratio = self._coll_bytes // n
        wbits = 8 * n
        cb = self._chip_bits
        bit = LAUNCH_OPS.index(Op.COLL)
        go = seq.launch[bit] & seq.can_launch[bit]
        engine_sel = insn[OPCODE_BITS] if self._engines == 2 else 0

        # Launch: the CO_* registers become the engine's command. A chip outside the group
        # (CO_RANK >= the group size) takes no part (its router forwards the group's words):
        # its COLL is a no-op. A member's schedule uses the local input in a reduction or an
        # all-gather, or as the sender of a send/recv; it produces output as such a member, or
        # the receiver. Only those generators start: a started generator that is never drained
        # would hang.
        kind = Signal(3)
        count = Signal(range(MAX_CHIPS + 1))
        rank = Signal(range(MAX_CHIPS + 1))
        m.d.comb += [kind.eq(reg("CO_KIND")[:3]),
                     count.eq(reg("CO_COUNT")[:COUNT_FIELD_BITS]), rank.eq(reg("CO_RANK"))]
        member = rank < count
        data_kind = (kind == Kind.ALL_REDUCE) | (kind == Kind.REDUCE_SCATTER) | \
            (kind == Kind.ALL_GATHER)
        send_recv = kind == Kind.SEND_RECV
        uses_rd = data_kind | (send_recv & (rank == 0))
        uses_wr = data_kind | (send_recv & (rank == 1))

        busies = []
        for e in range(self._engines):
            rd_gen, wr_gen = COLL_GENS[e]
            sub = "collective" if e == 0 else f"collective{e}"
            co = CollectiveEngine(link_bytes=self._npu.link_bytes_per_cycle,
                                  fifo_words=COLL_FIFO_WORDS, avg=self._coll_avg,
                                  max_count=min(MAX_CHIPS, 1 << cb))
            m.submodules[sub] = co
            i_coll = router.i_coll if e == 0 else router.i_coll1
            o_coll = router.o_coll if e == 0 else router.o_coll1
            co_dest = Signal(cb, name=f"co{e}_dest")
            tx_tag = data.View(tag_layout(cb), i_coll.payload.tag)
            m.d.comb += [
                i_coll.valid.eq(co.o_tx.valid),
                i_coll.payload.data.eq(co.o_tx.payload.data),
                i_coll.payload.last.eq(co.o_tx.payload.last),
                tx_tag.dest.eq(co_dest), tx_tag.src.eq(self.chip_id),
                tx_tag.chan.eq(COLL_CHANS[e]),
                co.o_tx.ready.eq(i_coll.ready),
            ]
            connect(m, o_coll, co.i_rx)

            # RD -> packer -> i_local: `ratio` scratchpad words make one engine word.
            pack = WordPacker(narrow_bits=wbits, ratio=ratio)
            m.submodules[f"co{e}_pack" if e else "co_pack"] = pack
            rd = spad.rd[self._read_gens.index(rd_gen)].o_data
            m.d.comb += [
                pack.i.valid.eq(rd.valid),
                pack.i.payload.data.eq(rd.payload.data),
                pack.i.payload.last.eq(rd.payload.last),
                rd.ready.eq(pack.i.ready),
                co.i_local.valid.eq(pack.o.valid),
                co.i_local.payload.data.eq(pack.o.payload.data),
                co.i_local.payload.last.eq(0),
                pack.o.ready.eq(co.i_local.ready),
            ]
            # o_local -> unpacker -> WR: each engine word leaves as `ratio` scratchpad words.
            unpack = WordUnpacker(narrow_bits=wbits, ratio=ratio)
            m.submodules[f"co{e}_unpack" if e else "co_unpack"] = unpack
            out = co.o_local
            m.d.comb += [
                unpack.i.valid.eq(out.valid),
                unpack.i.payload.data.eq(out.payload.data),
                unpack.i.payload.last.eq(out.payload.last),
                out.ready.eq(unpack.i.ready),
            ]
            _write(m, gens[wr_gen].o, spad.wr[self._write_gens.index(wr_gen)].i, unpack.o)

            busy = Signal(name=f"co{e}_busy")
            m.d.comb += busy.eq(co.busy | ~idle((rd_gen, wr_gen)) | pack.busy)
            busies.append(busy)
            mine = go & (engine_sel == e)
            cmd = co.i_cmd.payload
            m.d.comb += [
                cmd.kind.eq(kind),
                cmd.op.eq(reg("CO_OP")),
                cmd.wide.eq(reg("CO_WIDTH") == 64),
                # CO_LEN: length, block length; CO_COUNT: group size, longer blocks.
                cmd.length.eq(reg("CO_LEN")[:LENGTH_BITS]),
                cmd.block.eq(reg("CO_LEN")[LENGTH_BITS:2 * LENGTH_BITS]),
                cmd.longer.eq(reg("CO_COUNT")[COUNT_FIELD_BITS:]),
                cmd.count.eq(count),
                cmd.rank.eq(rank),
                cmd.divisor.eq(reg("CO_COUNT")[2 * COUNT_FIELD_BITS:3 * COUNT_FIELD_BITS]),
                # CO_KIND: kind, in place (all-gather), chunks less one.
                cmd.in_place.eq(reg("CO_KIND")[IN_PLACE_BIT]),
                cmd.chunks.eq(reg("CO_KIND")[CHUNKS_SHIFT:CHUNKS_SHIFT + 16]),
                co.i_cmd.valid.eq(mine & member),
                gens[rd_gen].i.valid.eq(mine & member & uses_rd),
                gens[wr_gen].i.valid.eq(mine & member & uses_wr),
            ]
            with m.If(mine):
                m.d.sync += co_dest.eq(reg("CO_NEXT"))
        if self._engines == 2:
            m.d.comb += seq.can_launch[bit].eq(~Mux(engine_sel, busies[1], busies[0]))
        else:
            m.d.comb += seq.can_launch[bit].eq(~busies[0])
        co_busy = Signal()
        m.d.comb += co_busy.eq(Cat(*busies).any())
        return co_busy

    def _send(self, m, seq, spad, gens, reg, idle, router):
        """The send unit: RD7 -> packer -> the router, to chip ``SR_DEST``, once a clear-to-send
        from that chip has arrived. Returns its busy flag."""
        ratio = self._coll_bytes // self._npu.word_bytes
        m.submodules.send_pack = pack = WordPacker(narrow_bits=8 * self._npu.word_bytes,
                                                   ratio=ratio)
        rd = spad.rd[self._read_gens.index("RD7")].o_data
        connect(m, rd, pack.i)
        cb = self._chip_bits
        active, clear = Signal(), Signal()
        dest = Signal(cb)
        tag = data.View(tag_layout(cb), router.i_p2p.payload.tag)
        m.d.comb += [
            router.i_p2p.valid.eq(pack.o.valid & clear),
            router.i_p2p.payload.data.eq(pack.o.payload.data),
            router.i_p2p.payload.last.eq(pack.o.payload.last),
            tag.dest.eq(dest), tag.src.eq(self.chip_id), tag.chan.eq(CHAN_P2P),
            pack.o.ready.eq(router.i_p2p.ready & clear),
        ]
        # Clear-to-send tokens held: CTS_SLOTS entries of (valid, source chip). A token from a
        # source already held is merged with it (each receiver has at most one open RECV, so
        # it cannot send a second before the first was used); a token arriving while the store
        # is full waits on its link (the router's o_cts.ready). The SEND for `dest` takes the
        # token from `dest`, and with it one arriving from `dest` in the same cycle.
        held = Signal(CTS_SLOTS)
        srcs = [Signal(cb, name=f"cts_src{k}") for k in range(CTS_SLOTS)]
        arriving = router.o_cts
        hit_in = Cat(*[held[k] & (srcs[k] == arriving.payload.src)
                       for k in range(CTS_SLOTS)]).any()
        m.d.comb += arriving.ready.eq(~held.all() | hit_in)
        matches = Cat(*[held[k] & (srcs[k] == dest) for k in range(CTS_SLOTS)])
        take = active & ~clear & matches.any()
        with m.If(take):
            m.d.sync += clear.eq(1)
        consumed = Mux(take, matches, 0)
        keep = held & ~consumed
        store = arriving.valid & arriving.ready & ~hit_in & \
            ~(take & (arriving.payload.src == dest))
        free = Signal(range(CTS_SLOTS))
        for k in reversed(range(CTS_SLOTS)):
            with m.If(~held[k]):
                m.d.comb += free.eq(k)
        new_held = Signal(CTS_SLOTS)
        m.d.comb += new_held.eq(keep)
        with m.If(store):
            m.d.comb += new_held.eq(keep | (1 << free))
            with m.Switch(free):
                for k in range(CTS_SLOTS):
                    with m.Case(k):
                        m.d.sync += srcs[k].eq(arriving.payload.src)
        m.d.sync += held.eq(new_held)
        with m.If(router.i_p2p.valid & router.i_p2p.ready & pack.o.payload.last):
            m.d.sync += [active.eq(0), clear.eq(0)]
        bit = LAUNCH_OPS.index(Op.SEND)
        busy = Signal()
        m.d.comb += busy.eq(active | ~idle(("RD7",)) | pack.busy)
        go = seq.launch[bit] & seq.can_launch[bit]
        m.d.comb += [seq.can_launch[bit].eq(~busy), gens["RD7"].i.valid.eq(go)]
        with m.If(go):
            m.d.sync += [active.eq(1), clear.eq(0), dest.eq(reg("SR_DEST"))]
        return busy

    def _recv(self, m, seq, spad, gens, reg, idle, router):
        """The receive unit: a clear-to-send to chip ``SR_SRC``, then that chip's message words
        from the router -> FIFO -> unpacker -> WR4, until ``last``. Returns its busy flag."""
        ratio = self._coll_bytes // self._npu.word_bytes
        wbits = 8 * self._npu.word_bytes
        m.submodules.recv_fifo = fifo = SyncFIFO(width=8 * self._coll_bytes + 1,
                                                 depth=RECV_FIFO_WORDS)
        m.submodules.recv_unpack = unpack = WordUnpacker(narrow_bits=wbits, ratio=ratio)
        open_, cts_due = Signal(), Signal()
        src = Signal(self._chip_bits)
        inw = router.o_p2p
        m.d.comb += [
            router.p2p_open.eq(open_), router.p2p_src.eq(src),
            router.i_cts.valid.eq(cts_due), router.i_cts.payload.dest.eq(src),
            fifo.w_data.eq(Cat(inw.payload.data, inw.payload.last)),
            fifo.w_en.eq(inw.valid),
            inw.ready.eq(fifo.w_rdy),
            unpack.i.valid.eq(fifo.r_rdy),
            unpack.i.payload.data.eq(fifo.r_data[:8 * self._coll_bytes]),
            unpack.i.payload.last.eq(fifo.r_data[-1]),
            fifo.r_en.eq(unpack.i.ready),
        ]
        with m.If(router.i_cts.valid & router.i_cts.ready):
            m.d.sync += cts_due.eq(0)
        with m.If(inw.valid & inw.ready & inw.payload.last):
            m.d.sync += open_.eq(0)
        _write(m, gens["WR4"].o, spad.wr[self._write_gens.index("WR4")].i, unpack.o)
        busy = Signal()
        m.d.comb += busy.eq(open_ | cts_due | fifo.r_rdy | ~idle(("WR4",)))
        bit = LAUNCH_OPS.index(Op.RECV)
        go = seq.launch[bit] & seq.can_launch[bit]
        m.d.comb += [seq.can_launch[bit].eq(~busy), gens["WR4"].i.valid.eq(go)]
        with m.If(go):
            m.d.sync += [open_.eq(1), cts_due.eq(1), src.eq(reg("SR_SRC"))]
        return busy
