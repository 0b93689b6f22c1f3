"""ARGMAX (and its pair mode) and ONEHOT through the VectorEngine (words in, words out): the
ISS against the golden model, the engine against the ISS (whole memories, random idle and
backpressure), and the engine's cycles against hw.spec.timing.vector.launch_cycles."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hw.spec.memory import pack_rows, row_words, unpack_rows
from hw.spec.timing.vector import PIPELINES, launch_cycles
from hw.spec.vector import VectorOp, argmax_words, pack_argmax, unpack_argmax
from sim.compiler.vector_launch import (
    Rows,
    argmax_launch,
    argmax_pairs_launch,
    emit,
    onehot_launch,
)
from sim.golden.vector import argmax16, argmax_record, onehot
from tests.helpers import assemble, engine_equals_iss, seeded, vector_iss


def logit_rows(rng, rows, length, size):
    """int16 rows with ties, maxima at lane 0, at the last lane and at a word boundary, an
    all-equal row and an all -32768 row (rows >= 5)."""
    x = rng.integers(-(1 << 15), 1 << 15, (rows, length))
    x[0, [1, length - 1]] = 32767          # a tie: index 1 wins
    x[1, 0] = 32767                        # lane 0
    x[2, :] = rng.integers(-9, 9, length)
    x[2, -1] = 20                          # the last lane
    x[3, :] = -(1 << 15)                   # all -32768: index 0
    x[4, :] = 7                            # all equal
    if rows > 5:
        x[5, min(size, length - 1)] = 32767  # the first lane of the second beat
    return x


@pytest.mark.parametrize("seed, size, rows, length, offset", [
    (1, 4, 6, 13, 0), (2, 2, 5, 7, 1000), (3, 8, 6, 19, 65535)])
def test_argmax_then_onehot(seed, size, rows, length, offset):
    """ARGMAX writes one record per row, ONEHOT turns them into int8 rows: ISS == golden,
    engine == ISS; the words around the records and rows kept."""
    rng = seeded(seed)
    iss = vector_iss(size)
    iss.mem[:] = rng.integers(0, 256, iss.mem.shape, dtype=np.uint8)
    x = logit_rows(rng, rows, length, size)
    iss.write_words(0, pack_rows(x, 2, size))
    xa = Rows(0, rows, row_words(length, 2, size), 2)
    rec_base = 200
    rec = argmax_words(size)
    out = Rows(260, rows, row_words(length, 1, size) + 1, 1)
    launches = [argmax_launch(size=size, length=length, x=xa, record_base=rec_base,
                              offset=offset),
                onehot_launch(size=size, length=length, record_base=rec_base, out=out,
                              offset=offset)]
    before = iss.mem.copy()
    iss.run(assemble(emit, launches))
    words = iss.read_words(rec_base, rows * rec).reshape(rows, rec, size)
    index, value = unpack_argmax(words)
    for r in range(rows):
        want = argmax16(x[r], offset)
        assert (index[r], value[r]) == want, f"row {r}: record {(index[r], value[r])} != {want}"
        assert np.array_equal(words[r], argmax_record(x[r], offset, size)), f"row {r} words"
    got = unpack_rows(iss.read_words(out.base, rows * out.row_words), rows,
                      out.row_words * size, 1)[:, :length]
    for r in range(rows):
        want = onehot(int(index[r]), offset, length)
        assert np.array_equal(got[r], want), f"row {r}: one-hot {got[r]} != {want}"
    spare = [out.base + r * out.row_words + out.row_words - 1 for r in range(rows)]
    assert np.array_equal(iss.mem[spare], before[spare])
    engine_equals_iss(iss, before, launches, rng)


def test_onehot_outside_the_block():
    """Indices below and past this chip's block (offset .. offset + length - 1) give all-zero
    rows; the engine agrees with the ISS."""
    rng = seeded(4)
    size, length, offset = 4, 6, 100
    iss = vector_iss(size)
    iss.mem[:] = rng.integers(0, 256, iss.mem.shape, dtype=np.uint8)
    recs = pack_argmax([99, 106, 100, 105], [1, 2, 3, 4], size)
    iss.write_words(40, recs.reshape(-1, size))
    out = Rows(80, 4, row_words(length, 1, size), 1)
    launch = onehot_launch(size=size, length=length, record_base=40, out=out, offset=offset)
    before = iss.mem.copy()
    iss.run(assemble(emit, [launch]))
    got = unpack_rows(iss.read_words(80, 4 * out.row_words), 4, out.row_words * size,
                      1)[:, :length]
    want = np.zeros((4, length), np.int64)
    want[2, 0] = want[3, 5] = 1
    assert np.array_equal(got, want), got
    engine_equals_iss(iss, before, [launch], rng)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("size, rows, length, eb", [
    (4, 3, 13, 2), (2, 2, 5, 2), (8, 2, 20, 1), (4, 3, 20, 1), (4, 2, 5, 2), (2, 3, 3, 4)])
def test_cycles_match_formula(size, rows, length, eb, pipeline):
    """With every input valid and every output ready, ARGMAX (``eb``: its rows' element
    bytes; 4 stands for 2) and ONEHOT (``eb``: its output's) take exactly ``launch_cycles``,
    whatever the data."""
    rng = seeded(size * 100 + rows * 10 + length)
    iss = vector_iss(size)
    iss.mem[:] = rng.integers(0, 256, iss.mem.shape, dtype=np.uint8)
    a_eb = min(eb, 2)
    xa = Rows(0, rows, row_words(length, a_eb, size), a_eb)
    out = Rows(300, rows, row_words(length, eb, size), eb)
    launches = [argmax_launch(size=size, length=length, x=xa, record_base=200, offset=3),
                onehot_launch(size=size, length=length, record_base=200, out=out, offset=3)]
    before = iss.mem.copy()
    iss.run(assemble(emit, launches))
    cycles = engine_equals_iss(iss, before, launches, rng, idle=0, stall=0, pipeline=pipeline)
    want = [launch_cycles(la.op, rows=rows, length=length, lanes=size, flags=la.flags,
                          pipeline=pipeline) for la in launches]
    print(f"N={size} rows={rows} length={length} eb={eb}: ARGMAX, ONEHOT {cycles} cycles "
          f"(formula {want})")
    assert cycles == want
    assert [la.op for la in launches] == [VectorOp.ARGMAX, VectorOp.ONEHOT]


@pytest.mark.parametrize("seed, size, chips", [(5, 4, 3), (6, 8, 2), (7, 2, 4)])
def test_partial_argmaxes_combine(seed, size, chips):
    """A vocabulary split over ``chips`` blocks: ARGMAX of each block with its offset, the
    records side by side, then ARGMAX in pair mode == ARGMAX of the whole row (ISS == golden,
    engine == ISS), ties across blocks included (the lower index wins); the pair launch's
    cycles == launch_cycles."""
    rng = seeded(seed)
    rows, block = 5, 7
    vocab = chips * block
    x = rng.integers(-(1 << 15), 1 << 15, (rows, vocab))
    x[0, [block + 1, 2 * block - 1]] = 32767         # a tie inside one block
    x[1, [2, vocab - 1]] = 32767                     # a tie across the first and last blocks
    x[2, :] = -(1 << 15)                             # all -32768: index 0
    x[3, :] = rng.integers(-2, 2, vocab)
    iss = vector_iss(size)
    iss.mem[:] = rng.integers(0, 256, iss.mem.shape, dtype=np.uint8)
    rec = argmax_words(size)
    # Record layout: row r's chip c record at 200 + (r * chips + c) * rec.
    launches = []
    for c in range(chips):
        base = 40 * c
        iss.write_words(base, pack_rows(x[:, c * block:(c + 1) * block], 2, size))
        launch = argmax_launch(size=size, length=block,
                               x=Rows(base, rows, row_words(block, 2, size), 2),
                               record_base=200 + c * rec, offset=c * block)
        # Row r's record goes after the other chips' records of row r.
        wr2 = dataclasses.replace(launch.wr2, s=(1, chips * rec, 0, 0))
        launches.append(dataclasses.replace(launch, wr2=wr2))
    pair = argmax_pairs_launch(size=size, count=chips, records_base=200, record_base=400,
                               rows=rows)
    launches.append(pair)
    before = iss.mem.copy()
    iss.run(assemble(emit, launches))
    index, value = unpack_argmax(iss.read_words(400, rows * rec).reshape(rows, rec, size))
    for r in range(rows):
        want = argmax16(x[r])
        assert (index[r], value[r]) == want, f"row {r}: combined {(index[r], value[r])} != {want}"
    engine_equals_iss(iss, before, launches, rng)
    iss.run(assemble(emit, [pair]))
    (cycles,) = engine_equals_iss(iss, iss.mem.copy(), [pair], rng, idle=0, stall=0)
    assert cycles == launch_cycles(VectorOp.ARGMAX, rows=rows, length=chips, lanes=size,
                                   flags=pair.flags)
