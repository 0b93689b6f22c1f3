"""Chip (hw.chip: sequencer, scratchpad, units, host port) against the ISS, by program."""

import dataclasses

import numpy as np
import pytest

from hw.chip import Chip
from hw.spec import ConfigError, ModelConfig, npu_preset
from hw.spec.collective import CollectiveRequest
from hw.spec.formats import OutMode
from hw.spec.isa import Insn, Op, Unit, encode
from hw.spec.memory import pack_params, pack_rows, pack_weight_blocks, unpack_rows
from hw.spec.vector import argmax_words, unpack_argmax
from sim.compiler.assembler import Assembler
from sim.compiler.descriptors import emit_matmul, matmul_launch
from sim.compiler.quantize import quantize_input, quantize_model
from sim.compiler.single import compile_single
from sim.compiler.vector_launch import Rows, argmax_launch, emit, onehot_launch
from sim.golden.float_model import random_weights
from sim.golden.layer import model_int
from sim.golden.matmul import matmul_unit, requant
from sim.golden.vector import argmax16
from sim.iss import Iss, IssError
from sim.rtl.chip_runner import run_chip_pysim, run_chip_verilator
from sim.rtl.pysim import SimulationTimeout
from sim.timing.cycle import time_programs, trace_entries
from tests.helpers import assert_cycle_model, seeded, single_chip_program, small_npu


def iss_ran(npu, images, program):
    """An ISS of ``npu`` that loaded ``images`` and ran ``program``."""
    iss = Iss(npu)
    for base, words in images.items():
        iss.write_words(base, words)
    iss.run(program)
    return iss


def test_two_chained_matmuls_match_iss_and_golden():
    """C1 = requant8(A B1 + b1); C2 = requant16(C1 B2 + b2): the second reads what the first
    wrote, after a WAIT."""
    rng = seeded(3)
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
    iss = iss_ran(npu, images, program)
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


@pytest.mark.parametrize("word", [0x3F, 0x07, 0x0E])
def test_unknown_opcode_halts_with_error(word):
    """An unknown opcode halts with `error` instead of stalling forever."""
    assert word & 0x3F not in {int(op) for op in Op}, f"opcode {word & 0x3F} is in use"
    npu = small_npu()
    program = [encode(Insn(Op.NOP)), word, encode(Insn(Op.HALT))]
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


def test_rejections():
    wide = dataclasses.replace(small_npu(), array_size=16, vector_lanes=16, d_head_max=16)
    with pytest.raises(ConfigError, match=r"^link_bytes_per_cycle=4 makes ring words of .* = 8 "
                                          r"bytes, not a multiple of the scratchpad word of "
                                          r"array_size=16 bytes"):
        Chip(npu=wide)
    with pytest.raises(ConfigError, match=r"^vector_lanes=8 must equal array_size=16"):
        Chip(npu=dataclasses.replace(wide, vector_lanes=8))


def test_one_chip_collective_rtl_equals_iss():
    req = CollectiveRequest("all_reduce", "avg", 32, 5, 1)
    npu, launch, program = single_chip_program(req)
    x = np.array([7, -3, 0, 2**31 - 1, -(2**31)])
    image = {0: launch.pack_input(x)}
    iss = Iss(npu)
    iss.write_words(0, image[0])
    iss.run(program)
    got = launch.unpack_output(iss.read_words(64, launch.out_words))
    assert (got == x).all()
    rtl = run_chip_pysim(npu, program, image, [(64, launch.out_words)], max_cycles=500)
    assert not rtl["error"]
    assert (rtl["regions"][0] == iss.read_words(64, launch.out_words)).all()


def test_coll_without_partners_hits_the_watchdog():
    """A chip told it is on a ring of 2 waits for its neighbour forever."""
    req = CollectiveRequest("all_reduce", "sum", 32, 4, 2)
    npu, launch, program = single_chip_program(req)
    with pytest.raises(SimulationTimeout, match="max_cycles=200"):
        run_chip_pysim(npu, program, {}, [], max_cycles=200)
    with pytest.raises(IssError, match="needs the other chips"):
        Iss(npu).run(program)


def compiled_block(norm="pre", causal=True, n_layers=1):
    """A small model compiled for the tiny chip, with its input image and the golden output."""
    cfg = ModelConfig(n_layers=n_layers, d_model=16, n_heads=2, d_head=8, d_ff=32, seq_len=6,
                      norm=norm, causal=causal, name="small")
    npu = npu_preset("tiny")
    x = np.random.default_rng(4).standard_normal((cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 4), x)
    x_int = quantize_input(qm, x)
    prog = compile_single(npu, qm)
    return npu, prog, prog.images([x_int])[0], model_int(qm, x_int)


def test_iss_and_rtl_agree_on_a_two_layer_program():
    """Every word the program leaves in the residual tensor: RTL == ISS == golden."""
    npu, prog, images, want = compiled_block(n_layers=2)
    program, x = prog.chips[0].program, prog.outputs[0]
    iss = iss_ran(npu, images, program)
    rtl = run_chip_pysim(npu, program, images, [(x.base, x.words)], max_cycles=100_000)
    assert not rtl["error"]
    bad = np.argwhere(rtl["regions"][0] != iss.read_words(x.base, x.words))
    assert not len(bad), f"RTL and ISS differ first at word {x.base + bad[0][0]}"
    got = x.read(rtl["regions"][0], 6, 16)
    assert (got == want).all()


@pytest.mark.verilator
def test_verilator_chip_equals_the_iss(verilator_ok):
    """The exported chip runs a whole compiled block (LN, matmuls, attention, GELU, residual)
    under cocotb + Verilator: the ISS's memory and its cycle model's cycle count, busy
    counters and trace (which the other tests hold to Amaranth's simulator's)."""
    npu, prog, images, want = compiled_block(norm="post", causal=False)
    program, x = prog.chips[0].program, prog.outputs[0]
    reads = [(x.base, x.words)]
    iss = iss_ran(npu, images, program)
    model = time_programs(npu, [program]).chips[0]
    vl = run_chip_verilator(npu, program, images, reads, max_cycles=100_000)
    assert not vl["timeout"] and not vl["error"]
    assert (vl["regions"][0] == iss.read_words(x.base, x.words)).all()
    assert vl["trace"] == trace_entries(npu, model.trace)
    got = x.read(vl["regions"][0], 6, 16)
    assert (got == want).all()
    assert vl["cycles"] == model.cycles, (vl["cycles"], model.cycles)
    assert vl["busy_cycles"] == model.busy


def test_greedy_pick_and_embedding_on_chip():
    """Greedy decode's step on the chip: ARGMAX of 4 int16 logit rows (a tie included), ONEHOT
    of the records, then the embedding as the int8 matmul one-hot @ E8 requantised per column
    (int16 out): RTL == ISS == golden (REQUANT(E8[t], emb_req, 16)); the cycle model == RTL."""
    rng = seeded(21)
    npu = small_npu()
    n = npu.array_size
    rows, vocab, d = 4, 24, 8
    logits = rng.integers(-(1 << 15), 1 << 15, (rows, vocab))
    logits[1, [2, 19]] = 32767                 # a tie: token 2
    logits[2, :] = -5                          # all equal: token 0
    e8 = rng.integers(-128, 128, (vocab, d))
    mult, shift = rng.integers(1, 1 << 15, d), rng.integers(6, 12, d)
    # Word addresses: logits 0, records 100, one-hot rows 120, E8 200, params 300, out 400.
    images = {0: pack_rows(logits, 2, n), 200: pack_weight_blocks(e8, n),
              300: pack_params(np.zeros(d, np.int64), mult, shift, n)}
    rec = argmax_words(n)
    onehot_rows = Rows(120, rows, vocab // n, 1)
    asm = Assembler()
    emit(asm, argmax_launch(size=n, length=vocab, x=Rows(0, rows, vocab * 2 // n, 2),
                            record_base=100))
    asm.wait(Unit.VEC)
    emit(asm, onehot_launch(size=n, length=vocab, record_base=100, out=onehot_rows))
    asm.wait(Unit.VEC)
    emit_matmul(asm, matmul_launch(size=n, m=rows, k=vocab, n=d, a_base=120,
                                   a_row_words=vocab // n, b_base=200, p_base=300, c_base=400,
                                   c_row_words=2 * d // n, mode=OutMode.INT16))
    asm.halt()
    program = asm.words()
    iss = iss_ran(npu, images, program)
    index, _ = unpack_argmax(iss.read_words(100, rows * rec).reshape(rows, rec, n))
    tokens = [argmax16(row)[0] for row in logits]
    assert index.tolist() == tokens and tokens[1:3] == [2, 0], (index, tokens)
    got = unpack_rows(iss.read_words(400, rows * 2 * d // n), rows, d, 2)
    want = requant(e8[tokens], mult, shift, 16)
    assert np.array_equal(got, want), (got, want)

    reads = [(100, rows * rec), (120, rows * vocab // n), (400, rows * 2 * d // n)]
    rtl = run_chip_pysim(npu, program, images, reads, max_cycles=5000)
    assert not rtl["error"]
    for (base, count), words in zip(reads, rtl["regions"], strict=True):
        bad = np.argwhere(words != iss.read_words(base, count))
        assert not len(bad), f"word {base + bad[0][0]} byte {bad[0][1]} differs from the ISS"
    assert_cycle_model(npu, [program], [(rtl["cycles"], rtl["busy_cycles"], rtl["trace"])])
    print(f"cycles={rtl['cycles']} busy={rtl['busy_cycles']}")
