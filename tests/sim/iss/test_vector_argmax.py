"""ARGMAX and ONEHOT on the ISS: a seeded matrix against the golden model (and against
sim.golden.decode.argmax_int, greedy decode's pick), the embedding as one-hot @ E8, and the
rejections of the ISS and of the launch builders."""

from __future__ import annotations

import numpy as np
import pytest

from hw.spec.memory import pack_rows, row_words, unpack_rows
from hw.spec.vector import VectorOp, argmax_words, pack_argmax, unpack_argmax
from hw.spec.vector_engine import VecFlags
from sim.compiler.vector_launch import (
    Rows,
    argmax_launch,
    argmax_pairs_launch,
    emit,
    onehot_launch,
    vector_launch,
)
from sim.golden.decode import argmax_int
from sim.golden.matmul import requant
from sim.golden.vector import argmax16, argmax_pairs, onehot
from sim.iss import IssError
from tests.helpers import assemble, seeded, vector_iss, vector_regs_program


def rows_for(rng, rows, length, lanes):
    x = rng.integers(-(1 << 15), 1 << 15, (rows, length))
    kind = rng.integers(0, 7, rows)
    for r in range(rows):
        k = int(kind[r])
        if k == 1:
            x[r] = rng.integers(-2, 2, length)            # many ties
        elif k == 2:
            x[r, 0] = 32767                              # lane 0
        elif k == 3:
            x[r, -1] = 32767                             # the last lane
        elif k == 4 and length > lanes:
            x[r, lanes] = 32767                          # a beat boundary
        elif k == 5:
            x[r] = x[r, 0]                               # all equal
        elif k == 6:
            x[r] = -rng.integers(1, 1 << 15, length)     # negative
    return x


@pytest.mark.parametrize("size", [2, 4, 8, 16])
def test_iss_matrix(size):
    """ARGMAX then ONEHOT over rows of many lengths and offsets: records == golden ==
    decode's argmax_int (plus the offset), rows == golden one-hot."""
    rng = seeded(10 + size)
    for trial in range(12):
        length = int(rng.choice([1, 2, size - 1 or 1, size, size + 1, 3 * size + 2, 61]))
        rows = int(rng.integers(1, 6))
        offset = int(rng.choice([0, 1, 4096, 65535]))
        x = rows_for(rng, rows, length, size)
        iss = vector_iss(size)
        iss.mem[:] = rng.integers(0, 256, iss.mem.shape, dtype=np.uint8)
        iss.write_words(0, pack_rows(x, 2, size))
        xa = Rows(0, rows, row_words(length, 2, size), 2)
        rec = argmax_words(size)
        out = Rows(300, rows, row_words(length, 1, size), 1)
        iss.run(assemble(emit, [
            argmax_launch(size=size, length=length, x=xa, record_base=250, offset=offset),
            onehot_launch(size=size, length=length, record_base=250, out=out, offset=offset)]))
        index, value = unpack_argmax(iss.read_words(250, rows * rec).reshape(rows, rec, size))
        got = unpack_rows(iss.read_words(300, rows * out.row_words), rows,
                          out.row_words * size, 1)[:, :length]
        for r in range(rows):
            want = argmax16(x[r], offset)
            i, v = argmax_int(x[r])
            label = f"trial {trial} row {r} (length {length}, offset {offset})"
            assert (index[r], value[r]) == want == (i + offset, v), (
                f"{label}: ISS {(index[r], value[r])}, golden {want}, decode {(i, v)}")
            assert np.array_equal(got[r], onehot(i + offset, offset, length)), label
            assert got[r].sum() == 1 and got[r][i] == 1, label


@pytest.mark.parametrize("size", [2, 4, 8])
def test_iss_pairs_matrix(size):
    """Pair mode over random records (ties in value at random positions, negative and large
    indices): ISS == argmax_pairs == (max value, lowest index among it)."""
    rng = seeded(30 + size)
    rec = argmax_words(size)
    for trial in range(10):
        count, rows = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        index = rng.integers(-(1 << 20), 1 << 20, (rows, count))
        value = rng.integers(-2, 2, (rows, count)) if trial % 2 else \
            rng.integers(-(1 << 15), 1 << 15, (rows, count))
        iss = vector_iss(size)
        iss.write_words(0, pack_argmax(index, value, size).reshape(-1, size))
        iss.run(assemble(emit, [argmax_pairs_launch(size=size, count=count, records_base=0,
                                                    record_base=300, rows=rows)]))
        got_i, got_v = unpack_argmax(iss.read_words(300, rows * rec).reshape(rows, rec, size))
        for r in range(rows):
            best = value[r].max()
            want = (int(index[r][value[r] == best].min()), int(best))
            assert argmax_pairs(index[r], value[r]) == want
            assert (got_i[r], got_v[r]) == want, f"trial {trial} row {r}: {(got_i[r], got_v[r])}"


@pytest.mark.parametrize("size", [4, 8])
def test_iss_pairs_over_the_chips_blocks(size):
    """Pair mode over records gathered chip by chip (each chip's block of every row's record,
    padded to whole engine words: ``stride`` the block, ``row_stride`` a record), as the
    multi-chip pick reads them: ISS == argmax_pairs of each row's records."""
    rng = seeded(40 + size)
    rec = argmax_words(size)
    for trial in range(6):
        count, rows = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        blk = rows * rec + int(rng.integers(0, 3))
        index = rng.integers(0, 1 << 16, (count, rows))
        value = rng.integers(-2, 2, (count, rows))
        iss = vector_iss(size)
        iss.mem[:] = rng.integers(0, 256, iss.mem.shape, dtype=np.uint8)
        for c in range(count):
            iss.write_words(c * blk, pack_argmax(index[c], value[c], size).reshape(-1, size))
        iss.run(assemble(emit, [argmax_pairs_launch(size=size, count=count, records_base=0,
                                                    record_base=300, rows=rows, stride=blk,
                                                    row_stride=rec)]))
        got_i, got_v = unpack_argmax(iss.read_words(300, rows * rec).reshape(rows, rec, size))
        for r in range(rows):
            want = argmax_pairs(index[:, r], value[:, r])
            assert (got_i[r], got_v[r]) == want, f"trial {trial} row {r}: {(got_i[r], got_v[r])}"


def test_onehot_matmul_is_the_embedding():
    """one-hot[1, V] @ E8[V, d] (int32) is E8[t] exactly, so requantising it per column by
    emb_req gives embed_int's REQUANT(E8[t], emb_req, 16)."""
    rng = seeded(7)
    v, d = 37, 8
    e8 = rng.integers(-128, 128, (v, d))
    mult, shift = rng.integers(1, 1 << 15, d), rng.integers(8, 20, d)
    for t in (0, 17, v - 1):
        row = onehot(t, 0, v)
        acc = row @ e8
        assert np.array_equal(acc, e8[t]), t
        assert np.array_equal(requant(acc, mult, shift, 16), requant(e8[t], mult, shift, 16))


def test_record_layout():
    """The record: int32 index at bytes 0..3, int16 value at 4..5, zeros after; one word at
    N >= 8, two at N = 4 (index word, value word), four at N = 2."""
    for size, words in ((2, 4), (4, 2), (8, 1), (16, 1)):
        w = pack_argmax(70000, -2, size)
        assert w.shape == (words, size)
        flat = w.reshape(-1)
        assert list(flat[:8]) == [0x70, 0x11, 0x01, 0x00, 0xFE, 0xFF, 0, 0], (size, flat)
        assert not flat[8:].any()
        index, value = unpack_argmax(w)
        assert (int(index), int(value)) == (70000, -2)
    with pytest.raises(ValueError, match=r"argmax value 32768 does not fit int16"):
        pack_argmax(0, 32768, 4)
    with pytest.raises(ValueError, match=r"argmax index 2147483648 does not fit int32"):
        pack_argmax(1 << 31, 0, 4)


@pytest.mark.parametrize("call, match", [
    (lambda: argmax16([]), r"length=0 is outside \[1, 65535\]"),
    (lambda: argmax16(np.zeros(65536)), r"length=65536 is outside"),
    (lambda: argmax16([1, 2], 65536), r"offset=65536 is outside \[0, 65535\]"),
    (lambda: onehot(3, 0, 0), r"length=0 is outside"),
    (lambda: onehot(3, -1, 4), r"offset=-1 is outside"),
    (lambda: onehot(1 << 31, 0, 4), r"index=2147483648 does not fit"),
    (lambda: argmax_pairs([], []), r"length=0 is outside"),
    (lambda: argmax_pairs([1, 2], [3]), r"2 indices but 1 values"),
    (lambda: argmax_pairs([1], [1 << 15]), r"a value does not fit the record's int16"),
])
def test_golden_rejects(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("kwargs, match", [
    ({"length": 0}, r"length must be in 1\.\.65535, not 0"),
    ({"length": 65536}, r"length must be in 1\.\.65535, not 65536"),
    ({"offset": 65536}, r"ARGMAX index offset n must be in 0\.\.65535, not 65536"),
    ({"offset": -1}, r"not -1"),
    ({"x": Rows(0, 2, 4, 4)}, r"ARGMAX compares int16 elements: a\.eb must be 1 or 2, not 4"),
])
def test_argmax_builder_rejects(kwargs, match):
    args = {"size": 4, "length": 8, "x": Rows(0, 2, 4, 2), "record_base": 100}
    with pytest.raises(ValueError, match=match):
        argmax_launch(**dict(args, **kwargs))


def test_onehot_builder_rejects():
    out = Rows(0, 2, 2, 1)
    with pytest.raises(ValueError, match=r"length must be in 1\.\.65535, not 0"):
        onehot_launch(size=4, length=0, record_base=50, out=out)
    with pytest.raises(ValueError, match=r"ONEHOT takes no operand a"):
        vector_launch(size=4, op=VectorOp.ONEHOT, length=8, a=Rows(0, 2, 2, 1), data=out,
                      stats_base=50)
    with pytest.raises(ValueError, match=r"stats_base is required"):
        vector_launch(size=4, op=VectorOp.ONEHOT, length=8, a=None, data=out)
    with pytest.raises(ValueError, match=r"ARGMAX writes only its records"):
        vector_launch(size=4, op=VectorOp.ARGMAX, length=8, a=Rows(0, 2, 4, 2), data=out,
                      stats_base=50)
    launch = onehot_launch(size=4, length=8, record_base=50, out=out, offset=9)
    assert launch.rd3 is None and (launch.rd5.base, launch.rd5.n[0]) == (50, 2)
    assert launch.regs["VU_N"] == 9 and launch.wr2 is None


@pytest.mark.parametrize("kwargs, match", [
    ({"count": 0}, r"ARGMAX pairs count must be in 1\.\.65535, not 0"),
    ({"rows": 65536}, r"ARGMAX pairs rows must be in 1\.\.65535, not 65536"),
    ({"count": 40000}, r"40000 records of 2 words exceed a generator's 16-bit counts"),
])
def test_pairs_builder_rejects(kwargs, match):
    args = {"size": 4, "count": 3, "records_base": 0, "record_base": 100}
    with pytest.raises(ValueError, match=match):
        argmax_pairs_launch(**dict(args, **kwargs))


def test_iss_rejects_pairs():
    launch = argmax_pairs_launch(size=4, count=3, records_base=0, record_base=100)
    with pytest.raises(IssError, match=r"ARGMAX pairs with VU_N=5: must be 0"):
        _regs_run(dict(launch.regs, VU_N=5), launch.descs)()
    with pytest.raises(IssError, match=r"ARGMAX records via RD5 walk 6 words, but 4 argmax "
                                       r"records are 8 words"):
        _regs_run(dict(launch.regs, VU_LEN=4), launch.descs)()


def _regs_run(regs, descs=None, size=4):
    iss, words = vector_regs_program(regs, descs, size)
    return lambda: iss.run(words)


@pytest.mark.parametrize("change, match", [
    ({"VU_FLAGS": VecFlags(a_bytes=2, wr_data=True, wr_q=True).encode()},
     r"ARGMAX writes its records through WR2: set wr_q and clear wr_data"),
    ({"VU_FLAGS": VecFlags(a_bytes=4, wr_data=False, wr_q=True).encode()},
     r"ARGMAX compares int16 elements: a_bytes must be 1 or 2, not 4"),
    ({"VU_LEN": 0}, r"VU_LEN=0: must be in 1\.\.65535"),
])
def test_iss_rejects_argmax(change, match):
    launch = argmax_launch(size=4, length=8, x=Rows(0, 1, 4, 2), record_base=100)
    with pytest.raises(IssError, match=match):
        _regs_run(dict(launch.regs, **change), launch.descs)()


@pytest.mark.parametrize("change, match", [
    ({"VU_FLAGS": VecFlags(d_bytes=1, wr_data=True, wr_q=True).encode()},
     r"ONEHOT has no q output"),
    ({"VU_FLAGS": VecFlags(d_bytes=1, wr_data=False).encode()}, r"ONEHOT writes nothing"),
    ({"VU_ROWS": 3}, r"ONEHOT records via RD5 walk 4 words, but 3 argmax records are 6 words"),
])
def test_iss_rejects_onehot(change, match):
    launch = onehot_launch(size=4, length=8, record_base=100, out=Rows(0, 2, 2, 1))
    with pytest.raises(IssError, match=match):
        _regs_run(dict(launch.regs, **change), launch.descs)()
