"""Matmul launches (sim.compiler.descriptors): a packed B's walk, and the split of a launch
whose walk has no two-level form."""

import numpy as np
import pytest

import sim.compiler.descriptors as descriptors
from hw.spec.formats import OutMode
from hw.spec.memory import pack_params, pack_rows, pack_weight_blocks, unpack_rows
from sim.compiler.descriptors import emit_matmul, matmul_launch, matmul_launches
from sim.golden.matmul import matmul_unit
from sim.iss import Iss
from tests.helpers import assemble, matmul_operands, seeded, square_npu


def test_packed_walk_is_one_run_of_words_per_row_tile():
    """B of 10 rows x 11 columns on 4-lane words: two whole blocks of 10 words, then the
    packed block of 3 columns in ceil(30 / 4) = 8 words: 28 words per row tile, re-read for
    each of the 2 row tiles; the registers name the stored rows, blocks and last columns."""
    launch = matmul_launch(size=4, m=8, k=12, n=11, a_base=0, a_row_words=3, b_base=100,
                           p_base=200, c_base=300, c_row_words=3, mode=OutMode.INT8,
                           b_rows=10, packed=True)
    assert launch.rd1.n == (28, 1, 2, 1) and launch.rd1.s == (1, 28, 0, 0)
    assert (launch.b_rows, launch.b_blocks, launch.b_last, launch.folds) == (10, 3, 3, 6)
    whole = matmul_launch(size=4, m=8, k=12, n=12, a_base=0, a_row_words=3, b_base=100,
                          p_base=200, c_base=300, c_row_words=3, mode=OutMode.INT8)
    assert (whole.b_rows, whole.b_blocks, whole.b_last) == (0, 0, 0)
    assert whole.rd1.n == (12, 3, 2, 1)
    with pytest.raises(ValueError, match="b_rows=13 must be 1..k=12"):
        matmul_launch(size=4, m=8, k=12, n=11, a_base=0, a_row_words=3, b_base=100,
                      p_base=200, c_base=300, c_row_words=3, mode=OutMode.INT8, b_rows=13,
                      packed=True)


def test_a_walk_with_no_two_level_form_is_split(monkeypatch):
    """With 16-bit counts of at most 7 (patched), a packed B of 11 words per row tile (a
    prime) has no two-level walk: two launches, the whole block and the packed one, whose
    result on the ISS is the golden matmul's."""
    monkeypatch.setattr(descriptors, "MAX_COUNT", 7)
    rng = seeded(11)
    size, m, k, kb, n = 4, 8, 8, 7, 6
    iss = Iss(square_npu(size, sram_words=512))
    a, b, bias, mult = matmul_operands(rng, m, k, n)
    b = b[:kb]
    shift = rng.integers(12, 30, n)
    weights = pack_weight_blocks(b, size, packed=True)
    assert len(weights) == 11
    iss.write_words(0, pack_rows(a, 1, size))
    iss.write_words(100, weights)
    iss.write_words(200, pack_params(bias, mult, shift, size))
    kw = {"size": size, "m": m, "k": k, "n": n, "a_base": 0, "a_row_words": 2, "b_base": 100,
          "p_base": 200, "c_base": 300, "c_row_words": 2, "mode": OutMode.INT8, "b_rows": kb}
    with pytest.raises(ValueError, match="no walk of two 16-bit counts"):
        matmul_launch(packed=True, **kw)
    launches = matmul_launches(packed=True, **kw)
    assert [(x.b_blocks, x.b_last, x.folds) for x in launches] == [(0, 0, 2), (1, 2, 2)]
    iss.run(assemble(emit_matmul, launches))
    got = unpack_rows(iss.read_words(300, m * 2), m, 2 * size, 1)[:, :n]
    want = matmul_unit(a[:, :kb], b, bias, mult, shift, OutMode.INT8)
    bad = np.argwhere(got != want)
    assert not len(bad), f"row {bad[0][0]} column {bad[0][1]}: {got[tuple(bad[0])]}"
