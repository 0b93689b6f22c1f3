"""The sequencer's counted loop (``LOOP body, count`` with ``ADD`` per iteration): the spec's
rule, the ISS, both timing models and the gateware agree; imem does not grow with the count."""

import numpy as np
import pytest

from hw.spec.isa import (
    Insn,
    IsaError,
    LoopState,
    Op,
    Unit,
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
from sim.timing.cycle import time_programs
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
