"""One NPU chip: sequencer, scratchpad with address generators, units, host port (issue #5).

Built so far: the matmul unit. The attention/softmax, vector and collective units plug into the
same pattern (launch -> descriptors into their address generators -> streams).
"""

from amaranth.hdl import Cat, Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out, connect, flipped

from ..spec import NpuConfig
from ..spec.isa import ADDR_LEVELS, INSN_BITS, REG_INDEX, Op
from .matmul_engine import MatmulEngine
from .scratchpad import AddrGen, Scratchpad, addr_layout
from .sequencer import LAUNCH_OPS, Sequencer

__all__ = ["Chip"]

#: Address generators each unit owns (scratchpad port numbers follow this order).
READ_GENS = ("RD0", "RD1", "RD2")
WRITE_GENS = ("WR0",)


class Chip(wiring.Component):
    """One NPU chip sized by an :class:`~hw.spec.NpuConfig`.

    Host side (used while the chip is stopped; loading time is reported separately):

    - ``host_imem`` writes one 64-bit instruction (always ready);
    - ``host_wr`` writes one scratchpad word; ``host_rd_addr`` / ``host_rd_data`` read one back;
    - ``start`` runs the program from pc 0; ``done`` rises at ``HALT`` (``error`` on an unknown
      opcode); ``cycles`` counts from start to done; ``busy_cycles[u]`` counts the cycles unit
      ``u`` (``hw.spec.isa.Unit`` bit order: matmul, attention, vector, collective) was busy.
    """

    def __init__(self, *, npu: NpuConfig):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        self._npu = npu
        self._sp_args = {"words": npu.sram_words, "banks": npu.sram_banks,
                         "word_bytes": npu.word_bytes, "read_ports": len(READ_GENS) + 1,
                         "write_ports": len(WRITE_GENS) + 1}
        addr_bits = max(1, (npu.sram_words - 1).bit_length())
        self._addr_bits = addr_bits
        word_bits = 8 * npu.word_bytes
        super().__init__({
            "start": In(1),
            "done": Out(1),
            "error": Out(1),
            "cycles": Out(32),
            "busy_cycles": Out(32).array(4),
            "host_imem": In(stream.Signature(data.StructLayout(
                {"addr": range(npu.imem_words), "data": INSN_BITS}))),
            "host_wr": In(stream.Signature(data.StructLayout(
                {"addr": addr_bits, "data": word_bits}))),
            "host_rd_addr": In(stream.Signature(addr_layout(addr_bits))),
            "host_rd_data": Out(stream.Signature(data.StructLayout(
                {"data": word_bits, "last": 1}))),
        })

    @property
    def npu(self):
        return self._npu

    def elaborate(self, platform):
        m = Module()
        npu = self._npu
        n = npu.array_size
        ab = self._addr_bits

        m.submodules.imem = imem = Memory(shape=INSN_BITS, depth=npu.imem_words, init=[])
        m.submodules.seq = seq = Sequencer(imem_words=npu.imem_words)
        m.submodules.spad = spad = Scratchpad(**self._sp_args)
        imem_rd = imem.read_port()
        imem_wr = imem.write_port()
        m.d.comb += [
            imem_rd.addr.eq(seq.imem_addr),
            seq.imem_data.eq(imem_rd.data),
            imem_wr.en.eq(self.host_imem.valid),
            imem_wr.addr.eq(self.host_imem.payload.addr),
            imem_wr.data.eq(self.host_imem.payload.data),
            self.host_imem.ready.eq(1),
            seq.start.eq(self.start),
            self.done.eq(seq.done),
            self.error.eq(seq.error),
            self.cycles.eq(seq.cycles),
        ]

        # Host access through the last (lowest-priority) scratchpad ports.
        host_rp = spad.rd[len(READ_GENS)]
        connect(m, flipped(self.host_rd_addr), host_rp.i_addr)
        connect(m, host_rp.o_data, flipped(self.host_rd_data))
        host_wp = spad.wr[len(WRITE_GENS)]
        m.d.comb += [
            host_wp.i.valid.eq(self.host_wr.valid),
            host_wp.i.payload.addr.eq(self.host_wr.payload.addr),
            host_wp.i.payload.data.eq(self.host_wr.payload.data),
            self.host_wr.ready.eq(host_wp.i.ready),
        ]

        def reg(name):
            return seq.regs[REG_INDEX[name]]

        gens = {}
        for name in READ_GENS + WRITE_GENS:
            gen = AddrGen(addr_bits=ab)
            m.submodules[f"gen_{name.lower()}"] = gen
            gens[name] = gen
            m.d.comb += gen.i.payload.base.eq(reg(f"{name}.base"))
            for lv in range(ADDR_LEVELS):
                m.d.comb += [gen.i.payload.n[lv].eq(reg(f"{name}.n{lv}")),
                             gen.i.payload.s[lv].eq(reg(f"{name}.s{lv}"))]
        for k, name in enumerate(READ_GENS):
            connect(m, gens[name].o, spad.rd[k].i_addr)

        def idle(names):
            # An address generator is idle when it holds no address (its state, not `ready`).
            return ~Cat(*[gens[g].o.valid for g in names]).any()

        # Matmul unit: A via RD0, B via RD1, parameters via RD2, results via WR0.
        m.submodules.matmul = mm = MatmulEngine(size=n)
        for k, port in enumerate((mm.i_a, mm.i_b, mm.i_p)):
            rd = spad.rd[k].o_data
            m.d.comb += [port.valid.eq(rd.valid), rd.ready.eq(port.ready),
                         port.payload.data.eq(rd.payload.data),
                         port.payload.last.eq(rd.payload.last)]
        wr_addr, wp = gens["WR0"].o, spad.wr[0].i
        m.d.comb += [
            wp.valid.eq(wr_addr.valid & mm.o.valid),
            wp.payload.addr.eq(wr_addr.payload.addr),
            wp.payload.data.eq(mm.o.payload.data),
            wr_addr.ready.eq(wp.ready & mm.o.valid),
            mm.o.ready.eq(wp.ready & wr_addr.valid),
        ]
        mm_gens = ("RD0", "RD1", "RD2", "WR0")
        mm_busy = mm.busy | ~idle(mm_gens)
        mm_bit = LAUNCH_OPS.index(Op.MATMUL)
        go = seq.launch[mm_bit] & seq.can_launch[mm_bit]
        m.d.comb += [
            seq.can_launch[mm_bit].eq(~mm_busy),
            mm.i_cfg.valid.eq(go),
            mm.i_cfg.payload.k.eq(reg("MM_K")),
            mm.i_cfg.payload.folds.eq(reg("MM_FOLDS")),
            mm.i_cfg.payload.mode.eq(reg("MM_MODE")),
            mm.i_cfg.payload.a_unsigned.eq(reg("MM_A_UNSIGNED")),
        ]
        for g in mm_gens:
            m.d.comb += gens[g].i.valid.eq(go)

        busy = Cat(mm_busy, 0, 0, 0)
        m.d.comb += seq.busy.eq(busy)
        for u in range(4):
            with m.If(seq.running & busy[u]):
                m.d.sync += self.busy_cycles[u].eq(self.busy_cycles[u] + 1)
        with m.If(self.start & ~seq.running):
            m.d.sync += [c.eq(0) for c in self.busy_cycles]
        return m
