"""The int16 FFN2 path as a program, with no new matmul hardware: GELU16 writes the hi and lo
planes of its int16 output, two MATMUL launches (hi signed with (mult, shift - 8) and no bias,
lo in the unsigned-A mode with (bias, mult, shift)) requantise to int16, and two VEC ADDs put
both into the int16 residual. The ISS must equal sim.golden.matmul.linear16 bit for bit; one
small case also runs on the chip RTL (Amaranth's simulator) and must leave the ISS's memory."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hw.spec import npu_preset
from hw.spec.formats import OutMode
from hw.spec.isa import Unit
from hw.spec.memory import pack_params, pack_rows, pack_weight_blocks, row_words, unpack_rows
from sim.compiler.assembler import Assembler
from sim.compiler.descriptors import emit_matmul, matmul_launch
from sim.compiler.vector_launch import Rows, add_launch, emit, gelu16_launch, load_lut16_launch
from sim.golden.matmul import LINEAR16_SHIFT_MIN, linear16
from sim.golden.vector import gelu16_apply, gelu16_knot_shift, gelu16_table
from sim.iss import Iss
from sim.rtl.chip_runner import run_chip_pysim

I16 = (-(1 << 15), 1 << 15)


class Layout:
    """Word addresses of one FFN2 case, allocated one after the other."""

    def __init__(self, n):
        self.n, self.next = n, 0

    def take(self, words):
        base, self.next = self.next, self.next + words
        return base


def ffn2_case(rng, *, size, m, f, d, gelu=True):
    """Memory images, program and golden residual of ``res += act16 @ W2 + b2`` in two passes,
    with ``act16 = GELU16(pre16)`` computed on chip (``gelu``) or given as the two planes."""
    scale = 7e-4
    g = gelu16_knot_shift(scale)
    table = gelu16_table(scale, g)
    pre = rng.integers(*I16, (m, f))
    pre[0, :4] = [I16[0], I16[1] - 1, 0, -1]
    act = gelu16_apply(table, pre, g) if gelu else pre
    w = rng.integers(-128, 128, (f, d))
    bias = rng.integers(-(1 << 22), 1 << 22, d)
    mult = rng.integers(1 << 15, 1 << 16, d)
    shift = rng.integers(LINEAR16_SHIFT_MIN + 14, LINEAR16_SHIFT_MIN + 20, d)
    res = rng.integers(-20000, 20000, (m, d))
    want = linear16(act, w, bias, mult, shift, res)

    lay = Layout(size)
    images = {}

    def put(words):
        base = lay.take(len(words))
        images[base] = words
        return base

    t_table = put(pack_rows(table[None, :], 2, size))
    a16 = Rows(put(pack_rows(pre, 2, size)), m, row_words(f, 2, size), 2)
    hi = Rows(lay.take(m * row_words(f, 1, size)), m, row_words(f, 1, size), 1)
    lo = Rows(lay.take(m * row_words(f, 1, size)), m, row_words(f, 1, size), 1)
    if not gelu:
        images[hi.base] = pack_rows(act >> 8, 1, size)
        images[lo.base] = pack_rows(act & 0xFF, 1, size)
    w_base = put(pack_weight_blocks(w, size))
    p_hi = put(pack_params(np.zeros(d, np.int64), mult, shift - 8, size))
    p_lo = put(pack_params(bias, mult, shift, size))
    out_words = row_words(d, 2, size)
    f_hi = Rows(lay.take(m * out_words), m, out_words, 2)
    f_lo = Rows(lay.take(m * out_words), m, out_words, 2)
    r = Rows(put(pack_rows(res, 2, size)), m, out_words, 2)

    asm = Assembler()
    if gelu:
        emit(asm, load_lut16_launch(size=size, base=t_table))
        emit(asm, gelu16_launch(size=size, length=f, a=a16, g=g, hi=hi, lo=lo))
        asm.wait(Unit.VEC)
    for plane, params, out, unsigned in ((hi, p_hi, f_hi, False), (lo, p_lo, f_lo, True)):
        emit_matmul(asm, matmul_launch(size=size, m=m, k=f, n=d, a_base=plane.base,
                                       a_row_words=plane.row_words, b_base=w_base,
                                       p_base=params, c_base=out.base, c_row_words=out_words,
                                       mode=OutMode.INT16, a_unsigned=unsigned))
    asm.wait(Unit.MATMUL)
    emit(asm, add_launch(size=size, length=d, a=r, b=f_hi, out=r))
    emit(asm, add_launch(size=size, length=d, a=r, b=f_lo, out=r))
    asm.halt()
    return {"images": images, "program": asm.words(), "residual": r, "want": want,
            "words": lay.next}


def make_npu(size, words):
    sram = 1 << max(12, (words * size - 1).bit_length())
    return dataclasses.replace(npu_preset("tiny"), array_size=size, vector_lanes=size,
                               sram_bytes=sram, sram_banks=4)


def run_iss(npu, case):
    iss = Iss(npu)
    for base, words in case["images"].items():
        iss.write_words(base, words)
    iss.run(case["program"])
    r = case["residual"]
    got = unpack_rows(iss.read_words(r.base, r.rows * r.row_words), r.rows,
                      case["want"].shape[1], 2)
    return iss, got


@pytest.mark.parametrize("seed, size, m, f, d, gelu", [
    (1, 4, 8, 16, 8, True), (2, 4, 4, 32, 12, False), (3, 8, 8, 24, 16, True),
    (4, 2, 6, 10, 4, True)])
def test_iss_equals_golden_linear16(seed, size, m, f, d, gelu):
    print(f"seed={seed}")
    rng = np.random.default_rng(seed)
    case = ffn2_case(rng, size=size, m=m, f=f, d=d, gelu=gelu)
    _, got = run_iss(make_npu(size, case["words"]), case)
    bad = np.argwhere(got != case["want"])
    assert not len(bad), (f"row {bad[0][0]} column {bad[0][1]}: ISS {got[tuple(bad[0])]}, "
                          f"golden {case['want'][tuple(bad[0])]}")


def test_chip_rtl_equals_iss():
    """The same program on the chip (pysim): GELU16's two planes leave through WR1 and WR2 of
    the chip's shared generators; the final memory regions equal the ISS's."""
    rng = np.random.default_rng(5)
    size = 4
    case = ffn2_case(rng, size=size, m=4, f=8, d=4)
    npu = make_npu(size, case["words"])
    iss, got = run_iss(npu, case)
    assert np.array_equal(got, case["want"])
    out = run_chip_pysim(npu, case["program"], case["images"], [(0, case["words"])],
                         max_cycles=20_000)
    assert not out["error"]
    (region,) = out["regions"]
    diff = np.argwhere(region != iss.mem[:case["words"]])
    assert not len(diff), (f"chip and ISS differ first at word {diff[0][0]} byte "
                           f"{diff[0][1]}")
    print(f"chip: {out['cycles']} cycles")
