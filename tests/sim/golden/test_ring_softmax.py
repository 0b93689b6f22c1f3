"""sim.golden.ring_softmax: three exact passes over key chunks give the whole row's integers."""

import numpy as np
import pytest

from sim.golden.attention import prob_weighted_sum
from sim.golden.ring_softmax import chunk_exp_sum, chunk_max, merged_pv
from sim.golden.softmax import softmax, softmax_parts


@pytest.mark.parametrize("keys, parts", [(8, 1), (9, 2), (40, 3), (64, 8), (5, 5)])
def test_merged_pv_equals_the_whole_row(rng, keys, parts):
    rows, d = 12, 8
    scores = rng.integers(-2**15, 2**15, (rows, keys))
    scores[:4] = rng.integers(-300, 300, (4, keys))       # close scores: many lanes count
    mask = rng.random((rows, keys)) < 0.7
    mask[0] = False                                        # a fully masked row
    values = rng.integers(-128, 128, (keys, d))
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in np.array_split(np.arange(keys), parts)]
    probs = softmax(scores, mask)
    want = np.array([prob_weighted_sum(probs[r], mask[r], values) for r in range(rows)])
    assert np.array_equal(merged_pv(scores, mask, values, bounds), want)
    parts_ = softmax_parts(scores, mask)
    top = np.max([chunk_max(scores[:, a:b], mask[:, a:b]) for a, b in bounds], axis=0)
    assert np.array_equal(top[1:], parts_["max"][1:, 0])
    total = sum(chunk_exp_sum(scores[:, a:b], mask[:, a:b], top) for a, b in bounds)
    assert np.array_equal(total, parts_["sum"][:, 0])


def test_rescaled_chunk_sums_are_not_exact(rng):
    """Why three passes: a chunk's exponential sum against its own max, rescaled by the
    integer exp of the max difference (online softmax), misses the row's sum."""
    scores = rng.integers(-2000, 2000, (256, 16))
    mask = np.ones(scores.shape, bool)
    whole = softmax_parts(scores, mask)["sum"][:, 0]
    a, b = scores[:, :8], scores[:, 8:]
    top = np.maximum(chunk_max(a, mask[:, :8]), chunk_max(b, mask[:, 8:]))
    online = 0
    for part in (a, b):
        own = chunk_max(part, np.ones(part.shape, bool))
        scale = chunk_exp_sum(own[:, None], np.ones((256, 1), bool), top)     # e(top - own)
        online = online + (chunk_exp_sum(part, np.ones(part.shape, bool), own) * scale
                           >> 15)
    assert (online != whole).any()
