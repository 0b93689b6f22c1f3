"""The attention buffer's golden model against naive definitions and a float64 reference."""

import numpy as np
import pytest

from hw.spec.formats import SCORE_FRAC_BITS, quantize_multiplier
from sim.golden.attention import (
    KV,
    KVRing,
    Query,
    prob_weighted_sum,
    run_sequence,
    score_row,
    shard_sizes,
    split_partials,
    visible_mask,
    windowed_attention_reference,
)
from sim.golden.matmul import requant, wrap


def naive_masks(events, window, length):
    """Visibility by definition: the tokens written since the last restart, of which the ring
    holds the newest ``window`` (token number t since the restart sits in lane t mod window);
    a query at i sees a held key at p when i - window < p <= i (causal) or always (bidir)."""
    written = []
    masks = []
    for kind, pos, first, bidir in events:
        if kind == "kv":
            written = [pos] if first else written + [pos]
            continue
        mask = np.zeros(length, dtype=bool)
        for t, p in enumerate(written):
            if t < len(written) - window:
                continue  # overwritten
            mask[t % window] = bidir or (pos - window < p <= pos)
        masks.append(mask)
    return masks


@pytest.mark.parametrize("window, length", [(16, 16), (5, 8), (1, 1)])
def test_mask_matches_naive_definition(rng, window, length):
    d = 4
    ring = KVRing(window=window, d_head=d, length=length)
    events, got = [], []
    pos = int(rng.integers(0, 1000))
    for _ in range(300):
        r = rng.random()
        if r < 0.05:
            pos = int(rng.integers(0, 60000))
            events.append(("kv", pos, True, False))
        elif r < 0.5:
            pos += 1
            events.append(("kv", pos, False, False))
        else:
            # Queries at, before and after the newest key: keys ahead of i are masked too.
            events.append(("q", pos + int(rng.integers(-window - 2, window + 2)), False,
                           bool(rng.random() < 0.2)))
    for kind, p, first, bidir in events:
        if kind == "kv":
            ring.write(np.zeros(d, dtype=int), np.zeros(d, dtype=int), p, first=first)
        else:
            got.append(ring.mask(p, bidirectional=bidir))
    for n, (g, e) in enumerate(zip(got, naive_masks(events, window, length), strict=True)):
        assert np.array_equal(g, e), f"query {n}: {g.astype(int)} != {e.astype(int)}"


def test_visible_mask_window_edges():
    pos = np.array([9, 10, 25, 26, 0])  # i - W < p <= i: 10..25 for i = 25, W = 16
    held = np.array([True, True, True, True, False])
    assert visible_mask(pos, held, 25, 16, bidirectional=False).tolist() == [
        False, True, True, False, False]
    assert visible_mask(pos, held, 25, 16, bidirectional=True).tolist() == [
        True, True, True, True, False]


def test_score_row_rounding_saturation_and_mask():
    raw = np.array([3, -3, 2**31 - 1, -2**31, 1000, 5])
    mask = np.array([1, 1, 1, 1, 1, 0])
    # (3+1)>>1 = 2, (-3+1)>>1 = -1 (floor), then saturation both ways; masked lanes are 0.
    assert score_row(raw, mask, 1, 1).tolist() == [2, -1, 32767, -32768, 500, 0]
    assert score_row(raw, mask, 65535, 47).tolist() == [0, 0, 1, -1, 0, 0]
    r = np.random.default_rng(5).integers(-2**31, 2**31, size=100)
    assert np.array_equal(score_row(r, np.ones(100), 40000, 20), requant(r, 40000, 20, 16))


def test_prob_weighted_sum_ignores_masked_lanes(rng):
    probs = rng.integers(0, 256, size=16)
    values = rng.integers(-128, 128, size=(16, 8))
    mask = rng.random(16) < 0.5
    expected = [sum(int(probs[j]) * int(values[j, d]) for j in range(16) if mask[j])
                for d in range(8)]
    assert prob_weighted_sum(probs, mask, values).tolist() == expected
    with pytest.raises(ValueError, match="unsigned 8-bit"):
        prob_weighted_sum(probs + 256, mask, values)


@pytest.mark.parametrize("d_head, shards", [(8, 2), (7, 2), (7, 3), (16, 3), (13, 4)])
def test_split_partials_sum_to_unsplit(rng, d_head, shards):
    q = rng.integers(-128, 128, size=d_head)
    keys = rng.integers(-128, 128, size=(16, d_head))
    parts = split_partials(q, keys, shards)
    assert [len(p) for p in parts] == [16] * shards
    assert sum(shard_sizes(d_head, shards)) == d_head
    assert np.array_equal(wrap(sum(parts)), wrap(keys @ q))


def test_split_partials_wrap_around():
    """A (hypothetical) d_head long enough that q.k overflows int32: the wrapped shard sums still
    equal the wrapped unsplit sum, over uneven shards."""
    d_head = 140_001  # 140001 * 127 * 127 > 2**31
    q = np.full(d_head, 127)
    keys = np.full((2, d_head), 127)
    keys[1] = -128
    full = wrap(keys @ q)
    assert full[0] < 0 and full[1] > 0, "the test must actually wrap"
    for shards in (2, 3):
        assert np.array_equal(wrap(sum(split_partials(q, keys, shards))), full)


def test_run_sequence_halo_and_split(rng):
    d, window = 4, 8
    cmds = [KV(rng.integers(-128, 128, d), rng.integers(-128, 128, d), p, first=p == 33)
            for p in range(33, 40)]  # halo below a chunk base of 40
    cmds += [KV(rng.integers(-128, 128, d), rng.integers(-128, 128, d), 40),
             Query(rng.integers(-128, 128, d), 40, 30000, 14),
             Query(rng.integers(-128, 128, d), 40, 30000, 14, split=True)]
    res = run_sequence(cmds, window=window, d_head=d, length=window,
                       probs_fn=lambda n, s, m: np.full(window, 7),
                       reduced_fn=lambda n, partial: partial)
    assert res[0]["mask"].sum() == window  # keys 33..40
    assert np.array_equal(res[1]["reduced"], res[1]["partial"])
    assert np.array_equal(res[0]["out"], 7 * sum(c.v for c in cmds[:8]))


@pytest.mark.parametrize("kwargs, match", [
    ({"window": 16, "d_head": 8, "length": 8}, "length=8 must be >= window=16"),
])
def test_ring_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KVRing(**kwargs)


def test_ring_rejects_bad_tokens():
    ring = KVRing(window=4, d_head=2, length=4)
    with pytest.raises(ValueError, match="position 65536 does not fit 16 bits"):
        ring.write([0, 0], [0, 0], 65536)
    with pytest.raises(ValueError, match="k has values outside int8"):
        ring.write([128, 0], [0, 0], 1)
    with pytest.raises(ValueError, match=r"v must have shape \(2,\)"):
        ring.write([0, 0], [0, 0, 0], 1)


def test_integer_pipeline_tracks_float_reference(rng):
    """Quantised Q/K/V through the golden unit (with a float softmax rounded to p/256) against
    float64 windowed attention: the integer path is only as good as its 8-bit operands."""
    n, d, window = 40, 16, 16
    qf, kf, vf = (rng.standard_normal((n, d)) for _ in range(3))
    scales = [np.abs(x).max() / 127 for x in (qf, kf, vf)]
    qi, ki, vi = (np.round(x / s).astype(np.int64) for x, s in zip((qf, kf, vf), scales,
                                                                   strict=True))
    mult, shift = quantize_multiplier(scales[0] * scales[1] / np.sqrt(d) * 2**SCORE_FRAC_BITS)

    def probs_fn(i, scores, mask):
        s = np.where(mask.astype(bool), scores / 2**SCORE_FRAC_BITS, -np.inf)
        e = np.exp(s - s.max())
        return np.minimum(np.round(e / e.sum() * 256), 255).astype(np.int64)

    cmds = []
    for t in range(n):
        cmds += [KV(ki[t], vi[t], t, first=t == 0), Query(qi[t], t, mult, shift)]
    res = run_sequence(cmds, window=window, d_head=d, length=window, probs_fn=probs_fn)
    out = np.array([r["out"] for r in res]) * scales[2] / 256
    ref = windowed_attention_reference(qf, kf, vf, window=window, causal=True)
    err = np.abs(out - ref).max()
    cos = (out * ref).sum() / np.linalg.norm(out) / np.linalg.norm(ref)
    print(f"max abs error {err:.4f}, cosine {cos:.5f}")
    assert err < 0.05 and cos > 0.999
