"""Chip-context closed forms (hw.spec.timing.chip) against the cycle model, launch by launch."""

import dataclasses

import pytest

from hw.spec import npu_preset
from hw.spec.attention import launch_words
from hw.spec.formats import OutMode, out_words
from hw.spec.timing import attention as attn_timing
from hw.spec.timing import chip
from hw.spec.timing import vector as vec_timing
from sim.compiler import attention_launch as al
from sim.compiler import vector_launch as vl
from sim.compiler.assembler import Assembler
from sim.compiler.descriptors import emit_matmul, matmul_launch
from sim.report.timeline import intervals
from sim.timing.cycle import time_programs


def npu_of(size, **changes):
    fields = {"array_size": size, "vector_lanes": size, "d_head_max": 16,
              "sram_bytes": size * 16384} | changes
    return dataclasses.replace(npu_preset("tiny"), **fields)


def busy(npu, asm, unit):
    """The one launch's busy cycles, from the cycle model's trace."""
    asm.halt()
    t = time_programs(npu, [asm.words()]).chips[0]
    ((start, end),) = intervals(t.trace, t.cycles)[unit]
    return end - start


def matmul(npu, m, k, n, mode, banks):
    size, bw = npu.array_size, npu.bank_words
    asm = Assembler()
    emit_matmul(asm, matmul_launch(size=size, m=m, k=k, n=n, a_base=banks[0] * bw,
                                   a_row_words=k // size, b_base=banks[1] * bw,
                                   p_base=banks[2] * bw, c_base=banks[3] * bw,
                                   c_row_words=-(-n // size) * out_words(mode), mode=mode))
    return busy(npu, asm, "matmul")


@pytest.mark.parametrize("size", [4, 8])
@pytest.mark.parametrize("mode", list(OutMode))
def test_matmul_in_separate_banks(size, mode):
    npu = npu_of(size)
    ow = out_words(mode)
    k_min = -(-chip.matmul_k_min(size, ow) // size) * size
    for k in (k_min, 2 * k_min + size):
        for fm, fn in ((1, 1), (1, 3), (2, 3)):
            got = matmul(npu, fm * size, k, fn * size, mode, (0, 1, 2, 3))
            assert got == chip.matmul_cycles(size, k, fm * fn, ow), (k, fm, fn)
    # matmul_k_min is the smallest: one block of K fewer, folds take longer than it says.
    k = k_min - size
    assert k >= size
    assert matmul(npu, 2 * size, k, 3 * size, mode, (0, 1, 2, 3)) > \
        chip.matmul_cycles(size, k, 6, ow)


@pytest.mark.parametrize("size", [4, 8])
def test_matmul_approximations_stay_close(size):
    npu = npu_of(size)
    for mode in (OutMode.INT8, OutMode.INT16):
        for k, shared in ((size, False), (4 * size, True)):
            got = matmul(npu, 2 * size, k, 4 * size, mode, (3, 0, 3, 2) if shared else
                         (0, 1, 2, 3))
            approx = chip.matmul_approx(size, k, 8, out_words(mode), shared=shared)
            assert abs(approx - got) <= 0.1 * got, (mode, k, shared, got, approx)


@pytest.mark.parametrize("size", [4, 8])
@pytest.mark.parametrize("rows, length", [(1, 32), (8, 32), (3, 24)])
@pytest.mark.parametrize("pipeline", vec_timing.PIPELINES)
def test_vector_launches(size, rows, length, pipeline):
    npu = npu_of(size, d_model_max=256, vector_pipeline=pipeline)
    bw = npu.bank_words
    r = vl.Rows
    rw2, rw4, rw1 = (-(-length * eb // size) for eb in (2, 4, 1))
    x = r(0, rows, rw2, 2)
    cases = [
        (vl.add_launch(size=size, length=length, a=x, b=r(bw, rows, rw2, 2),
                       out=r(2 * bw, rows, rw2, 2)), False, False),
        (vl.add_launch(size=size, length=length, a=x, b=r(rows * rw2, rows, rw2, 2), out=x),
         True, False),
        (vl.mul_launch(size=size, length=length, a=r(0, rows, rw1, 1), b=r(bw, rows, rw1, 1),
                       out=r(2 * bw, rows, rw1, 1), mult=3000, shift=12), False, False),
        (vl.requant_launch(size=size, length=length, a=r(0, rows, rw4, 4),
                           out=r(bw, rows, rw2, 2), params_base=rows * rw4), True, False),
        (vl.lut_launch(size=size, length=length, a=r(0, rows, rw1, 1),
                       out=r(bw, rows, rw1, 1)), False, False),
        (vl.ln_launch(size=size, length=length, x=x, gamma_beta_base=rows * rw2,
                      q=r(2 * bw, rows, rw1, 1), y=r(2 * bw + 512, rows, rw2, 2), gshift=16,
                      mult=1, shift=1), True, True),
        (vl.ln_launch(size=size, length=length, x=x, gamma_beta_base=bw,
                      q=r(2 * bw, rows, rw1, 1), y=None, gshift=16, mult=1, shift=1),
         False, False),
        (vl.ln_launch(size=size, length=length, x=x, gamma_beta_base=rows * rw2,
                      q=r(2 * bw, rows, rw1, 1), y=r(2 * bw + 512, rows, rw2, 2), gshift=16,
                      mult=1, shift=1, rms=True), True, True),
    ]
    for launch, shared, outputs in cases:
        asm = Assembler()
        vl.emit(asm, launch)
        base = vec_timing.launch_cycles(launch.op, rows=rows, length=length, lanes=size,
                                        flags=launch.flags, pipeline=pipeline)
        want = chip.vector_cycles(launch.op, base, rows=rows, length=length, lanes=size,
                                  flags=launch.flags, shared=shared, outputs_shared=outputs,
                                  pipeline=pipeline)
        assert busy(npu, asm, "vector") == want, launch.op.name


@pytest.mark.parametrize("size, window", [(4, 16), (8, 64)])
@pytest.mark.parametrize("queries, halo, keys, interleaved", [
    (8, 0, 8, False), (6, 0, 6, False), (12, 0, 12, True), (20, 5, 25, True),
    (20, 5, 20, True)])
def test_attention_launches(size, window, queries, halo, keys, interleaved):
    npu = npu_of(size, attn_window=window, softmax_len=window, max_seq_len=512,
                 d_head_max=64)
    bw = npu.bank_words
    for words in (1, 2):
        h = words * size
        for shared in (True, False):
            if shared:    # Q, K and V of one head in one tensor, as the compiler stores them
                bases, rw = (0, h // size, 2 * h // size), 3 * words
            else:
                bases, rw = (0, bw, 2 * bw), words
            launch = al.attention_launch(
                size=size, d_head=h, queries=queries, keys=keys, q_base=bases[0],
                k_base=bases[1], v_base=bases[2], o_base=3 * bw, q_row_words=rw,
                k_row_words=rw, v_row_words=rw, o_row_words=words, interleaved=interleaved,
                halo=halo, bidirectional=halo > 0, score_mult=1, score_shift=1, out_mult=1,
                out_shift=1)
            asm = Assembler()
            al.emit(asm, launch)
            engine = attn_timing.launch_cycles(launch.regs, window=window, length=window,
                                               size=size)
            assert attn_timing.preload_cycles(launch.regs, window=window, length=window,
                                              size=size) == engine
            want = chip.attention_cycles(engine, keys=keys, words=words, shared=shared,
                                         interleaved=interleaved, halo=halo)
            assert busy(npu, asm, "attention") == want, (words, shared)


@pytest.mark.parametrize("size, h", [(4, 3), (4, 6), (8, 5), (8, 12)])
@pytest.mark.parametrize("keys", [1, 2, 3, 4, 7, 12])
def test_attention_launches_of_packed_heads(size, h, keys):
    """Preload launches of heads at lane offsets, Q, K and V of different lengths (rows of
    1 to 3 words) in one bank or in three: the closed form equals the cycle model."""
    npu = npu_of(size, attn_window=16, softmax_len=16, max_seq_len=512, d_head_max=16)
    bw = npu.bank_words
    for q_lane, k_lane, v_lane in ((0, size - 1, 0), (size - 1, 0, size // 2),
                                   (size // 2, size - 1, size - 1), (1, size - 1, 0)):
        for shared in (True, False):
            bases = (0, 0, 0) if shared else (0, bw, 2 * bw)
            launch = al.attention_launch(
                size=size, d_head=h, queries=keys, keys=keys, q_base=bases[0],
                k_base=bases[1], v_base=bases[2], o_base=3 * bw, q_row_words=12,
                k_row_words=12, v_row_words=12, o_row_words=4, col=q_lane,
                k_col=4 * size + k_lane, v_col=8 * size + v_lane, score_mult=1,
                score_shift=1, out_mult=1, out_shift=1)
            asm = Assembler()
            al.emit(asm, launch)
            engine = attn_timing.launch_cycles(launch.regs, window=16, length=16, size=size)
            words = launch_words(launch.regs, size)
            want = chip.attention_cycles(engine, keys=keys, words=words, shared=shared)
            assert busy(npu, asm, "attention") == want, (q_lane, k_lane, v_lane, words, shared)
