"""Static-schedule sequencer: fetches 64-bit instructions and launches units (``hw.spec.isa``)."""

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import wiring
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

    Timing: one instruction per cycle when nothing stalls (the instruction memory's read
    address is the next pc, so its synchronous read delivers the instruction just in time).
    ``cycles`` counts from the cycle after ``start`` to ``done``.

    Members
    -------
    start : In(1)        pulse: run from pc 0 (ignored while running); clears the registers
                         of ``hw.spec.isa.START_CLEARED``
    done, error : Out(1) set when the program halts (cleared by ``start``)
    running : Out(1)
    cycles : Out(32)
    imem_addr : Out(range(imem_words)), imem_data : In(64)   synchronous read port
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
            "imem_addr": Out(range(imem_words)),
            "imem_data": In(INSN_BITS),
            "regs": Out(signed(VALUE_BITS)).array(len(REGS)),
            "launch": Out(len(LAUNCH_OPS)),
            "can_launch": In(len(LAUNCH_OPS)),
            "busy": In(UNIT_BITS),
            "pc": Out(range(imem_words)),
        })

    def elaborate(self, platform):
        m = Module()
        pc = Signal(range(self._imem_words))
        insn = self.imem_data
        op = insn[:OPCODE_BITS]
        reg_index = insn[OPCODE_BITS:OPCODE_BITS + REG_BITS]
        value = insn[OPCODE_BITS + REG_BITS:].as_signed()
        flags = insn[OPCODE_BITS:]
        advance = Signal()
        loop_active = Signal()
        loop_start = Signal(range(self._imem_words))
        loop_end = Signal(range(self._imem_words))
        loop_left = Signal(LOOP_COUNT_BITS)
        loop_iter = Signal(ITER_BITS)    # ITER: the running trip's index
        scale = insn[OPCODE_BITS + REG_BITS:OPCODE_BITS + REG_BITS + ADDX_SCALE_BITS].as_signed()
        body = flags[:LOOP_BODY_BITS]
        count = flags[LOOP_BODY_BITS:LOOP_BODY_BITS + LOOP_COUNT_BITS]
        jump = Signal()                  # a LOOP that skips its body (count 0)
        target = Signal(range(self._imem_words))

        # The registers' stored bits: what the units copy at a launch.
        store = [Signal(w, name=f"reg_{REGS[i].replace('.', '_')}")
                 for i, w in enumerate(self._reg_widths)]

        # The write-back stage. A SET, ADD or ADDX issued in cycle t (from the instruction
        # memory's output) leaves in registers which register it writes (`w_hit`, one bit per
        # register, and `w_idx`), its addend (`w_addend`: the value, or ADDX's product of the
        # scale and ITER) and where the register's value comes from; in cycle t + 1 `w_sum`,
        # that value plus the addend, is written. `w_sum` is what the register reads in cycle
        # t + 1: on `regs` (a launch in cycle t + 1 copies it) and as the value of an ADD or
        # ADDX of the same register issued in cycle t + 1 (`w_fwd`).
        #
        # The value an ADD reads comes from `shadow`, a block RAM copy of the registers (the
        # 48-bit sums; each register keeps the low bits of its sum, which wrap as the sum's
        # do), read in cycle t at the instruction's register index: no multiplexer over the
        # registers. `live` marks the registers written since reset (`start` clears those of
        # START_CLEARED): the others read 0, as their flip-flops do.
        n_regs = len(REGS)
        m.submodules.shadow = shadow = Memory(shape=VALUE_BITS, depth=n_regs, init=[])
        sh_rd, sh_wr = shadow.read_port(), shadow.write_port()
        live = Signal(n_regs)
        w_hit = Signal(n_regs)
        w_valid = Signal()               # any bit of w_hit
        w_idx = Signal(REG_BITS)         # the register of w_hit
        w_value = Signal(VALUE_BITS)     # SET and ADD's value
        w_addx = Signal()
        # ADDX's product of the scale and ITER, as two partial products, each one 18 x 18
        # multiplier's (ITER's low 17 bits, and the 15 above): registered at the multipliers'
        # outputs, summed in the write-back stage, beside the register's read.
        split = 17
        w_plo = Signal(signed(ADDX_SCALE_BITS + split))
        w_phi = Signal(signed(ADDX_SCALE_BITS + ITER_BITS - split))
        w_set = Signal()                 # SET: the value is 0 + the addend
        w_fwd = Signal()                 # the instruction before wrote the same register
        w_live = Signal()                # live[] of the register
        last_sum = Signal(VALUE_BITS)    # w_sum of the cycle before
        w_old = Signal(VALUE_BITS)
        w_sum = Signal(VALUE_BITS)
        m.d.comb += [
            sh_rd.addr.eq(reg_index),
            w_old.eq(Mux(w_set, 0, Mux(w_fwd, last_sum, Mux(w_live, sh_rd.data, 0)))),
            w_sum.eq(w_old + Mux(w_addx, w_plo + (w_phi << split), w_value)),
            sh_wr.addr.eq(w_idx), sh_wr.data.eq(w_sum), sh_wr.en.eq(w_valid),
        ]
        m.d.sync += [w_hit.eq(0), w_valid.eq(0), last_sum.eq(w_sum)]
        for i, r in enumerate(store):
            with m.If(w_hit[i]):
                m.d.sync += [r.eq(w_sum), live[i].eq(1)]
        m.d.comb += [out.eq(Mux(w_hit[i], w_sum[:len(r)], r).as_signed())
                     for i, (out, r) in enumerate(zip(self.regs, store, strict=True))]

        # The next pc: the instruction memory's read address, from its output in the same
        # cycle. pc + 1 comes from the pc register alone, so that a LOOP's skip adds only the
        # body length to it after the instruction arrives (one carry chain, not two).
        pc1 = Signal(range(self._imem_words + 1))
        m.d.comb += [self.imem_addr.eq(pc), self.pc.eq(pc), pc1.eq(pc + 1), target.eq(pc1)]
        with m.If(jump):
            m.d.comb += target.eq(pc1 + body)
        with m.Elif(loop_active & (pc == loop_end)):
            with m.If(loop_left != 0):
                m.d.comb += target.eq(loop_start)
                with m.If(advance):
                    m.d.sync += [loop_left.eq(loop_left - 1), loop_iter.eq(loop_iter + 1)]
            with m.Elif(advance):
                m.d.sync += loop_active.eq(0)
        with m.If(advance):
            m.d.comb += self.imem_addr.eq(target)
            m.d.sync += pc.eq(target)

        with m.If(~self.running):
            with m.If(self.start):
                m.d.sync += [self.running.eq(1), self.done.eq(0), self.error.eq(0),
                             self.cycles.eq(0), pc.eq(0), loop_active.eq(0)]
                m.d.sync += [store[REG_INDEX[name]].eq(0) for name in START_CLEARED]
                m.d.sync += [live[REG_INDEX[name]].eq(0) for name in START_CLEARED]
                m.d.comb += self.imem_addr.eq(0)
        with m.Else():
            m.d.sync += self.cycles.eq(self.cycles + 1)
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
                            w_value.eq(value), w_addx.eq(op == Op.ADDX),
                            w_plo.eq(scale * loop_iter[:split]),
                            w_phi.eq(scale * loop_iter[split:]),
                            w_set.eq(op == Op.SET),
                            w_fwd.eq(w_valid & (w_idx == reg_index)),
                            w_live.eq(live.bit_select(reg_index, 1)),
                        ]
                with m.Case(Op.LOOP):
                    with m.If(loop_active | (body == 0)):
                        m.d.sync += [self.running.eq(0), self.done.eq(1), self.error.eq(1)]
                    with m.Else():
                        m.d.comb += [advance.eq(1), jump.eq(count == 0)]
                        with m.If(count != 0):
                            m.d.sync += [loop_active.eq(1), loop_start.eq(pc + 1),
                                         loop_end.eq(pc + body), loop_left.eq(count - 1),
                                         loop_iter.eq(0)]
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
