"""Long context on one chip: full attention over more keys than the K/V ring holds, in passes
of ``attn_window`` queries over chunks of ``attn_window`` keys whose partial softmaxes merge
through state rows (``sim.compiler.blocks``, ``hw.spec.attention.chunk_order``); the ISS equals
the golden's exact merge in the same order bit for bit."""

import dataclasses

import numpy as np
import pytest

from hw.spec import ConfigError, model_preset, npu_preset
from hw.spec.attention import chunk_order
from sim.compiler.attention_launch import chunk_bidirectional, long_order, plan_schedule
from sim.flows.simulate import simulate

TINY = npu_preset("tiny")
#: seq = 4 x attn_window (16) = max_seq_len on the tiny NPU; one layer keeps the ISS run short.
LONG = dataclasses.replace(model_preset("tiny"), seq_len=4 * TINY.attn_window, n_layers=1,
                           name="tiny-long")


@pytest.mark.parametrize("seq, block, ring", [(64, 16, 16), (40, 16, 16), (40, 20, 8),
                                              (7, 3, 2), (16, 16, 16)])
@pytest.mark.parametrize("causal", [True, False])
def test_chunk_order_covers_every_visible_key_once(seq, block, ring, causal):
    """Every row is in one run of at most ``ring`` queries; a run's chunks are disjoint, at
    most ``ring`` keys, start with the run's own block and cover exactly its visible keys'
    chunks (causal: up to its own rows)."""
    order = chunk_order(seq, block, causal=causal, ring=ring)
    rows = np.zeros(seq, int)
    for q0, q1, chunks in order:
        rows[q0:q1] += 1
        keys = np.zeros(seq, int)
        for k0, k1 in chunks:
            assert 0 < k1 - k0 <= ring, f"run {q0}: chunk {k0}..{k1} of more than {ring} keys"
            keys[k0:k1] += 1
        assert q1 - q0 <= ring, f"run {q0}..{q1}: more than {ring} queries"
        assert chunks[0][0] == q0 // block * block, \
            f"run {q0}: the first chunk is not the run's own block's"
        want = np.zeros(seq, int)
        want[:q1 if causal else seq] = 1
        assert (keys == want).all(), f"run {q0}..{q1}: keys covered {keys.tolist()}"
    assert (rows == 1).all(), f"rows covered {rows.tolist()}"


def test_chunk_order_is_the_rings_arrival_order():
    """Block b merges its own keys, then b - 1, ... (what chip b receives from its ring
    predecessor each step), then, bidirectional, wraps round."""
    order = chunk_order(64, 16, causal=False, ring=16)
    assert order[1][2] == [(16, 32), (0, 16), (48, 64), (32, 48)]
    assert chunk_order(64, 16, causal=True, ring=16)[2][2] == [(32, 48), (16, 32), (0, 16)]


def test_plan_schedule_passes_only_for_full_attention():
    assert plan_schedule(seq=64, window=0, causal=True, ring=16, passes=True).chunk == 16
    assert plan_schedule(seq=64, window=64, causal=False, ring=16, passes=True).chunk == 16
    assert plan_schedule(seq=16, window=0, causal=True, ring=16, passes=True).chunk == 0
    # A causal window that fits the ring stays interleaved.
    assert plan_schedule(seq=64, window=8, causal=True, ring=16, passes=True).interleaved
    with pytest.raises(ValueError, match="in passes over key chunks"):
        plan_schedule(seq=64, window=20, causal=True, ring=16, passes=True)
    with pytest.raises(ValueError, match="ring of 16 keys"):
        plan_schedule(seq=64, window=0, causal=True, ring=16)


def test_chunk_bidirectional():
    """A causal chunk in the queries' past runs bidirectional (the causal ring would hide keys
    ``ring`` or more back); one reaching their positions runs causal if within the ring."""
    assert chunk_bidirectional(16, 32, 0, 16, causal=True, ring=16)
    assert not chunk_bidirectional(16, 32, 16, 32, causal=True, ring=16)
    assert chunk_bidirectional(16, 32, 16, 32, causal=False, ring=16)
    with pytest.raises(ValueError, match="at most 15 positions back"):
        chunk_bidirectional(0, 20, 0, 16, causal=True, ring=16)


@pytest.mark.parametrize("causal", [True, False])
def test_one_chip_passes_on_the_iss(causal):
    """seq = 4 x attn_window on one tiny chip, causal and bidirectional: bit-exact with the
    golden's exact merge (the order the program records), close to float64, and not what one
    softmax over each row gives (the passes did run)."""
    cfg = dataclasses.replace(LONG, causal=causal)
    r = simulate(TINY, cfg, strategy="single", backend="iss", seed=3)
    assert r.golden_match, f"first mismatch {r.first_mismatch}"
    assert r.cosine > 0.999, f"cosine vs float64 {r.cosine}"
    order = long_order(TINY, cfg, cfg.seq_len)
    assert order == chunk_order(64, 16, causal=causal, ring=16)


@pytest.mark.slow
def test_one_chip_passes_llama_and_batch_on_the_iss():
    """The Llama-shaped model (RoPE, grouped-query attention) over 64 tokens, and two samples
    of 40 (each sequence's rows at its own base; a short last block): bit-exact."""
    cfg = dataclasses.replace(model_preset("tiny-llama"), seq_len=64, n_layers=1,
                              name="tiny-llama-long")
    r = simulate(TINY, cfg, strategy="single", backend="iss", seed=4)
    assert r.golden_match, f"first mismatch {r.first_mismatch}"
    cfg = dataclasses.replace(LONG, seq_len=40)
    r = simulate(TINY, cfg, strategy="single", backend="iss", seed=5, batch=2)
    assert r.golden_match, f"first mismatch {r.first_mismatch}"


def test_a_window_beyond_the_ring_is_still_refused():
    """Passes carry full attention only: a causal window wider than the ring is refused with
    the limit named."""
    cfg = dataclasses.replace(LONG, window=20)
    with pytest.raises(ConfigError, match="attn_window=16"):
        simulate(TINY, cfg, strategy="single", backend="iss")


def test_passes_need_whole_int32_lanes():
    """State rows are int32 lanes in whole words: an array of 6 lanes is refused, naming
    array_size."""
    from sim.compiler.compat import check_single_chip
    npu = dataclasses.replace(TINY, array_size=6, vector_lanes=6, sram_bytes=24 * 2048)
    with pytest.raises(ConfigError, match="array_size=6 is not a multiple of 4: full attention "
                                          "over 64 tokens"):
        check_single_chip(npu, LONG, passes=True)
    check_single_chip(npu, dataclasses.replace(LONG, seq_len=16), passes=True)
