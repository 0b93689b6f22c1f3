"""Static-schedule sequencer: fetches 64-bit instructions and launches units (``hw.spec.isa``)."""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..spec.isa import (
    ADDX_SCALE_BITS,
    INSN_BITS,
    ITER_BITS,
    LOOP_BODY_BITS,
    LOOP_COUNT_BITS,
    OPCODE_BITS,
    REG_BITS,
    REG_INDEX,
    REGS,
    START_CLEARED,
    UNIT_BITS,
    VALUE_BITS,
    Op,
    Unit,
)

__all__ = ["Sequencer", "LAUNCH_OPS"]

#: Opcodes that launch a unit, in the order of the ``launch``/``can_launch`` bits.
LAUNCH_OPS = (Op.MATMUL, Op.ATTN, Op.VEC, Op.COLL, Op.SEND, Op.RECV)


class Sequencer(wiring.Component):
    """Execute a program from instruction memory, one instruction per cycle.

    - ``SET reg, value`` writes the configuration register file (``regs``); ``ADD reg, value``
      adds to it (48 bits, wrapping); ``ADDX reg, scale`` adds ``scale * ITER``, the loop's
      iteration index times the low 16 bits of the value field (signed). All three share one
      write path (one instruction issues per cycle, so one product and one sum serve every
      register), in two stages: in the cycle it issues, the instruction reads its register's
      value from a block RAM copy of the registers (no multiplexer over the registers) and
      registers its addend (the value, or the one 16 x 32-bit multiplier's product); in the
      next cycle the sum is written, and is what that cycle reads of the register: ``regs``
      (a launch in that cycle copies it) and the value of an ADD or ADDX of the same register
      issued in that cycle. To a program, SET, ADD and ADDX write in the cycle they issue.
    - ``LOOP body, count`` runs the next ``body`` instructions ``count`` times (0: skips them):
      it records the body's first and last pc and the trips left; completing the last
      instruction of the body with trips left goes back to the first (the same cycle as any
      other advance: no cycle is lost at the jump). A LOOP inside a body, or with an empty
      body, halts with ``error`` (``hw.spec.isa.LoopState`` is the same rule in Python).
      ITER (``loop_iter``) is 0 at the LOOP and counts up at each jump back; an ADDX outside
      a loop body halts with ``error``.
    - A launch opcode raises its ``launch`` bit; the chip takes it when the unit and its
      address generators are idle (``can_launch``) and copies the registers into them in the
      same cycle; the program continues with the next instruction at once.
    - ``WAIT mask`` waits until no unit in ``mask`` is ``busy``; ``HALT`` waits until no unit
      is busy, then raises ``done`` and stops. An unknown opcode, or the launch of a unit the
      chip does not have (``launch_ops``), halts with ``error`` set.

    ``reg_widths`` (default: every register ``VALUE_BITS``) keeps only the low bits of each
    register that the chip reads (:func:`hw.chip.reg_widths`): a write stores the low bits of
    the 48-bit value, ``regs`` gives them sign-extended. SET, ADD and ADDX wrap modulo
    ``2**VALUE_BITS``, so the low bits of every result are those of the full register's: a unit
    that reads a register's low bits sees the same value either way.

    Timing: one instruction per cycle when nothing stalls. The fetch runs one instruction
    ahead: the instruction executing is a register (``insn``), loaded from the instruction
    memory's output, whose read address is already the instruction after the next (a LOOP's
    skip and a body's jump back are known a cycle ahead: the skip's address is stored beside
    each word as the host writes it, the jump back is a flip-flop of the fetch's own loop
    registers); a stall holds both. ``start`` loads the first instruction from copies of
    word 0 that the host's writes keep, so the first instruction executes in the cycle after
    ``start``, as it would from a read in the ``start`` cycle. ``cycles`` counts from the
    cycle after ``start`` to ``done``.

    The host writes the instruction memory while the sequencer is idle, up to the cycle
    before ``start`` (a word written while a program runs may already have been fetched).

    Members
    -------
    start : In(1)        pulse: run from pc 0 (ignored while running); clears the registers
                         of ``hw.spec.isa.START_CLEARED``
    done, error : Out(1) set when the program halts (cleared by ``start``)
    running : Out(1)
    cycles : Out(32)
    imem_wr : In(stream of {addr, data})   the host's write port (always ready)
    insn : Out(64)       the instruction being executed
    regs : Out(signed(48)).array(len(REGS))
    launch : Out(len(LAUNCH_OPS)), can_launch : In(len(LAUNCH_OPS))
    busy : In(UNIT_BITS) ``Unit`` bits
    pc : Out(range(imem_words))   the instruction being executed (for a watchdog's report)
    """

    def __init__(self, *, imem_words, launch_ops=LAUNCH_OPS, reg_widths=None):
        if not isinstance(imem_words, int) or imem_words < 2:
            raise ValueError(f"imem_words must be an integer of at least 2, not {imem_words!r}")
        if reg_widths is None:
            reg_widths = (VALUE_BITS,) * len(REGS)
        reg_widths = tuple(reg_widths)
        if len(reg_widths) != len(REGS) or not all(
                isinstance(w, int) and 1 <= w <= VALUE_BITS for w in reg_widths):
            raise ValueError(f"reg_widths must be {len(REGS)} widths of 1..{VALUE_BITS} bits")
        self._reg_widths = reg_widths
        unknown = [op for op in launch_ops if op not in LAUNCH_OPS]
        if unknown:
            raise ValueError(f"launch_ops {unknown!r} are not launch opcodes")
        self._imem_words = imem_words
        # Launch opcodes of units the chip has; the others halt with `error` like unknown ones.
        self._launch_ops = tuple(launch_ops)
        super().__init__({
            "start": In(1),
            "done": Out(1),
            "error": Out(1),
            "running": Out(1),
            "cycles": Out(32),
            "imem_wr": In(stream.Signature(data.StructLayout(
                {"addr": range(imem_words), "data": INSN_BITS}))),
            "insn": Out(INSN_BITS),
            "regs": Out(signed(VALUE_BITS)).array(len(REGS)),
            "launch": Out(len(LAUNCH_OPS)),
            "can_launch": In(len(LAUNCH_OPS)),
            "busy": In(UNIT_BITS),
            "pc": Out(range(imem_words)),
        })

    def elaborate(self, platform):
        m = Module()
        words = self._imem_words
        pc = Signal(range(words))
        aw = len(pc)

        # The instruction memory, written by the host (`imem_wr`), and beside it `inext`: for
        # each word, the address of the instruction that follows it unless a loop jumps back
        # (a + 1, or for a LOOP of count 0, a + 1 + body, the skip), computed as the word is
        # written, so that the fetch's next read address is one of two registers or this
        # block RAM's output, never a decode of the instruction read.
        m.submodules.imem = imem = Memory(shape=INSN_BITS, depth=words, init=[])
        m.submodules.inext = inext = Memory(
            shape=aw, depth=words, init=[(a + 1) % (1 << aw) for a in range(words)])
        rd, wr = imem.read_port(), imem.write_port()
        nrd, nwr = inext.read_port(), inext.write_port()
        wp = self.imem_wr.payload
        w_body = wp.data[OPCODE_BITS:OPCODE_BITS + LOOP_BODY_BITS]
        w_count = wp.data[OPCODE_BITS + LOOP_BODY_BITS:OPCODE_BITS + LOOP_BODY_BITS
                          + LOOP_COUNT_BITS]
        w_next = Signal(aw)
        m.d.comb += [
            self.imem_wr.ready.eq(1),
            w_next.eq(wp.addr + 1 + Mux((wp.data[:OPCODE_BITS] == Op.LOOP) & (w_count == 0),
                                        w_body, 0)),
            wr.en.eq(self.imem_wr.valid), wr.addr.eq(wp.addr), wr.data.eq(wp.data),
            nwr.en.eq(self.imem_wr.valid), nwr.addr.eq(wp.addr), nwr.data.eq(w_next),
        ]
        # Word 0 and its next address, kept in flip-flops as the host writes them: `start`
        # loads the first instruction from them (no read while idle to be stale).
        first = Signal(INSN_BITS)
        first_next = Signal(aw, init=1 % (1 << aw))
        with m.If(self.imem_wr.valid & (wp.addr == 0)):
            m.d.sync += [first.eq(wp.data), first_next.eq(w_next)]

        # The fetch runs one instruction ahead of the execution. `ir` (at `pc`) executes;
        # the memories' outputs hold the instruction at `pn`, the one after it, which `ir`
        # takes when it advances, while the memories read the one after that. The fetch keeps
        # its own copy of the loop registers (`f_*`), one instruction ahead of the execution's:
        # `pn_back` (`pn` ends a loop body with trips left: the address after it is the
        # body's first) and `pn_exit` (it ends the last trip) are flip-flops computed when
        # `pn` is, and travel with the instruction into `ir_back` / `ir_exit`. A stall holds
        # `ir`, `pn` and the memories' outputs (their read enable).
        ir = Signal(INSN_BITS)
        ir_back = Signal()
        ir_exit = Signal()
        pn = Signal(aw)
        pn_back = Signal()
        pn_exit = Signal()
        f_active = Signal()
        f_start = Signal(aw)
        f_end = Signal(aw)
        f_left = Signal(LOOP_COUNT_BITS)
        f_more = Signal()                # f_left != 0
        f_one = Signal()                 # a body of one instruction (f_start == f_end)
        fetch = Signal()                 # ir takes the next instruction
        addr = Signal(aw)                # the memories' read address
        back_or_first = Signal(aw)
        src = Signal(INSN_BITS)          # the instruction ir takes: the memory's, or word 0
        src_pc = Signal(aw)
        m.d.comb += [
            src.eq(Mux(self.running, rd.data, first)),
            src_pc.eq(Mux(self.running, pn, 0)),
            back_or_first.eq(Mux(self.running, f_start, first_next)),
            addr.eq(Mux(self.running & ~pn_back, nrd.data, back_or_first)),
            rd.addr.eq(addr), nrd.addr.eq(addr),
            rd.en.eq(fetch | ~self.running), nrd.en.eq(fetch | ~self.running),
        ]
        s_op = src[:OPCODE_BITS]
        s_body = src[OPCODE_BITS:OPCODE_BITS + LOOP_BODY_BITS]
        s_count = src[OPCODE_BITS + LOOP_BODY_BITS:OPCODE_BITS + LOOP_BODY_BITS
                      + LOOP_COUNT_BITS]
        s_one = Signal()
        s_many = Signal()                # count >= 2
        m.d.comb += [s_one.eq(s_body == 1), s_many.eq(s_count[1:] != 0)]
        near = Signal()                  # the address after pn is the loop body's last
        m.d.comb += near.eq(self.running & f_active & ((pn + 1)[:aw] == f_end))
        with m.If(fetch):
            m.d.sync += [pc.eq(src_pc), ir.eq(src), pn.eq(addr),
                         ir_back.eq(self.running & pn_back),
                         ir_exit.eq(self.running & pn_exit)]
            with m.If((s_op == Op.LOOP) & (s_count != 0)):
                # A LOOP (its errors are the execution's): its body's last instruction ends
                # a trip when it is the next.
                m.d.sync += [f_active.eq(1), f_start.eq(src_pc + 1), f_end.eq(src_pc + s_body),
                             f_left.eq(s_count - 1), f_more.eq(s_many), f_one.eq(s_one),
                             pn_back.eq(s_one & s_many), pn_exit.eq(s_one & ~s_many)]
            with m.Elif(self.running & pn_back):
                m.d.sync += [f_left.eq(f_left - 1), f_more.eq(f_left[1:] != 0),
                             pn_back.eq(f_one & (f_left[1:] != 0)),
                             pn_exit.eq(f_one & (f_left[1:] == 0))]
            with m.Else():
                with m.If(~self.running | pn_exit):
                    m.d.sync += f_active.eq(0)
                m.d.sync += [pn_back.eq(near & f_more & ~pn_exit),
                             pn_exit.eq(near & ~f_more & ~pn_exit)]

        op = ir[:OPCODE_BITS]
        reg_index = ir[OPCODE_BITS:OPCODE_BITS + REG_BITS]
        value = ir[OPCODE_BITS + REG_BITS:].as_signed()
        flags = ir[OPCODE_BITS:]
        advance = Signal()
        loop_active = Signal()
        loop_iter = Signal(ITER_BITS)    # ITER: the running trip's index
        scale = ir[OPCODE_BITS + REG_BITS:OPCODE_BITS + REG_BITS + ADDX_SCALE_BITS].as_signed()
        body = flags[:LOOP_BODY_BITS]
        count = flags[LOOP_BODY_BITS:LOOP_BODY_BITS + LOOP_COUNT_BITS]
        m.d.comb += [self.pc.eq(pc), self.insn.eq(ir),
                     fetch.eq(Mux(self.running, advance, self.start))]

        # The registers' stored bits: what the units copy at a launch.
        store = [Signal(w, name=f"reg_{REGS[i].replace('.', '_')}")
                 for i, w in enumerate(self._reg_widths)]

        # The write-back stage. A SET, ADD or ADDX issued in cycle t (from `ir`) leaves in
        # registers which register it writes (`w_hit`, one bit per register, and `w_idx`), its
        # addend as two terms (`w_a`, `w_b`: the value and 0, or ADDX's two partial products
        # of the scale and ITER) and the register's value (`w_base`; 0 for a SET); in cycle
        # t + 1 `w_sum`, that value plus the addend, is written (one carry-save layer and one
        # carry chain). `w_sum` is what the register reads in cycle t + 1: on `regs` (a launch
        # in cycle t + 1 copies it) and as the value of an ADD or ADDX of the same register
        # issued in cycle t + 1 (`w_fwd`: its base is then `last_sum`).
        #
        # The value an ADD reads comes from `shadow`, a block RAM copy of the registers (the
        # 48-bit sums; each register keeps the low bits of its sum, which wrap as the sum's
        # do): no multiplexer over the registers. It is read a cycle ahead, at the register
        # index of the instruction `ir` takes next (`src`), so that its output is registered
        # in `w_base` as the instruction issues: the write-back of that cycle before, which
        # the read does not see, comes from `last_sum` (`rd_hit`). `live` marks the
        # registers written since reset (`start` clears those of START_CLEARED): the others
        # read 0, as their flip-flops do.
        n_regs = len(REGS)
        m.submodules.shadow = shadow = Memory(shape=VALUE_BITS, depth=n_regs, init=[])
        sh_rd, sh_wr = shadow.read_port(), shadow.write_port()
        live = Signal(n_regs)
        w_hit = Signal(n_regs)
        w_valid = Signal()               # any bit of w_hit
        w_idx = Signal(REG_BITS)         # the register of w_hit
        # ADDX's product of the scale and ITER, as two partial products, each one 18 x 18
        # multiplier's (ITER's low 17 bits, and the 15 above), registered at the
        # multipliers' outputs as the addend's two terms.
        split = 17
        w_a = Signal(VALUE_BITS)         # the value, or scale * ITER[:17]
        w_b = Signal(VALUE_BITS - split) # 0, or scale * ITER[17:] (weight 2**17)
        w_base = Signal(VALUE_BITS)      # the register's value (0 for a SET)
        w_fwd = Signal()                 # an ADD or ADDX of the register the one before wrote
        rd_hit = Signal()                # the shadow's read missed a write of its register
        last_sum = Signal(VALUE_BITS)    # w_sum of the cycle before
        w_old = Signal(VALUE_BITS)
        w_b48 = Signal(VALUE_BITS)
        w_xor = Signal(VALUE_BITS)
        w_carry = Signal(VALUE_BITS)
        w_sum = Signal(VALUE_BITS)
        src_reg = src[OPCODE_BITS:OPCODE_BITS + REG_BITS]
        m.d.comb += [
            sh_rd.addr.eq(src_reg),
            w_old.eq(Mux(w_fwd, last_sum, w_base)),
            w_b48.eq(w_b << split),
            w_xor.eq(w_old ^ w_a ^ w_b48),
            w_carry.eq(((w_old & w_a) | (w_old & w_b48) | (w_a & w_b48)) << 1),
            w_sum.eq(w_xor + w_carry),
            sh_wr.addr.eq(w_idx), sh_wr.data.eq(w_sum), sh_wr.en.eq(w_valid),
        ]
        m.d.sync += [w_hit.eq(0), w_valid.eq(0), last_sum.eq(w_sum),
                     rd_hit.eq(w_valid & (w_idx == src_reg))]
        for i, r in enumerate(store):
            with m.If(w_hit[i]):
                m.d.sync += [r.eq(w_sum), live[i].eq(1)]
        m.d.comb += [out.eq(Mux(w_hit[i], w_sum[:len(r)], r).as_signed())
                     for i, (out, r) in enumerate(zip(self.regs, store, strict=True))]

        with m.If(~self.running):
            with m.If(self.start):
                m.d.sync += [self.running.eq(1), self.done.eq(0), self.error.eq(0),
                             self.cycles.eq(0), loop_active.eq(0)]
                m.d.sync += [store[REG_INDEX[name]].eq(0) for name in START_CLEARED]
                m.d.sync += [live[REG_INDEX[name]].eq(0) for name in START_CLEARED]
        with m.Else():
            m.d.sync += self.cycles.eq(self.cycles + 1)
            # The loop's end, as the fetch marked it: a trip ends (ITER counts up), or the last.
            with m.If(advance & ir_back):
                m.d.sync += loop_iter.eq(loop_iter + 1)
            with m.If(advance & ir_exit):
                m.d.sync += loop_active.eq(0)
            with m.Switch(op):
                with m.Case(Op.NOP):
                    m.d.comb += advance.eq(1)
                with m.Case(Op.SET, Op.ADD, Op.ADDX):
                    # Issue: the register's value (through the write-back stage's sum when
                    # the instruction before wrote it) and the addend (ADDX: the one
                    # multiplier's product, signed 16 x unsigned 32 bits: it fits the 48-bit
                    # register exactly) go to the write-back stage.
                    with m.If((op == Op.ADDX) & ~loop_active):
                        m.d.sync += [self.running.eq(0), self.done.eq(1), self.error.eq(1)]
                    with m.Else():
                        m.d.comb += advance.eq(1)
                        m.d.sync += [
                            *(w_hit[i].eq(reg_index == i) for i in range(n_regs)),
                            w_valid.eq(1),
                            w_idx.eq(reg_index),
                            w_a.eq(Mux(op == Op.ADDX, scale * loop_iter[:split], value)),
                            w_b.eq(Mux(op == Op.ADDX, scale * loop_iter[split:], 0)),
                            w_base.eq(Mux((op == Op.SET) | ~live.bit_select(reg_index, 1),
                                          0, Mux(rd_hit, last_sum, sh_rd.data))),
                            w_fwd.eq(w_valid & (w_idx == reg_index) & (op != Op.SET)),
                        ]
                with m.Case(Op.LOOP):
                    with m.If(loop_active | (body == 0)):
                        m.d.sync += [self.running.eq(0), self.done.eq(1), self.error.eq(1)]
                    with m.Else():
                        m.d.comb += advance.eq(1)
                        with m.If(count != 0):
                            m.d.sync += [loop_active.eq(1), loop_iter.eq(0)]
                with m.Case(Op.WAIT):
                    m.d.comb += advance.eq((self.busy & flags[:UNIT_BITS]) == 0)
                with m.Case(Op.HALT):
                    with m.If(self.busy == 0):
                        m.d.sync += [self.running.eq(0), self.done.eq(1)]
                for bit, launch_op in enumerate(LAUNCH_OPS):
                    if launch_op not in self._launch_ops:
                        continue
                    with m.Case(launch_op):
                        m.d.comb += [self.launch[bit].eq(1),
                                     advance.eq(self.can_launch[bit])]
                with m.Default():
                    m.d.sync += [self.running.eq(0), self.done.eq(1), self.error.eq(1)]
        return m


# Keep the unit mask width in step with the ISA.
assert int(Unit.ALL).bit_length() == UNIT_BITS
