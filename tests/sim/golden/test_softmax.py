"""Golden integer softmax vs float64: error bound, mass conservation, masking, edge rows."""

import numpy as np
import pytest

from hw.spec.softmax import EXP_BITS
from sim.golden.softmax import softmax, softmax_float, softmax_parts
from tests.helpers import edge_rows, random_rows


@pytest.mark.parametrize("length", [2, 5, 16, 64])
def test_error_vs_float64(rng, length):
    """Max abs error <= 2**-8 (the contract allows 2**-7): 0.5 LSB rounding + exp/reciprocal
    error stays below 0.62 LSB; a lane of probability ~1.0 saturates to 255/256 (1 LSB)."""
    scores, mask = random_rows(rng, 20_000, length)
    es, em = edge_rows(length)
    scores, mask = np.concatenate([scores, es]), np.concatenate([mask, em])
    got = softmax(scores, mask).astype(np.float64) / 256
    ref = softmax_float(scores, mask)
    err = np.abs(got - ref)
    r, j = np.unravel_index(np.argmax(err), err.shape)
    print(f"L={length}: max abs error {err.max():.6f} = {err.max() * 256:.3f} LSB "
          f"(row {r} lane {j})")
    assert err.max() <= 2.0 ** -8, (
        f"row {r} lane {j}: |{got[r, j]} - {ref[r, j]}| = {err[r, j]} > 2**-8; "
        f"scores {scores[r].tolist()} mask {mask[r].astype(int).tolist()}")
    unsaturated = got < 255 / 256
    assert err[unsaturated].max() <= 0.625 / 256


@pytest.mark.parametrize("length", [16, 64])
def test_mass_conservation(rng, length):
    """Each visible lane rounds to within 1/2 LSB (+ <1/8 LSB in all from the reciprocal) and
    at most one lane saturates by <= 1 LSB, so |sum(p) - 256| <= n_visible // 2 + 1; on random
    rows the mean deviation is far smaller."""
    scores, mask = random_rows(rng, 20_000, length)
    p = softmax(scores, mask).astype(np.int64)
    visible = mask.sum(axis=1)
    rows = visible > 0
    dev = np.abs(p.sum(axis=1) - 256)
    bound = visible // 2 + 1
    bad = np.flatnonzero(rows & (dev > bound))
    assert bad.size == 0, (f"row {bad[0]}: sum {p[bad[0]].sum()} deviates from 256 by more "
                           f"than {bound[bad[0]]}")
    print(f"L={length}: |sum - 256| max {dev[rows].max()}, mean {dev[rows].mean():.3f}")
    assert dev[rows].mean() <= {16: 1.0, 64: 2.0}[length]
    assert np.all(p[~rows] == 0)


def test_masked_lanes_and_empty_rows(rng):
    scores, mask = random_rows(rng, 5_000, 16)
    p = softmax(scores, mask)
    assert np.all(p[~mask] == 0), "masked lanes must be exactly 0"
    empty = softmax(scores, np.zeros_like(mask))
    assert np.all(empty == 0), "a fully masked row must be all zeros"
    assert np.all(softmax_float(scores, np.zeros_like(mask)) == 0)


def test_edge_rows_values():
    L = 16
    scores, mask = edge_rows(L)
    p = softmax(scores, mask)
    assert np.all(p[0] == 16) and np.all(p[1] == 16) and np.all(p[2] == 16)
    assert p[3, 1] == 255 and np.all(np.delete(p[3], 1) == 0)
    assert p[5, 0] == 255 and np.all(p[5, 1:] == 0)
    assert np.all(p[8, L // 2:] == 0) and np.all(p[8, :L // 2] == 256 // (L // 2))
    assert p[9, L - 1] == 255 and np.all(p[9, :-1] == 0)
    assert np.all(p[10] == 0)


def test_parts_are_consistent(rng):
    scores, mask = random_rows(rng, 2_000, 16)
    parts = softmax_parts(scores, mask)
    total = parts["sum"][:, 0]
    some = total > 0
    assert np.all(total[some] >= 1 << EXP_BITS)
    z = parts["z"][:, 0]
    assert np.all((total[some] >> z[some]) == 1), "z must be the position of the leading one"
    r = parts["recip"][:, 0]
    assert np.all((r[some] >= 1 << 11) & (r[some] <= 1 << 12))


@pytest.mark.parametrize("bad, match", [
    ({"scores": np.zeros((2, 4), dtype=np.float64)}, "integer array"),
    ({"scores": np.zeros((2, 1), dtype=np.int64)}, "at least 2 lanes"),
    ({"scores": np.full((2, 4), 40000)}, "outside int16"),
    ({"scores": np.zeros((2, 4), dtype=np.int64), "mask": np.ones((2, 3))}, "mask shape"),
])
def test_rejects_bad_input(bad, match):
    with pytest.raises((TypeError, ValueError), match=match):
        softmax(bad["scores"], bad.get("mask"))
