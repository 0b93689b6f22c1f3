"""The sequencer's counted loop (``LOOP body, count`` with ``ADD`` per iteration, ``ADDX`` for
the iteration index's multiples): the spec's rule, the ISS, both timing models and the gateware
agree; imem does not grow with the count."""

import numpy as np
import pytest

from hw.spec.isa import (
    ITER_BITS,
    VALUE_BITS,
    Insn,
    IsaError,
    LoopState,
    Op,
    Unit,
    addx_value,
    decode,
    disassemble,
    encode,
    loop_operand,
    reg,
)
from hw.spec.memory import pack_rows, unpack_rows
from sim.compiler.assembler import Assembler
from sim.compiler.vector_launch import Rows, add_launch
from sim.golden.vector import residual_add
from sim.iss import Iss, IssError
from sim.rtl.chip_runner import run_chip_pysim
from sim.timing.cycle import ChipModel, time_programs
from sim.timing.launch import time_programs_fast
from tests.helpers import seeded, small_npu

LEN, ACC, X = 8, 200, 0          # int16 rows of 8 elements; the sum at word 200, rows from 0


def row_words(npu):
    return LEN * 2 // npu.array_size


def sum_program(npu, count: int, *, unrolled: bool = False) -> list[int]:
    """``acc += x[i]`` for ``i < count`` (saturating int16 ADD), the row address advanced by
    ``ADD RD4.base`` in a loop (or the loop's body repeated ``count`` times)."""
    rw = row_words(npu)
    launch = add_launch(size=npu.array_size, length=LEN, a=Rows(ACC, 1, rw, 2),
                        b=Rows(X, 1, rw, 2), out=Rows(ACC, 1, rw, 2))
    asm = Assembler()
    for gen, desc in launch.descs.items():
        asm.set_desc(gen, desc)
    for name, value in launch.regs.items():
        asm.set(name, value)
    handle = None if unrolled else asm.loop_begin(count)
    for _ in range(count if unrolled else 1):
        asm.launch(Op.VEC)
        asm.wait(Unit.VEC)
        asm.add("RD4.base", rw)
    if handle is not None:
        asm.loop_end(handle)
    asm.halt()
    return asm.words()


def rows_and_sum(npu, count, seed):
    x = seeded(seed).integers(-20000, 20000, (count, LEN))
    acc0 = seeded(seed + 1).integers(-20000, 20000, (1, LEN))
    want = acc0
    for i in range(count):
        want = residual_add(want, x[i:i + 1])
    images = {X: pack_rows(x, 2, npu.array_size), ACC: pack_rows(acc0, 2, npu.array_size)}
    return images, want


def run_iss(npu, program, images):
    iss = Iss(npu)
    for base, words in images.items():
        iss.write_words(base, words)
    executed = iss.run(program)
    return iss, executed


def test_loop_state_rule():
    s = LoopState()
    assert s.begin(4, loop_operand(2, 3)) == 5
    walk = [5]
    for _ in range(6):
        walk.append(s.next_pc(walk[-1]))
    assert walk == [5, 6, 5, 6, 5, 6, 7]
    assert not s.active
    assert LoopState().begin(4, loop_operand(3, 0)) == 8          # count 0 skips the body
    s = LoopState()
    s.begin(0, loop_operand(2, 2))
    with pytest.raises(IsaError, match="LOOP at pc 1 inside the loop of pc 0"):
        s.begin(1, loop_operand(1, 1))
    with pytest.raises(IsaError, match="LOOP at pc 3 has an empty body"):
        LoopState().begin(3, 5 << 16)
    with pytest.raises(IsaError, match="LOOP body 0 outside 1..65535"):
        loop_operand(0, 1)
    with pytest.raises(IsaError, match="LOOP count -1 outside"):
        loop_operand(1, -1)


def test_encoding():
    word = encode(Insn(Op.ADD, reg("RD4.base"), -3))
    assert decode(word) == Insn(Op.ADD, reg("RD4.base"), -3)
    assert disassemble(word).split() == ["ADD", "RD4.base", "-3"]
    word = encode(Insn(Op.LOOP, 0, loop_operand(3, 70000)))
    assert disassemble(word).split() == ["LOOP", "3", "x70000"]


@pytest.mark.parametrize("count", [1, 2, 5])
def test_iss_loop_equals_golden_and_unrolled(count):
    npu = small_npu()
    images, want = rows_and_sum(npu, count, 10 + count)
    looped, executed = run_iss(npu, sum_program(npu, count), images)
    unrolled, _ = run_iss(npu, sum_program(npu, count, unrolled=True), images)
    got = unpack_rows(looped.read_words(ACC, row_words(npu)), 1, LEN, 2)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"element {tuple(bad[0])}: {got[tuple(bad[0])]} != {want[tuple(bad[0])]}"
    assert np.array_equal(looped.mem, unrolled.mem)
    setup = len(sum_program(npu, count)) - 5                    # before the LOOP
    assert executed == setup + 1 + 3 * count + 1
    assert looped.launches[Op.VEC] == count


def test_imem_does_not_grow_with_the_count():
    npu = small_npu()
    assert len(sum_program(npu, 16)) == len(sum_program(npu, 2))
    assert len(sum_program(npu, 16, unrolled=True)) > len(sum_program(npu, 2, unrolled=True))


@pytest.mark.parametrize("count", [1, 3])
def test_timing_models_agree(count):
    """The loop costs its LOOP instruction only: the jump back takes no cycle."""
    npu = small_npu()
    looped = time_programs(npu, [sum_program(npu, count)]).cycles
    unrolled = time_programs(npu, [sum_program(npu, count, unrolled=True)]).cycles
    assert looped == unrolled + 1
    assert time_programs_fast(npu, [sum_program(npu, count)]).cycles == looped


def nested_loops():
    """A LOOP inside another's body: an error at the inner LOOP (pc 1)."""
    asm = Assembler()
    outer = asm.loop_begin(2)
    inner = asm.loop_begin(2)
    asm.insns.append(Insn(Op.NOP))
    asm.loop_end(inner)
    asm.loop_end(outer)
    asm.halt()
    return asm


def test_nested_loop_is_an_error():
    npu = small_npu()
    asm = nested_loops()
    with pytest.raises(IssError, match="LOOP at pc 1 inside the loop of pc 0"):
        Iss(npu).run(asm.words())
    assert time_programs(npu, [asm.words()]).cycles == 2       # halts with error at pc 1
    with pytest.raises(ValueError, match="at least one instruction"):
        Assembler().loop_end(Assembler().loop_begin(1))


def test_gateware_loop_equals_iss_and_timing():
    """pysim of the chip: the loop's memory equals the ISS's and its cycles the timing
    model's; a nested LOOP halts with ``error`` in the cycles the model gives."""
    npu = small_npu()
    count = 3
    images, _ = rows_and_sum(npu, count, 40)
    program = sum_program(npu, count)
    iss, _ = run_iss(npu, program, images)
    rtl = run_chip_pysim(npu, program, images, [(ACC, row_words(npu))], max_cycles=2000)
    assert not rtl["error"]
    want = iss.read_words(ACC, row_words(npu))
    bad = np.argwhere(rtl["regions"][0] != want)
    assert bad.size == 0, f"word {ACC + bad[0][0]} byte {bad[0][1]} differs from the ISS"
    assert rtl["cycles"] == time_programs(npu, [program]).cycles
    asm = nested_loops()
    rtl = run_chip_pysim(npu, asm.words(), {}, [], max_cycles=100)
    assert rtl["error"] and rtl["cycles"] == time_programs(npu, [asm.words()]).cycles


# --- ADDX reg, scale: reg += scale * ITER ------------------------------------------------------

def wrap48(value: int) -> int:
    """``value`` as a 48-bit two's complement register holds it (written out independently of
    ``hw.spec.isa``)."""
    half = 1 << (VALUE_BITS - 1)
    return (value + half) % (1 << VALUE_BITS) - half


def addx_word(name: str, scale: int) -> int:
    """An ADDX word with any value field (bypassing the assembler's range check)."""
    return int(Op.ADDX) | reg(name) << 6 | (scale & ((1 << VALUE_BITS) - 1)) << 16


def test_loop_state_iteration():
    """ITER is 0 in the first trip and counts up at each jump back; outside a body: an error."""
    s = LoopState()
    with pytest.raises(IsaError, match="ADDX at pc 2 outside a loop body"):
        s.iteration_at(2)
    pc = s.begin(0, loop_operand(2, 4))
    seen = []
    while pc <= 2:
        seen.append((pc, s.iteration_at(pc)))
        pc = s.next_pc(pc)
    assert seen == [(p, i) for i in range(4) for p in (1, 2)], seen
    with pytest.raises(IsaError, match="ADDX at pc 3 outside a loop body"):
        s.iteration_at(3)
    s.begin(5, loop_operand(1, 2))                  # a second loop starts again from 0
    assert s.iteration_at(6) == 0


@pytest.mark.parametrize("scale", [-32768, -1, 0, 7, 32767])
def test_addx_encoding(scale):
    word = encode(Insn(Op.ADDX, reg("WR1.base"), scale))
    assert word & 0x3F == 6
    assert decode(word) == Insn(Op.ADDX, reg("WR1.base"), scale)
    assert disassemble(word).split() == ["ADDX", "WR1.base", str(scale)]
    asm = Assembler()
    asm.addx("WR1.base", scale)
    assert asm.words() == [word]


@pytest.mark.parametrize("scale", [32768, -32769, 1 << 40])
def test_addx_scale_range(scale):
    """A scale outside signed 16 bits: refused by the encoder, the assembler, the ISS (a
    ValueError naming it) and both timing models."""
    with pytest.raises(ValueError, match=f"ADDX scale {scale} outside -32768..32767"):
        encode(Insn(Op.ADDX, reg("RD3.base"), scale))
    with pytest.raises(ValueError, match=f"ADDX scale {scale} outside -32768..32767"):
        Assembler().addx("RD3.base", scale)
    program = [encode(Insn(Op.LOOP, 0, loop_operand(1, 2))), addx_word("RD3.base", scale),
               encode(Insn(Op.HALT))]
    with pytest.raises(ValueError, match=f"chip 0 pc 1: ADDX scale {scale} outside"):
        Iss(small_npu()).run(program)
    for timer in (time_programs, time_programs_fast):
        with pytest.raises(IssError, match=f"chip 0 pc 1: ADDX scale {scale} outside"):
            timer(small_npu(), [program])


def test_addx_value_extremes():
    """The 16 x 32-bit product is exact; the sum wraps at 48 bits like ADD's."""
    top = (1 << ITER_BITS) - 1
    assert addx_value(0, -32768, top) == -32768 * top
    assert addx_value(0, 32767, top) == 32767 * top
    assert addx_value((1 << 47) - 1, 1, 1) == -(1 << 47)
    assert addx_value(-(1 << 47), -32768, top) == wrap48(-(1 << 47) - 32768 * top)
    with pytest.raises(IsaError, match="ADDX iteration -1 outside"):
        addx_value(0, 1, -1)


@pytest.mark.parametrize("count, scale, init", [
    (1, 5, 0), (4, -3, 100), (7, 32767, (1 << 47) - 10), (5, -32768, -(1 << 47) + 3)])
def test_iss_addx_across_iterations(count, scale, init):
    """Per trip: ``SET RD3.base, init`` then ``ADDX RD3.base`` leaves init + scale*i (the last
    trip's i = count - 1); ``ADDX RD4.base`` alone accumulates scale * (0 + 1 + ... + i); both
    as the cycle model's registers hold them too."""
    asm = Assembler()
    asm.set("RD4.base", init)
    handle = asm.loop_begin(count)
    asm.set("RD3.base", init)
    asm.addx("RD3.base", scale)
    asm.addx("RD4.base", scale)
    asm.loop_end(handle)
    asm.halt()
    iss = Iss(small_npu())
    executed = iss.run(asm.words())
    assert executed == 1 + 1 + 3 * count + 1
    want3 = wrap48(init + scale * (count - 1))
    want4 = wrap48(init + scale * (count * (count - 1) // 2))
    got = {name: int(iss.regs[reg(name)]) for name in ("RD3.base", "RD4.base")}
    assert got == {"RD3.base": want3, "RD4.base": want4}, (got, want3, want4)
    model, cycle = ChipModel(small_npu(), asm.words()), 0
    while model.running:                          # a lone chip, as time_programs walks it
        model.pre(cycle)
        model.ring([None], [False])
        model.post(cycle)
        cycle += 1
    assert [model.regs[reg(n)] for n in ("RD3.base", "RD4.base")] == [want3, want4]


def addx_outside(after_loop: bool) -> list[int]:
    """ADDX at pc 2: after a loop of one NOP run twice, or after two NOPs (no loop at all)."""
    first = Insn(Op.LOOP, 0, loop_operand(1, 2)) if after_loop else Insn(Op.NOP)
    return [encode(first), encode(Insn(Op.NOP)), encode(Insn(Op.ADDX, reg("RD3.base"), 1)),
            encode(Insn(Op.HALT))]


@pytest.mark.parametrize("after_loop", [False, True])
def test_addx_outside_a_loop_is_an_error(after_loop):
    """As a nested LOOP: the ISS raises, the cycle model halts with ``error`` at the ADDX."""
    npu = small_npu()
    program = addx_outside(after_loop)
    with pytest.raises(IssError, match="chip 0 pc 2: ADDX at pc 2 outside a loop body"):
        Iss(npu).run(program)
    timing = time_programs(npu, [program]).chips[0]
    assert timing.cycles == 3 + after_loop, timing.cycles        # the loop's NOP runs twice
    with pytest.raises(IssError, match="chip 0: ADDX at pc 2 outside a loop body"):
        time_programs_fast(npu, [program])


OUT, Y, STRIDE, CONST = 300, 100, 5, 250


def strided_add_program(npu, count: int, *, unrolled: bool = False) -> list[int]:
    """Per trip i: ``OUT + i*STRIDE <- x[i] + y[i]`` (RD3, RD4, WR1 at their row 0 plus ADDX),
    then ``acc <- acc + c`` through the same generators SET to constants: the rows' positions
    survive only through ADDX. ``unrolled``: the body ``count`` times, ADDX replaced by ADD of
    the trip's multiple."""
    rw = row_words(npu)
    step = add_launch(size=npu.array_size, length=LEN, a=Rows(X, 1, rw, 2),
                      b=Rows(Y, 1, rw, 2), out=Rows(OUT, 1, rw, 2))
    accumulate = add_launch(size=npu.array_size, length=LEN, a=Rows(ACC, 1, rw, 2),
                            b=Rows(CONST, 1, rw, 2), out=Rows(ACC, 1, rw, 2))
    asm = Assembler(elide=False)                 # the same SETs in every trip, both ways
    handle = None if unrolled else asm.loop_begin(count)
    for i in range(count if unrolled else 1):
        for launch in (step, accumulate):
            for gen, desc in launch.descs.items():
                asm.set_desc(gen, desc)
            for name, value in launch.regs.items():
                asm.set(name, value)
            if launch is step:
                for name, scale in (("RD3.base", rw), ("RD4.base", rw), ("WR1.base", STRIDE)):
                    if unrolled:
                        asm.add(name, scale * i)
                    else:
                        asm.addx(name, scale)
            asm.launch(Op.VEC)
    if handle is not None:
        asm.loop_end(handle)
    asm.halt()
    return asm.words()


def strided_data(npu, count, seed):
    rng = seeded(seed)
    x, y = rng.integers(-20000, 20000, (2, count, LEN))
    acc0, c = rng.integers(-20000, 20000, (2, 1, LEN))
    n = npu.array_size
    images = {X: pack_rows(x, 2, n), Y: pack_rows(y, 2, n), ACC: pack_rows(acc0, 2, n),
              CONST: pack_rows(c, 2, n)}
    acc = acc0
    for _ in range(count):
        acc = residual_add(acc, c)
    return images, residual_add(x, y), acc


def check_strided(npu, read, count, rows, acc):
    """``read(base, words)``: the memory under test; each row i at OUT + i*STRIDE."""
    rw = row_words(npu)
    for i in range(count):
        got = unpack_rows(read(OUT + i * STRIDE, rw), 1, LEN, 2)[0]
        bad = np.flatnonzero(got != rows[i])
        assert bad.size == 0, f"row {i} element {bad[0]}: {got[bad[0]]} != {rows[i][bad[0]]}"
    got = unpack_rows(read(ACC, rw), 1, LEN, 2)
    bad = np.flatnonzero(got != acc)
    assert bad.size == 0, f"acc element {bad[0]}: {got[0, bad[0]]} != {acc[0, bad[0]]}"


@pytest.mark.parametrize("count", [1, 3, 6])
def test_iss_strided_rows_equal_golden_and_unrolled(count):
    npu = small_npu()
    assert row_words(npu) < STRIDE and OUT + count * STRIDE <= npu.sram_words
    images, rows, acc = strided_data(npu, count, 60 + count)
    looped, executed = run_iss(npu, strided_add_program(npu, count), images)
    unrolled, _ = run_iss(npu, strided_add_program(npu, count, unrolled=True), images)
    check_strided(npu, looped.read_words, count, rows, acc)
    assert np.array_equal(looped.mem, unrolled.mem)
    assert looped.launches[Op.VEC] == 2 * count
    body = len(strided_add_program(npu, count)) - 2                  # without LOOP and HALT
    assert executed == 1 + body * count + 1
    assert int(looped.regs[reg("WR1.base")]) == ACC               # the last SET in the body


@pytest.mark.parametrize("count", [1, 4])
def test_addx_takes_one_cycle(count):
    """ADDX costs what ADD costs: the looped program takes the unrolled one's cycles plus its
    LOOP's; the launch-level model agrees."""
    npu = small_npu()
    looped = time_programs(npu, [strided_add_program(npu, count)]).cycles
    unrolled = time_programs(npu, [strided_add_program(npu, count, unrolled=True)]).cycles
    assert looped == unrolled + 1, (looped, unrolled)
    assert time_programs_fast(npu, [strided_add_program(npu, count)]).cycles == looped


def test_gateware_addx_equals_iss_and_timing():
    """pysim of the chip: the rows land at OUT + i*STRIDE with the golden sums, its memory
    equals the ISS's and its cycles the cycle model's; an ADDX after the loop halts with
    ``error`` in the cycles the model gives."""
    npu = small_npu()
    count = 3
    images, rows, acc = strided_data(npu, count, 70)
    program = strided_add_program(npu, count)
    iss, _ = run_iss(npu, program, images)
    span = count * STRIDE
    rtl = run_chip_pysim(npu, program, images, [(OUT, span), (ACC, row_words(npu))],
                         max_cycles=4000)
    assert not rtl["error"]
    regions = dict(zip((OUT, ACC), rtl["regions"], strict=True))

    def read(base, words):
        start = OUT if OUT <= base < OUT + span else ACC
        return regions[start][base - start:base - start + words]

    check_strided(npu, read, count, rows, acc)
    bad = np.argwhere(regions[OUT] != iss.read_words(OUT, span))
    assert bad.size == 0, f"word {OUT + bad[0][0]} byte {bad[0][1]} differs from the ISS"
    assert rtl["cycles"] == time_programs(npu, [program]).cycles
    program = addx_outside(after_loop=True)
    rtl = run_chip_pysim(npu, program, {}, [], max_cycles=100)
    assert rtl["error"] and rtl["cycles"] == time_programs(npu, [program]).cycles == 4
