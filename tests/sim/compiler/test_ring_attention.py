"""Ring attention (``--strategy sequence``, full attention beyond one chip's K/V ring): each
chip's queries stay, the K/V chunks travel the ring, every chunk's partial softmax is merged
into the queries' state rows in the ring's order (``hw.spec.attention.block_order``); the ISS
equals the golden's exact merge bit for bit, and one chip in passes gives the same integers."""

import dataclasses

import numpy as np
import pytest

from hw.spec import model_preset, npu_preset
from hw.spec.attention import chunk_order
from sim.compiler.quantize import quantize_model
from sim.compiler.sequence import compile_sequence, merge_order, zigzag_halves
from sim.errors import BadInput
from sim.flows.simulate import simulate
from sim.golden.float_model import random_weights

TINY = npu_preset("tiny")
#: seq = 4 x attn_window (16); one layer keeps the runs short.
LONG = dataclasses.replace(model_preset("tiny"), seq_len=4 * TINY.attn_window, n_layers=1,
                           name="tiny-long")


@pytest.mark.parametrize("causal", [True, False])
def test_four_chips_equal_one_chip_in_passes(causal):
    """4 chips, seq = 4 x attn_window: bit-exact with the golden in the ring's merge order,
    which is one chip's order in passes of attn_window queries: the same integers."""
    cfg = dataclasses.replace(LONG, causal=causal)
    ring = simulate(TINY, cfg, strategy="sequence", chips=4, backend="iss", seed=6,
                    reference="none", order="plain")
    assert ring.golden_match, f"first mismatch {ring.first_mismatch}"
    assert merge_order(TINY, cfg, 4, 64) == chunk_order(64, 16, causal=causal, ring=16)
    one = simulate(TINY, cfg, strategy="single", backend="iss", seed=6)
    assert one.golden_match, f"one chip: first mismatch {one.first_mismatch}"
    bad = np.argwhere(ring.output != one.output)
    assert not len(bad), f"ring and one chip differ first at {bad[0].tolist()}"
    assert ring.cosine > 0.999, f"cosine vs float64 {ring.cosine}"
    # The report's sequence section: K/V bytes each chip sends (a chunk's 16 rows of K and V,
    # 32 lanes each, per chunk it sends on), its transfers hidden or exposed, the merge.
    q = ring.sequence
    chunk = 16 * 64
    want = [chunk * c for c in (1, 2, 3, 0)] if causal else [3 * chunk] * 4
    assert q["kv_bytes_sent"] == want, q["kv_bytes_sent"]
    assert all(h > 0 for h in q["transfer_hidden_cycles"][:3]), q["transfer_hidden_cycles"]
    merges = [0, 1, 2, 3] if causal else [3] * 4       # state launches after the first
    assert [m > 0 for m in q["merge_cycles"]] == [k > 0 for k in merges], q["merge_cycles"]
    assert all(0 <= s < 0.1 for s in q["merge_share"]), q["merge_share"]
    assert (q["attention_imbalance"] > 1.3) == causal, q["attention_imbalance"]
    assert "ring attention: K/V sent per chip" in ring.summary()


@pytest.mark.slow
def test_llama_two_chips_and_one_chip_sequence():
    """RoPE and grouped-query attention on 4 chips and on 2 (chunks of 2 x attn_window: each
    chip's queries in two runs, its own keys in two chunks); the sequence strategy on one chip
    merges too."""
    cfg = dataclasses.replace(model_preset("tiny-llama"), seq_len=64, n_layers=1,
                              name="tiny-llama-long")
    for chips in (4, 2):
        r = simulate(TINY, cfg, strategy="sequence", chips=chips, backend="iss", seed=7,
                     reference="none")
        assert r.golden_match, f"{chips} chips: first mismatch {r.first_mismatch}"
    assert merge_order(TINY, cfg, 2, 64)[1] == (16, 32, [(0, 16), (16, 32)])
    short = dataclasses.replace(LONG, seq_len=40, causal=False)
    r = simulate(TINY, short, strategy="sequence", chips=1, backend="iss", seed=8)
    assert r.golden_match, f"one chip: first mismatch {r.first_mismatch}"


def test_uneven_chunks_beyond_the_ring():
    """50 tokens on 4 chips (13, 13, 12, 12: blocks of unequal length) and on 2 (25 each, more
    than the ring of 16: each chip's queries in two runs, its own keys in two chunks), merged
    in the ring's order."""
    cfg = dataclasses.replace(LONG, seq_len=50)
    for chips in (4, 2):
        r = simulate(TINY, cfg, strategy="sequence", chips=chips, backend="iss", seed=9,
                     reference="none")
        assert r.golden_match, f"{chips} chips: first mismatch {r.first_mismatch}"
    assert merge_order(TINY, cfg, 4, 50)[1] == (13, 26, [(13, 26), (0, 13)])
    assert merge_order(TINY, cfg, 2, 50)[1] == (16, 25, [(0, 16), (16, 25)])


def test_twenty_tokens_on_three_chips_of_an_eight_key_ring():
    """Each query's 20 keys exceed the ring of 8 (what used to be refused): chunks of 7, 7, 6
    merged, causal and bidirectional."""
    npu = dataclasses.replace(TINY, max_seq_len=8, attn_window=8, softmax_len=8, name="short")
    for causal in (True, False):
        cfg = dataclasses.replace(LONG, seq_len=20, causal=causal)
        r = simulate(npu, cfg, strategy="sequence", chips=3, backend="iss", seed=10,
                     reference="none")
        assert r.golden_match, f"causal {causal}: first mismatch {r.first_mismatch}"


@pytest.mark.parametrize("chips", [4, pytest.param(2, marks=pytest.mark.slow)])
def test_zigzag_order_equals_the_plain_order(chips):
    """Causal ring attention in the zig-zag order (chip c an early and a late block of 2 x
    chips): the plain order's integers (every query merges the same chunks in the same
    order), the attention work even across the chips, every chip sending every other its
    blocks, and fewer cycles than the plain order on 4 x attn_window tokens."""
    runs = {order: simulate(TINY, LONG, strategy="sequence", chips=chips, backend="iss",
                            seed=6, reference="none", order=order)
            for order in ("plain", "zigzag")}
    zig, plain = runs["zigzag"], runs["plain"]
    assert zig.golden_match, f"zig-zag: first mismatch {zig.first_mismatch}"
    bad = np.argwhere(zig.output != plain.output)
    assert not len(bad), f"zig-zag and plain differ first at {bad[0].tolist()}"
    q, p = zig.sequence, plain.sequence
    assert (q["order"], p["order"]) == ("zigzag", "plain")
    h = 64 // (2 * chips)
    assert q["chunks"] == [[list(a), list(b)] for a, b in zigzag_halves(64, chips)]
    assert sorted(t for pair in q["chunks"] for t in pair) == \
        [[z * h, z * h + h] for z in range(2 * chips)]
    assert q["kv_bytes_sent"] == [(chips - 1) * 2 * h * 64] * chips, q["kv_bytes_sent"]
    assert q["attention_imbalance"] < 1.01 and p["attention_imbalance"] > 1.3, \
        (q["attention_imbalance"], p["attention_imbalance"])
    assert zig.cycles < plain.cycles, (zig.cycles, plain.cycles)
    assert "zigzag order): tokens " in zig.summary()


def test_zigzag_order_where_it_applies():
    """``auto`` runs zig-zag for causal ring attention whose blocks hold attn_window / 2
    queries or more (2 and 4 chips over 64 tokens), the plain order on 8 (blocks of 4) and
    for RoPE, bidirectional or windowed attention; asked for where it does not apply, it is
    refused naming why, and --order applies to the sequence strategy only."""
    def order(cfg, chips, **kw):
        qm = quantize_model(cfg, random_weights(cfg, 1), np.zeros((cfg.seq_len, cfg.d_model)))
        return compile_sequence(TINY, qm, chips, **kw).meta["order"]

    assert [order(LONG, c) for c in (2, 4, 8)] == ["zigzag", "zigzag", "plain"]
    assert order(LONG, 8, order="zigzag") == "zigzag"
    assert order(dataclasses.replace(LONG, causal=False), 4) == "plain"
    rope = dataclasses.replace(LONG, rope_theta=1e4)
    assert order(rope, 4) == "plain"
    with pytest.raises(ValueError, match="cannot run the zig-zag order: RoPE"):
        order(rope, 4, order="zigzag")
    with pytest.raises(ValueError, match="seq_len 60 is not a multiple of 2 x 4"):
        order(dataclasses.replace(LONG, seq_len=60), 4, order="zigzag")
    with pytest.raises(ValueError, match="order must be one of auto, plain, zigzag"):
        order(LONG, 4, order="striped")
    with pytest.raises(BadInput, match="--order applies to --strategy sequence, not head"):
        simulate(TINY, LONG, strategy="head", chips=2, backend="iss", order="zigzag")
