"""The chip (sequencer + scratchpad + units + host port) against the ISS, program by program."""

import dataclasses

import numpy as np
import pytest

from hw.spec import npu_preset
from hw.spec.formats import OutMode
from hw.spec.isa import Insn, Op, Unit, encode
from hw.tile.chip import Chip
from sim.compiler.descriptors import matmul_launch
from sim.golden.matmul import matmul_unit
from sim.iss import Assembler, Iss
from sim.memory import pack_params, pack_rows, pack_weight_blocks, unpack_rows
from sim.rtl.chip_runner import run_chip_pysim
from sim.rtl.pysim import SimulationTimeout


def small_npu():
    return dataclasses.replace(npu_preset("tiny"), sram_bytes=4096, imem_words=256)


def emit_matmul(asm, launch):
    for gen in ("rd0", "rd1", "rd2", "wr0"):
        asm.set_desc(gen.upper(), getattr(launch, gen))
    asm.set("MM_K", launch.k)
    asm.set("MM_FOLDS", launch.folds)
    asm.set("MM_MODE", int(launch.mode))
    asm.set("MM_A_UNSIGNED", int(launch.a_unsigned))
    asm.launch(Op.MATMUL)


def test_two_chained_matmuls_match_iss_and_golden():
    """C1 = requant8(A B1 + b1); C2 = requant16(C1 B2 + b2): the second reads what the first
    wrote, after a WAIT."""
    rng = np.random.default_rng(3)
    print("seed=3")
    npu = small_npu()
    n = npu.array_size
    m, k, h, o = 8, 8, 12, 4
    a = rng.integers(-128, 128, (m, k))
    b1, b2 = rng.integers(-128, 128, (k, h)), rng.integers(-128, 128, (h, o))
    p1 = (rng.integers(-5000, 5000, h), rng.integers(1, 2**16, h), rng.integers(14, 18, h))
    p2 = (rng.integers(-5000, 5000, o), rng.integers(1, 2**16, o), rng.integers(10, 14, o))
    # Word addresses: A 0, B1 16, P1 64, B2 100, P2 150, C1 200, C2 300.
    images = {0: pack_rows(a, 1, n), 16: pack_weight_blocks(b1, n), 64: pack_params(*p1, n),
              100: pack_weight_blocks(b2, n), 150: pack_params(*p2, n)}
    l1 = matmul_launch(size=n, m=m, k=k, n=h, a_base=0, a_row_words=2, b_base=16, p_base=64,
                       c_base=200, c_row_words=3, mode=OutMode.INT8)
    l2 = matmul_launch(size=n, m=m, k=h, n=o, a_base=200, a_row_words=3, b_base=100,
                       p_base=150, c_base=300, c_row_words=2, mode=OutMode.INT16)
    asm = Assembler()
    emit_matmul(asm, l1)
    asm.wait(Unit.MATMUL)
    emit_matmul(asm, l2)
    asm.halt()
    program = asm.words()

    iss = Iss(npu)
    for base, words in images.items():
        iss.write_words(base, words)
    iss.run(program)
    c1 = matmul_unit(a, b1, *p1, OutMode.INT8)
    c2 = matmul_unit(c1, b2, *p2, OutMode.INT16)
    got = unpack_rows(iss.read_words(300, 16), m, 4, 2)
    assert (got == c2).all(), "ISS differs from the golden chain"

    rtl = run_chip_pysim(npu, program, images, [(200, 24), (300, 16)], max_cycles=5000)
    assert not rtl["error"]
    for (base, count), words in zip([(200, 24), (300, 16)], rtl["regions"], strict=True):
        want = iss.read_words(base, count)
        bad = np.argwhere(words != want)
        assert not len(bad), f"word {base + bad[0][0]} byte {bad[0][1]} differs from the ISS"
    assert rtl["busy_cycles"][0] > 0 and rtl["cycles"] >= rtl["busy_cycles"][0]
    print(f"cycles={rtl['cycles']} load={rtl['load_cycles']} busy={rtl['busy_cycles']}")


def test_unknown_opcode_halts_with_error():
    npu = small_npu()
    program = [encode(Insn(Op.NOP)), 0x3F, encode(Insn(Op.HALT))]
    rtl = run_chip_pysim(npu, program, {}, [], max_cycles=100)
    assert rtl["error"]


def test_hung_program_hits_the_watchdog():
    npu = small_npu()
    asm = Assembler()
    # A matmul whose B stream is empty (RD1 walks 0 words... n counts of 0 count as 1, so make
    # the A side starve instead: K=8 but RD0 delivers only 4 words): it never finishes.
    asm.set_desc("RD0", {"base": 0, "n": [4, 1, 1, 1], "s": [1, 0, 0, 0]})
    asm.set_desc("RD1", {"base": 0, "n": [8, 1, 1, 1], "s": [1, 0, 0, 0]})
    asm.set_desc("RD2", {"base": 0, "n": [7, 1, 1, 1], "s": [1, 0, 0, 0]})
    asm.set_desc("WR0", {"base": 100, "n": [1, 4, 1, 1], "s": [1, 1, 0, 0]})
    asm.set("MM_K", 8)
    asm.set("MM_FOLDS", 1)
    asm.launch(Op.MATMUL)
    asm.halt()
    with pytest.raises(SimulationTimeout, match="max_cycles=300"):
        run_chip_pysim(npu, asm.words(), {}, [], max_cycles=300)


def test_rejects_bad_config():
    with pytest.raises(TypeError, match="npu must be an NpuConfig"):
        Chip(npu="tiny")
