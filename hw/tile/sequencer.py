"""Static-schedule sequencer: fetches 64-bit instructions and launches units (``hw.spec.isa``)."""

from types import SimpleNamespace

from amaranth.hdl import Cat, Module, Mux, Shape, Signal, Value, signed
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


def _columns(m, name, shape, depth, init):
    """A memory of ``depth`` words of ``shape`` (its ``init`` as integers) with one
    synchronous read port and one write port, built of memories as narrow as the widest
    ECP5 block RAM port that is at least ``depth`` words deep (4 bits for 4,096 words, 9 for
    2,048, 18 for 1,024): each maps to block RAMs side by side, so the read data leaves the
    block RAMs without a multiplexer over several of them (which Yosys builds when it stacks
    wider, shallower configurations). Returns the read and write ports' signals as
    ``(rd, wr)``, ``rd`` with ``addr``, ``en``, ``data`` and ``wr`` with ``addr``, ``en``,
    ``data``."""
    width = Shape.cast(shape).width if not isinstance(shape, data.Layout) else shape.size
    col = next((w for d, w in _BRAM_CONFIGS if depth <= d), 1)
    rd = SimpleNamespace(addr=Signal(range(depth), name=f"{name}_raddr"),
                         en=Signal(name=f"{name}_ren"), data=Signal(shape, name=f"{name}_rdata"))
    wr = SimpleNamespace(addr=Signal(range(depth), name=f"{name}_waddr"),
                         en=Signal(name=f"{name}_wen"), data=Signal(shape, name=f"{name}_wdata"))
    raw_rd, raw_wr = Value.cast(rd.data), Value.cast(wr.data)
    for k, lo in enumerate(range(0, width, col)):
        hi = min(width, lo + col)
        mem = Memory(shape=hi - lo, depth=depth,
                     init=[(v >> lo) & ((1 << (hi - lo)) - 1) for v in init])
        m.submodules[f"{name}{k}"] = mem
        r, w = mem.read_port(), mem.write_port()
        m.d.comb += [r.addr.eq(rd.addr), r.en.eq(rd.en), raw_rd[lo:hi].eq(r.data),
                     w.addr.eq(wr.addr), w.en.eq(wr.en), w.data.eq(raw_wr[lo:hi])]
    return rd, wr


#: The ECP5 block RAM's (DP16KD) configurations: (words, bits).
_BRAM_CONFIGS = ((512, 36), (1024, 18), (2048, 9), (4096, 4), (8192, 2), (16384, 1))


class Sequencer(wiring.Component):
    """Execute a program from instruction memory, one instruction per cycle.

    - ``SET reg, value`` writes the configuration register file (``regs``); ``ADD reg, value``
      adds to it (48 bits, wrapping); ``ADDX reg, scale`` adds ``scale * ITER``, the loop's
      iteration index times the low 16 bits of the value field (signed). All three share one
      write path (one instruction issues per cycle, so one product and one sum serve every
      register): in the cycle it issues, the instruction adds its addend (the value, or the
      one 16 x 32-bit multiplier's product) to its register's value, read a cycle ahead from
      a block RAM copy of the registers (no multiplexer over the registers), into a
      flip-flop; in the next cycle that sum is written, and is what that cycle reads of the
      register: ``regs`` (a launch in that cycle copies it) and the value of an ADD or ADDX
      of the same register issued in that cycle. To a program, SET, ADD and ADDX write in
      the cycle they issue.
    - ``LOOP body, count`` runs the next ``body`` instructions ``count`` times (0: skips them):
      it records the body's first and last pc and the trips left (the fetch keeps a copy one
      instruction ahead, below); completing the last instruction of the body with trips left
      goes back to the first (the same cycle as any other advance: no cycle is lost at the
      jump). A LOOP inside a body, or with an empty body, halts with ``error``
      (``hw.spec.isa.LoopState`` is the same rule in Python). ITER (``loop_iter``) is 0 at
      the LOOP and counts up at each jump back; an ADDX outside a loop body halts with
      ``error``.
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
        # (a + 1, or for a LOOP of count 0, a + 1 + body, the skip), and what the fetch needs
        # to know of a LOOP (a LOOP of count >= 1, a body of 1, a count >= 2), decoded as the
        # word is written, so that the fetch's next read address is one of two registers or
        # this block RAM's output, and its loop registers' enables three of its bits.
        # Both are built of columns one block RAM deep (`_columns`): no multiplexer after them.
        meta = data.StructLayout({"next": aw, "loop": 1, "one": 1, "many": 1})
        rd, wr = _columns(m, "imem", INSN_BITS, words, [])
        nrd, nwr = _columns(m, "inext", meta, words,
                            [(a + 1) % (1 << aw) for a in range(words)])
        wp = self.imem_wr.payload
        w_body = wp.data[OPCODE_BITS:OPCODE_BITS + LOOP_BODY_BITS]
        w_count = wp.data[OPCODE_BITS + LOOP_BODY_BITS:OPCODE_BITS + LOOP_BODY_BITS
                          + LOOP_COUNT_BITS]
        w_loop = wp.data[:OPCODE_BITS] == Op.LOOP
        w_next = Signal(meta)
        m.d.comb += [
            self.imem_wr.ready.eq(1),
            w_next.next.eq(wp.addr + 1 + Mux(w_loop & (w_count == 0), w_body, 0)),
            w_next.loop.eq(w_loop & (w_count != 0)),
            w_next.one.eq(w_body == 1),
            w_next.many.eq(w_count[1:] != 0),
            wr.en.eq(self.imem_wr.valid), wr.addr.eq(wp.addr), wr.data.eq(wp.data),
            nwr.en.eq(self.imem_wr.valid), nwr.addr.eq(wp.addr), nwr.data.eq(w_next),
        ]
        # Word 0 and its next address, kept in flip-flops as the host writes them: `start`
        # loads the first instruction from them (no read while idle to be stale).
        first = Signal(INSN_BITS)
        first_next = Signal(meta, init={"next": 1 % (1 << aw)})
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
        f_trips = Signal(LOOP_COUNT_BITS)  # the trips left, the running one included
        f_more = Signal()                # f_trips >= 2
        f_one = Signal()                 # a body of one instruction (f_start == f_end)
        fetch = Signal()                 # ir takes the next instruction
        addr = Signal(aw)                # the memories' read address
        back_or_first = Signal(aw)
        src = Signal(INSN_BITS)          # the instruction ir takes: the memory's, or word 0
        src_pc = Signal(aw)
        s_meta = Signal(meta)
        m.d.comb += [
            src.eq(Mux(self.running, rd.data, first)),
            s_meta.eq(Mux(self.running, nrd.data, first_next)),
            src_pc.eq(Mux(self.running, pn, 0)),
            back_or_first.eq(Mux(self.running, f_start, first_next.next)),
            addr.eq(Mux(self.running & ~pn_back, nrd.data.next, back_or_first)),
            rd.addr.eq(addr), nrd.addr.eq(addr),
            rd.en.eq(fetch | ~self.running), nrd.en.eq(fetch | ~self.running),
        ]
        s_body = src[OPCODE_BITS:OPCODE_BITS + LOOP_BODY_BITS]
        s_count = src[OPCODE_BITS + LOOP_BODY_BITS:OPCODE_BITS + LOOP_BODY_BITS
                      + LOOP_COUNT_BITS]
        s_one, s_many = s_meta.one, s_meta.many
        # What the execution needs to know at once of `ir` (whether it advances), decoded as
        # it is loaded: `d_plain` NOP, SET or ADD; `d_launch` a launch of a unit the chip has.
        s_op = src[:OPCODE_BITS]
        d_plain, d_addx, d_loop, d_body0, d_wait, d_write = (
            Signal(name=n) for n in ("d_plain", "d_addx", "d_loop", "d_body0", "d_wait",
                                     "d_write"))
        d_launch = Signal(len(LAUNCH_OPS))
        near = Signal()                  # the address after pn is the loop body's last
        m.d.comb += near.eq(self.running & f_active & ((pn + 1)[:aw] == f_end))
        with m.If(fetch):
            m.d.sync += [pc.eq(src_pc), ir.eq(src), pn.eq(addr),
                         ir_back.eq(self.running & pn_back),
                         ir_exit.eq(self.running & pn_exit),
                         d_plain.eq((s_op == Op.NOP) | (s_op == Op.SET) | (s_op == Op.ADD)),
                         d_addx.eq(s_op == Op.ADDX), d_loop.eq(s_op == Op.LOOP),
                         d_write.eq((s_op == Op.SET) | (s_op == Op.ADD) | (s_op == Op.ADDX)),
                         d_body0.eq(s_body == 0), d_wait.eq(s_op == Op.WAIT),
                         *(d_launch[bit].eq(s_op == launch_op)
                           for bit, launch_op in enumerate(LAUNCH_OPS)
                           if launch_op in self._launch_ops)]
            with m.If(s_meta.loop):
                # A LOOP (its errors are the execution's): its body's last instruction ends
                # a trip when it is the next.
                m.d.sync += [f_active.eq(1), f_start.eq(src_pc + 1), f_end.eq(src_pc + s_body),
                             f_trips.eq(s_count), f_more.eq(s_many), f_one.eq(s_one),
                             pn_back.eq(s_one & s_many), pn_exit.eq(s_one & ~s_many)]
            with m.Elif(self.running & pn_back):
                m.d.sync += [f_trips.eq(f_trips - 1), f_more.eq(f_trips > 2),
                             pn_back.eq(f_one & (f_trips > 2)),
                             pn_exit.eq(f_one & (f_trips == 2))]
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
        with m.If(self.running):
            m.d.comb += [
                self.launch.eq(d_launch),
                advance.eq(d_plain | (d_addx & loop_active)
                           | (d_loop & ~loop_active & ~d_body0)
                           | (d_wait & ((self.busy & flags[:UNIT_BITS]) == 0))
                           | (d_launch & self.can_launch).any()),
            ]

        # The registers' stored bits: what the units copy at a launch.
        store = [Signal(w, name=f"reg_{REGS[i].replace('.', '_')}")
                 for i, w in enumerate(self._reg_widths)]

        # SET, ADD and ADDX. One issued in cycle t computes its register's new value in that
        # cycle: the register's value (0 for a SET) plus the addend (the value, or ADDX's
        # product of the scale and ITER as two partial products, each one 18 x 18
        # multiplier's: ITER's low 17 bits, and the 15 above), in one carry-save layer and
        # one carry chain, into the flip-flops `w_sum` (and `w_hit`, one bit per register,
        # `w_idx`). In cycle t + 1 `w_sum` is written to the register, and is what the
        # register reads in that cycle: on `regs` (a launch in cycle t + 1 copies it) and as
        # the value of an ADD or ADDX of the same register issued in cycle t + 1.
        #
        # The value an ADD reads comes from `shadow`, a block RAM copy of the registers (the
        # 48-bit sums; each register keeps the low bits of its sum, which wrap as the sum's
        # do): no multiplexer over the registers. It is read a cycle ahead, at the register
        # index of the instruction `ir` takes next (`src`), so that its output is there as
        # the instruction issues. The two writes that read does not see come from flip-flops:
        # the one in the cycle of the read (`p_sum`) and the one in the cycle of the issue
        # (`w_sum`). `live` marks the registers written since reset (`start` clears those
        # of START_CLEARED): the others read 0, as their flip-flops do.
        n_regs = len(REGS)
        m.submodules.shadow = shadow = Memory(shape=VALUE_BITS, depth=n_regs, init=[])
        sh_rd, sh_wr = shadow.read_port(), shadow.write_port()
        live = Signal(n_regs)
        w_hit = Signal(n_regs)
        w_valid = Signal()               # any bit of w_hit
        w_idx = Signal(REG_BITS)         # the register of w_hit
        w_sum = Signal(VALUE_BITS)       # its value
        p_sum = Signal(VALUE_BITS)       # w_sum of the cycle before
        split = 17
        i_old = Signal(VALUE_BITS)       # the issuing instruction's register value
        i_a = Signal(VALUE_BITS)         # its addend: the value, or scale * ITER[:17] ...
        i_b = Signal(VALUE_BITS)         # ... and 0, or scale * ITER[17:] * 2**17
        i_t = Signal(VALUE_BITS)         # i_a ^ i_b, i_a & i_b, i_a | i_b: the carry-save
        i_g = Signal(VALUE_BITS)         # layer's terms without the register's value, so
        i_p = Signal(VALUE_BITS)         # that the value meets them in one LUT per bit
        i_carry = Signal(VALUE_BITS)
        i_sum = Signal(VALUE_BITS)
        is_addx = op == Op.ADDX
        # Where the register's value comes from, chosen as `ir` takes the instruction (from
        # `src`'s register index): `w_sum` (the instruction `ir` holds then writes it),
        # `p_sum` (the write in that cycle), or the shadow if the register is live, or none
        # (a SET). `live` is looked up in two steps: the 16 bits of the register's row as
        # `ir` takes the instruction (as `start` leaves them, when it is the first), the bit
        # as it issues.
        src_reg = src[OPCODE_BITS:OPCODE_BITS + REG_BITS]
        o_w, o_p, o_rd = Signal(), Signal(), Signal()
        s_set = src[:OPCODE_BITS] == Op.SET
        by_ir = self.running & d_write & (reg_index == src_reg)
        by_w = w_valid & (w_idx == src_reg)
        cleared = sum(1 << REG_INDEX[name] for name in START_CLEARED)
        live_row = Signal(16)
        live_then = Signal(16 * -(-n_regs // 16))
        m.d.comb += live_then.eq(Mux(self.running, live, live & ~cleared))
        with m.If(fetch):
            m.d.sync += [o_w.eq(~s_set & by_ir), o_p.eq(~s_set & ~by_ir & by_w),
                         o_rd.eq(~s_set & ~by_ir & ~by_w),
                         live_row.eq(live_then.word_select(src_reg[4:], 16))]
        i_other = Signal(VALUE_BITS)     # the value from the flip-flops
        i_rd = Signal()                  # the value from the shadow
        m.d.comb += [
            sh_rd.addr.eq(src_reg),
            i_other.eq(Mux(o_w, w_sum, 0) | Mux(o_p, p_sum, 0)),
            i_rd.eq(o_rd & live_row.bit_select(reg_index[:4], 1)),
            i_old.eq(i_other | Mux(i_rd, sh_rd.data, 0)),
            i_a.eq(Mux(is_addx, scale * loop_iter[:split], value)),
            i_b.eq(Mux(is_addx, scale * loop_iter[split:], 0) << split),
            i_t.eq(i_a ^ i_b), i_g.eq(i_a & i_b), i_p.eq(i_a | i_b),
            i_carry.eq(Cat(*(Mux(i_old[j], i_p[j], i_g[j]) for j in range(VALUE_BITS)))
                       << 1),
            i_sum.eq((i_old ^ i_t) + i_carry),
            sh_wr.addr.eq(w_idx), sh_wr.data.eq(w_sum), sh_wr.en.eq(w_valid),
        ]
        m.d.sync += [w_hit.eq(0), w_valid.eq(0),
                     p_sum.eq(w_sum)]
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
            # Whether `ir` advances is `advance`, from its decode above; here what it does.
            with m.Switch(op):
                with m.Case(Op.NOP, Op.WAIT, *self._launch_ops):
                    pass
                with m.Case(Op.SET, Op.ADD, Op.ADDX):
                    # Issue: the register's new value (ADDX's product, signed 16 x unsigned
                    # 32 bits, fits the 48-bit register exactly) is written in the next cycle.
                    with m.If((op == Op.ADDX) & ~loop_active):
                        m.d.sync += [self.running.eq(0), self.done.eq(1), self.error.eq(1)]
                    with m.Else():
                        m.d.sync += [
                            *(w_hit[i].eq(reg_index == i) for i in range(n_regs)),
                            w_valid.eq(1),
                            w_idx.eq(reg_index),
                            w_sum.eq(i_sum),
                        ]
                with m.Case(Op.LOOP):
                    with m.If(loop_active | (body == 0)):
                        m.d.sync += [self.running.eq(0), self.done.eq(1), self.error.eq(1)]
                    with m.Elif(count != 0):
                        m.d.sync += [loop_active.eq(1), loop_iter.eq(0)]
                with m.Case(Op.HALT):
                    with m.If(self.busy == 0):
                        m.d.sync += [self.running.eq(0), self.done.eq(1)]
                with m.Default():
                    m.d.sync += [self.running.eq(0), self.done.eq(1), self.error.eq(1)]
        return m


# Keep the unit mask width in step with the ISA.
assert int(Unit.ALL).bit_length() == UNIT_BITS
