"""Static-schedule sequencer: fetches 64-bit instructions and launches units (``hw.spec.isa``)."""

from amaranth.hdl import Array, Module, Mux, Signal, signed
from amaranth.lib import wiring
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
      write path: one read mux on the selected register, one adder, and one 16 x 32-bit
      multiplier (one instruction issues per cycle, so one product serves every register).
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
        written = Signal(signed(VALUE_BITS))   # what SET, ADD or ADDX writes
        body = flags[:LOOP_BODY_BITS]
        count = flags[LOOP_BODY_BITS:LOOP_BODY_BITS + LOOP_COUNT_BITS]
        jump = Signal()                  # a LOOP that skips its body (count 0)
        target = Signal(range(self._imem_words))

        # The registers' stored bits (the read for ADD zero-extends them: the bits above a
        # register's width are constants, not a multiplexer's inputs).
        store = [Signal(w, name=f"reg_{REGS[i].replace('.', '_')}")
                 for i, w in enumerate(self._reg_widths)]
        m.d.comb += [out.eq(r.as_signed()) for out, r in zip(self.regs, store, strict=True)]

        m.d.comb += [self.imem_addr.eq(pc), self.pc.eq(pc), target.eq(pc + 1)]
        with m.If(jump):
            m.d.comb += target.eq(pc + body + 1)
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
                m.d.comb += self.imem_addr.eq(0)
        with m.Else():
            m.d.sync += self.cycles.eq(self.cycles + 1)
            with m.Switch(op):
                with m.Case(Op.NOP):
                    m.d.comb += advance.eq(1)
                with m.Case(Op.SET, Op.ADD, Op.ADDX):
                    # ADD, ADDX: one adder on the selected register, written back as SET
                    # writes; ADDX's addend is the one multiplier's product (signed 16 x
                    # unsigned 32 bits: it fits the 48-bit register exactly). `written` is a
                    # signal, so every register's case shares the one product and sum.
                    addend = Mux(op == Op.ADDX, scale * loop_iter, value)
                    m.d.comb += written.eq(
                        Mux(op == Op.SET, value, Array(store)[reg_index] + addend))
                    with m.If((op == Op.ADDX) & ~loop_active):
                        m.d.sync += [self.running.eq(0), self.done.eq(1), self.error.eq(1)]
                    with m.Else():
                        m.d.comb += advance.eq(1)
                        with m.Switch(reg_index):
                            for i in range(len(REGS)):
                                with m.Case(i):
                                    m.d.sync += store[i].eq(written)
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
