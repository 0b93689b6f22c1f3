"""sim.golden.ring_softmax: partial softmax states, their exact merge and final normalisation."""

import numpy as np
import pytest

from hw.spec.softmax import EMPTY_MAX, MERGE_BITS
from sim.golden.attention import prob_weighted_sum
from sim.golden.matmul import requant
from sim.golden.ring_softmax import (
    State,
    chunked_attention,
    empty_state,
    merge,
    normalise_state,
    partial_state,
)
from sim.golden.softmax import exp_factor, partial_softmax, softmax, softmax_float


def random_state(rng, rows, h):
    return State(rng.integers(-2**15, 2**15, rows), rng.integers(0, 2**20, rows),
                 rng.integers(-2**28, 2**28, (rows, h)))


def states_equal(a, b):
    return (np.array_equal(a.m, b.m) and np.array_equal(a.l, b.l)
            and np.array_equal(a.o, b.o))


def test_partial_softmax_lanes(rng):
    """The maximum lane's u is 255 (256/256 saturated), masked lanes 0, the sum is the sum of
    the lanes, a fully masked row has the empty maximum and sum 0."""
    scores = rng.integers(-3000, 3000, (20, 16))
    mask = rng.random((20, 16)) < 0.8
    mask[0] = False
    part = partial_softmax(scores, mask)
    assert part["max"][0] == EMPTY_MAX and part["sum"][0] == 0 and not part["u"][0].any()
    for r in range(1, 20):
        if not mask[r].any():
            continue
        top = scores[r][mask[r]].max()
        assert part["max"][r] == top, f"row {r}: max"
        assert part["u"][r][mask[r] & (scores[r] == top)].min() == 255, f"row {r}: top lane"
        assert not part["u"][r][~mask[r]].any(), f"row {r}: masked lanes"
        assert part["sum"][r] == part["u"][r].sum(), f"row {r}: sum"


def test_exp_factor():
    d = np.arange(0, 70000, 37)
    f = exp_factor(d)
    assert exp_factor(0) == 1 << MERGE_BITS
    assert (np.diff(f) <= 0).all(), "the factor must not grow with the distance"
    assert f[-1] == 0
    # y has 8 fraction bits (a relative error of up to 2**-9 ln 2), the shift truncates.
    want = np.exp(-d / 256)
    excess = np.abs(f / 2**MERGE_BITS - want) - (2**-9 * np.log(2) * want + 2**-MERGE_BITS)
    assert excess.max() <= 0, f"exp factor error beyond the bound at d={d[excess.argmax()]}"


def test_empty_state_is_the_identity(rng):
    s = random_state(rng, 30, 6)
    assert states_equal(merge(s, empty_state(30, 6)), s)
    assert states_equal(merge(empty_state(30, 6), s), s)
    e = merge(empty_state(3, 2), empty_state(3, 2))
    assert states_equal(e, empty_state(3, 2))


def test_merge_is_commutative_and_keeps_the_larger_side(rng):
    a, b = random_state(rng, 200, 4), random_state(rng, 200, 4)
    ab, ba = merge(a, b), merge(b, a)
    assert states_equal(ab, ba)
    assert np.array_equal(ab.m, np.maximum(a.m, b.m))
    # Equal maxima: both factors are 1.0, the sums are exact.
    c = State(a.m, b.l, b.o)
    assert np.array_equal(merge(a, c).l, a.l + b.l)


def test_merge_order_matters(rng):
    """Not associative (the rounding of the smaller side): why a schedule fixes the order."""
    a, b, c = (random_state(rng, 500, 4) for _ in range(3))
    left, right = merge(merge(a, b), c), merge(a, merge(b, c))
    assert not states_equal(left, right)


def test_one_chunk_normalised_is_close_to_the_softmax(rng):
    """A single chunk's state, normalised: within 2 LSB of the P.V of the normalised
    probabilities (per 256 of total probability and |v| < 128: 2 * 128 of the int32 sum)."""
    rows, keys, h = 64, 16, 8
    scores = rng.integers(-1500, 1500, (rows, keys))
    mask = rng.random((rows, keys)) < 0.85
    mask[:, 0] = True
    v = rng.integers(-128, 128, (keys, h))
    acc = normalise_state(partial_state(scores, mask, v))
    probs = softmax(np.where(mask, scores, 0), mask)
    want = np.array([prob_weighted_sum(probs[r], mask[r], v) for r in range(rows)])
    assert np.abs(acc - want).max() <= 2 * 128 * 3, np.abs(acc - want).max()


@pytest.mark.parametrize("keys, chunks", [(32, 2), (64, 4), (64, 8), (33, 3)])
def test_chunked_attention_against_float64(rng, keys, chunks):
    """Merged chunks against float64 attention: as close as one integer softmax over the
    whole row (the output is int8 of the P.V scale: an LSB is 2**out_shift / out_mult)."""
    rows, h = keys, 8
    q8 = rng.integers(-60, 60, (rows, h))
    k8 = rng.integers(-60, 60, (keys, h))
    v = rng.integers(-128, 128, (keys, h))
    mult, shift = 23170, 19       # ~ 2**8 / sqrt(8) / 2**? : scores of a few units
    raw = q8 @ k8.T
    mask = np.tril(np.ones((rows, keys), bool))
    scores = np.where(mask, requant(raw, mult, shift, 16), 0)
    bounds = [(int(a[0]), int(a[-1]) + 1) for a in np.array_split(np.arange(keys), chunks)]
    order = [(r0, r1, [bounds[j] for j in range(i, -1, -1)])
             for i, (r0, r1) in enumerate(bounds)]
    out_mult, out_shift = 1 << 15, 23             # P.V / 256: int8 of the V scale
    got = chunked_attention(scores, mask, v, order, out_mult, out_shift)
    whole = chunked_attention(scores, mask, v, [(0, rows, [(0, keys)])], out_mult, out_shift)
    ref = softmax_float(scores, mask) @ v
    err_chunked, err_whole = np.abs(got - ref).max(), np.abs(whole - ref).max()
    assert err_chunked <= max(1.5 * err_whole, 2.0), (err_chunked, err_whole)
    cos = (got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref)
    assert cos > 0.999, cos


def test_chunked_one_chunk_is_the_plain_softmax(rng):
    scores = rng.integers(-900, 900, (10, 12))
    mask = rng.random((10, 12)) < 0.7
    mask[:, 3] = True
    v = rng.integers(-128, 128, (12, 4))
    got = chunked_attention(scores, mask, v, [(0, 4, [(0, 12)]), (4, 10, [(0, 12)])], 300, 12)
    probs = softmax(np.where(mask, scores, 0), mask)
    acc = np.array([prob_weighted_sum(probs[r], mask[r], v) for r in range(10)])
    assert np.array_equal(got, requant(acc, 300, 12, 8))


def test_masked_chunks_change_nothing(rng):
    """A chunk a row cannot see is the empty state: leaving it out gives the same integers."""
    scores = rng.integers(-900, 900, (8, 24))
    mask = np.ones((8, 24), bool)
    mask[:, 16:] = False
    v = rng.integers(-128, 128, (24, 4))
    a = chunked_attention(scores, mask, v, [(0, 8, [(8, 16), (16, 24), (0, 8)])], 300, 12)
    b = chunked_attention(scores, mask, v, [(0, 8, [(8, 16), (0, 8)])], 300, 12)
    assert np.array_equal(a, b)


def test_order_must_cover_every_row(rng):
    with pytest.raises(ValueError, match="cover every row"):
        chunked_attention(np.zeros((4, 4), np.int64), np.ones((4, 4), bool),
                          np.zeros((4, 2), np.int64), [(0, 3, [(0, 2), (2, 4)])], 1, 1)
