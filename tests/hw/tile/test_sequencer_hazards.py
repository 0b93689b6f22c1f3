"""Sequencer (hw.tile.sequencer): the write-back stage's hazards, bit-exact against the ISA.

SET, ADD and ADDX write their register in the cycle after they issue (the sequencer's
write-back stage), and that cycle's readers see the new value through its bypass: a launch
(which copies the registers), and an ADD or ADDX of the same register. Each program runs on the
chip's sequencer and instruction memory (:class:`hw.fpga.units.SequencerUnit`, the tiny
preset's register widths) with launches refused at random cycles, against a reference built
from ``hw.spec.isa`` alone: the registers each launch copies, the final registers, and one
instruction per cycle (every cycle is an executed instruction or a refused launch).
"""

import numpy as np
import pytest

from hw.chip import reg_widths
from hw.fpga.units import SequencerUnit
from hw.spec import npu_preset
from hw.spec.isa import (
    REG_INDEX,
    REGS,
    Insn,
    LoopState,
    Op,
    decode,
    encode,
    loop_operand,
    sign_extend,
)
from hw.tile.sequencer import LAUNCH_OPS
from sim.rtl.pysim import run_sim
from tests.helpers import load_and_start

NPU = npu_preset("tiny")
WIDTHS = reg_widths(NPU, chip_bits=1)
#: Registers of 48, 32, 24, 16, the scratchpad address's and 1 bit, and one START clears.
WATCH = tuple(REG_INDEX[n] for n in ("CO_LEN", "CO_KIND", "AT_FLAGS", "MM_K", "RD0.base",
                                     "SR_DEST", "AT_Q_LANE"))


def _reference(program, regs=None):
    """The registers each launch copies (its opcode first), the final registers, and the
    instructions executed, by ``hw.spec.isa``'s rules (one loop, ITER, 48-bit wrapping), from
    ``regs`` (default: all 0)."""
    regs = dict.fromkeys(range(len(REGS)), 0) if regs is None else dict(regs)
    loop, pc, launches, executed = LoopState(), 0, [], 0
    while True:
        insn = decode(program[pc])
        executed += 1
        if insn.op is Op.HALT:
            return launches, regs, executed
        if insn.op is Op.LOOP:
            pc = loop.begin(pc, insn.value)
            continue
        if insn.op in (Op.SET, Op.ADD, Op.ADDX):
            regs[insn.reg] = loop.written(insn, regs[insn.reg], pc)
        elif insn.op in LAUNCH_OPS:
            launches.append((insn.op, *(regs[i] for i in WATCH)))
        pc = loop.next_pc(pc)


def _narrow(index, value):
    """What ``regs[index]`` shows for a register holding ``value``: its low bits, signed."""
    return sign_extend(value, WIDTHS[index])


def _run(program, seed, max_cycles, refuse=0.4):
    """Run ``program`` on the sequencer; launches refused with probability ``refuse``."""
    dut = SequencerUnit(npu=NPU)
    rng = np.random.default_rng(seed)
    seen = {"launches": [], "refused": 0}

    async def bench(ctx):
        await load_and_start(ctx, dut, program)
        while not ctx.get(dut.done):
            can = int(rng.integers(0, 64)) if rng.random() < refuse else 0b111111
            ctx.set(dut.can_launch, can)
            launch, pc = ctx.get(dut.launch), ctx.get(dut.pc)
            if launch & ~can:
                seen["refused"] += 1
            elif launch:
                op = LAUNCH_OPS[launch.bit_length() - 1]
                seen["launches"].append(
                    (op, *(ctx.get(dut.regs[i]) for i in WATCH)))
                assert decode(program[pc]).op is op, (pc, op)
            await ctx.tick()
        seen["error"] = ctx.get(dut.error)
        seen["cycles"] = ctx.get(dut.cycles)
        seen["regs"] = {i: ctx.get(dut.regs[i]) for i in WATCH}

    run_sim(dut, [bench], max_cycles=max_cycles)
    return seen


def _check(program, seed):
    launches, regs, executed = _reference(program)
    seen = _run(program, seed, max_cycles=4 * executed + 2000)
    assert seen["error"] == 0
    want = [(op, *(_narrow(i, v) for i, v in zip(WATCH, vals, strict=True)))
            for op, *vals in launches]
    assert len(seen["launches"]) == len(want), (seed, len(seen["launches"]), len(want))
    for k, (got, exp) in enumerate(zip(seen["launches"], want, strict=True)):
        assert got == exp, f"seed {seed}: launch {k}: {got} != {exp}"
    assert seen["regs"] == {i: _narrow(i, regs[i]) for i in WATCH}, (seed, seen["regs"])
    # One instruction per cycle: every cycle executed one, or refused a launch.
    assert seen["cycles"] == executed + seen["refused"], (seed, seen["cycles"], executed,
                                                           seen["refused"])
    return seen


R0, R1 = REG_INDEX["CO_LEN"], REG_INDEX["MM_K"]
HALT = encode(Insn(Op.HALT))


def _e(op, reg=0, value=0):
    return encode(Insn(op, reg, value))


@pytest.mark.parametrize("name,program", [
    # ADD, ADD, ADDX, SET, ADD on one register, each the cycle after the one before, and a
    # launch after each of them.
    ("back_to_back", [
        _e(Op.SET, R0, (1 << 47) - 5), _e(Op.ADD, R0, 9), _e(Op.MATMUL),
        _e(Op.LOOP, value=loop_operand(6, 3)),
        _e(Op.ADD, R0, -(1 << 40)), _e(Op.ADDX, R0, -32768), _e(Op.ADDX, R0, 32767), _e(Op.VEC),
        _e(Op.SET, R1, 65535), _e(Op.ADD, R1, 3),
        _e(Op.ATTN), HALT]),
    # A launch right after a SET of one of its registers, and after a SET of another.
    ("launch_after_set", [
        _e(Op.SET, R0, 7), _e(Op.COLL), _e(Op.SET, R1, -1), _e(Op.SET, R0, 8), _e(Op.COLL),
        _e(Op.SET, REG_INDEX["SR_DEST"], 1), _e(Op.SEND), _e(Op.SET, R0, 0), HALT]),
    # A LOOP whose last instruction is an ADDX (written back as the loop jumps), a one-
    # instruction body of an ADDX, and a launch after the loop.
    ("loop_ends_in_addx", [
        _e(Op.SET, R0, 100), _e(Op.LOOP, value=loop_operand(2, 5)), _e(Op.RECV),
        _e(Op.ADDX, R0, 3), _e(Op.LOOP, value=loop_operand(1, 4)), _e(Op.ADDX, R0, -7),
        _e(Op.MATMUL), _e(Op.LOOP, value=loop_operand(1, 0)), _e(Op.ADDX, R0, 1), _e(Op.VEC),
        HALT]),
    # ADDX's product is computed in the cycle before it issues, with the scale of the
    # instruction after the one issuing (or of the body's first at a jump back) and the ITER it
    # will see: ADDXs in a row across the jump back, the jump held by a launch's stalls, and a
    # one-instruction body after a body ending in an ADDX.
    ("addx_across_the_jump", [
        _e(Op.LOOP, value=loop_operand(2, 4)), _e(Op.ADDX, R0, -300), _e(Op.ADDX, R1, 7),
        _e(Op.LOOP, value=loop_operand(3, 3)), _e(Op.ADDX, R1, 32767), _e(Op.ADDX, R0, -32768),
        _e(Op.MATMUL), _e(Op.LOOP, value=loop_operand(1, 5)), _e(Op.ADDX, R0, 11),
        _e(Op.VEC), HALT]),
    # An ADD two instructions after a write of its register (the register's block RAM copy
    # is read a cycle ahead, before that write lands), with a launch between that may stall.
    ("one_between", [
        _e(Op.SET, R0, 11), _e(Op.NOP), _e(Op.ADD, R0, 5), _e(Op.SET, R1, 3), _e(Op.MATMUL),
        _e(Op.ADD, R1, 4), _e(Op.ADD, R0, 1), _e(Op.ADD, R1, 2), _e(Op.ADD, R0, 2),
        _e(Op.LOOP, value=loop_operand(3, 3)), _e(Op.ADDX, R0, 9), _e(Op.VEC),
        _e(Op.ADD, R0, 1), _e(Op.ATTN), HALT]),
])
def test_write_back_hazards(name, program):
    seen = _check(program, seed=sum(map(ord, name)))
    assert seen["launches"], name


@pytest.mark.parametrize("name,program", [
    # Loops at pc 0 (the fetch's first step is from word 0's copies): one instruction run
    # twice, a skip, once.
    ("loop_at_0", [_e(Op.LOOP, value=loop_operand(1, 2)), _e(Op.ADD, R0, 3), _e(Op.COLL),
                   HALT]),
    ("skip_at_0", [_e(Op.LOOP, value=loop_operand(2, 0)), _e(Op.SET, R0, 1), _e(Op.SET, R0, 2),
                   _e(Op.ADD, R0, 7), _e(Op.SEND), HALT]),
    ("once_at_0", [_e(Op.LOOP, value=loop_operand(1, 1)), _e(Op.ADDX, R0, 5), _e(Op.SEND),
                   HALT]),
    # A loop right after a loop, a skip right after a loop, a one-instruction loop of a
    # launch (the jump back held by its stalls), and a skip to the HALT.
    ("loops_in_a_row", [
        _e(Op.LOOP, value=loop_operand(2, 3)), _e(Op.ADDX, R0, 2), _e(Op.ADD, R1, 1),
        _e(Op.LOOP, value=loop_operand(1, 2)), _e(Op.ADDX, R1, 3),
        _e(Op.LOOP, value=loop_operand(1, 0)), _e(Op.ADD, R0, 100),
        _e(Op.LOOP, value=loop_operand(1, 4)), _e(Op.MATMUL),
        _e(Op.LOOP, value=loop_operand(1, 3)), _e(Op.ADDX, R0, 1), _e(Op.VEC),
        _e(Op.LOOP, value=loop_operand(1, 0)), _e(Op.ATTN), HALT]),
])
def test_fetch_around_loops(name, program):
    seen = _check(program, seed=sum(map(ord, name)))
    assert seen["launches"], name


def test_word_0_written_the_cycle_before_start():
    """``start`` takes the first instruction from copies of word 0 that the host's writes
    keep, not from a read while idle: programs loaded last word first (word 0 in the cycle
    before ``start``) run as the ISA says, one after the other, each replacing the one
    before, with the same cycles."""
    programs = [[_e(Op.SET, R0, 5), _e(Op.MATMUL), HALT],
                [_e(Op.LOOP, value=loop_operand(1, 3)), _e(Op.ADDX, R0, 2), _e(Op.MATMUL),
                 HALT],
                [_e(Op.LOOP, value=loop_operand(2, 0)), _e(Op.SET, R0, 1), _e(Op.VEC),
                 _e(Op.ADD, R0, 9), _e(Op.MATMUL), HALT],
                [HALT]]
    dut = SequencerUnit(npu=NPU)
    seen = []

    async def bench(ctx):
        ctx.set(dut.can_launch, 0b111111)
        ctx.set(dut.imem_wr.valid, 1)
        for program in programs:
            for addr in reversed(range(len(program))):
                ctx.set(dut.imem_wr.payload, {"addr": addr, "data": program[addr]})
                await ctx.tick()
            ctx.set(dut.imem_wr.valid, 0)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            launches = 0
            while not ctx.get(dut.done):
                launches += ctx.get(dut.launch) != 0
                await ctx.tick()
            seen.append((ctx.get(dut.error), ctx.get(dut.cycles), launches,
                         ctx.get(dut.regs[R0])))
            ctx.set(dut.imem_wr.valid, 1)

    run_sim(dut, [bench], max_cycles=400)
    want, regs = [], None
    for program in programs:
        launches, regs, executed = _reference(program, regs)
        want.append((0, executed, len(launches), _narrow(R0, regs[R0])))
    assert seen == want, (seen, want)


def _random_program(rng):
    """SETs, ADDs, launches, NOPs and loops (bodies ending in an ADDX or a launch, counts
    0..4) on the watched registers, mostly two of them, so that writes meet often."""
    hot = [R0, R1]

    def reg():
        return hot[int(rng.integers(0, 2))] if rng.random() < 0.7 else \
            WATCH[int(rng.integers(0, len(WATCH)))]

    def straight(addx):
        kind = int(rng.integers(0, 6 if addx else 5))
        if kind == 0:
            return _e(Op.SET, reg(), int(rng.integers(-(1 << 47), 1 << 47)))
        if kind == 1:
            return _e(Op.ADD, reg(), int(rng.integers(-(1 << 47), 1 << 47)))
        if kind in (2, 3):
            return encode(Insn(LAUNCH_OPS[int(rng.integers(0, len(LAUNCH_OPS)))]))
        if kind == 4:
            return _e(Op.NOP)
        return _e(Op.ADDX, reg(), int(rng.integers(-(1 << 15), 1 << 15)))

    program = []
    for _ in range(12):
        if rng.random() < 0.3:
            body = [straight(True) for _ in range(int(rng.integers(0, 4)))]
            body.append(_e(Op.ADDX, reg(), int(rng.integers(-(1 << 15), 1 << 15)))
                        if rng.random() < 0.6 else straight(True))
            program += [_e(Op.LOOP, value=loop_operand(len(body), int(rng.integers(0, 5)))),
                        *body]
        else:
            program.append(straight(False))
    return program + [HALT]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_programs_match_the_isa(seed):
    print(f"seed {seed}")
    _check(_random_program(np.random.default_rng(seed)), seed)


def test_add_after_start_reads_a_cleared_register_as_zero():
    """ADD reads its register from the sequencer's block RAM copy, which ``start`` does not
    clear: a register of ``START_CLEARED`` that the program before set reads 0, as its
    flip-flops do, and one that start keeps reads its value."""
    lane, kept = REG_INDEX["AT_Q_LANE"], REG_INDEX["MM_K"]
    programs = [[_e(Op.SET, lane, 1), _e(Op.SET, kept, 40), HALT],
                [_e(Op.ADD, lane, 1), _e(Op.ADD, kept, 2), _e(Op.ATTN), HALT]]
    dut = SequencerUnit(npu=NPU)
    seen = []

    async def bench(ctx):
        ctx.set(dut.can_launch, 0b111111)
        for program in programs:
            await load_and_start(ctx, dut, program)
            await ctx.tick().until(dut.done)
            seen.append((ctx.get(dut.regs[lane]), ctx.get(dut.regs[kept])))

    run_sim(dut, [bench], max_cycles=200)
    assert seen == [(1, 40), (1, 42)], seen


@pytest.mark.slow
def test_addx_past_iter_bit_17():
    """ADDX's product is two multipliers' (ITER's low 17 bits and the bits above) summed in the
    write-back stage: a loop of 2**17 + 3 trips, each adding -32768 * ITER and 32767 * ITER
    to two registers, ends where ``hw.spec.isa`` says (about 2 minutes in pysim)."""
    trips = (1 << 17) + 3
    program = [_e(Op.SET, R0, 5), _e(Op.LOOP, value=loop_operand(2, trips)),
               _e(Op.ADDX, R0, -32768), _e(Op.ADDX, R1, 32767), _e(Op.MATMUL), HALT]
    _check(program, seed=17)
