"""Greedy decode with a KV cache (sim.golden.decode): the incremental integer model against a
prefill of the whole sequence, bit for bit, and against the float64 reference.

Weights: ``random_weights`` and ``random_head_weights`` (seeded); prompts: seeded uniform ids.
"""

import dataclasses

import numpy as np
import pytest

from hw.spec import model_preset
from sim.compiler.decode_quant import quantize_decode
from sim.golden.decode import (
    KVCache,
    argmax_int,
    block_step,
    embed_float,
    embed_int,
    generate_float,
    generate_int,
    logits_float,
    prefill_logits,
    random_head_weights,
)
from sim.golden.float_model import model_forward, random_weights
from sim.golden.matmul import requant

MODELS = ["tiny", "tiny-llama"]


def setup(name, seed, prompt_len):
    cfg = model_preset(name)
    w, hw = random_weights(cfg, seed), random_head_weights(cfg, seed + 100)
    prompt = np.random.default_rng(seed + 200).integers(0, cfg.vocab_size, prompt_len)
    qm, head = quantize_decode(cfg, w, hw, prompt)
    return cfg, w, hw, prompt, qm, head


def first_difference(a, b):
    bad = np.argwhere(a != b)
    return None if bad.size == 0 else (tuple(int(i) for i in bad[0]),
                                       int(a[tuple(bad[0])]), int(b[tuple(bad[0])]))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("seed,prompt_len,n", [(1, 3, 6), (7, 1, 8), (11, 5, 2)])
def test_incremental_equals_prefill(name, seed, prompt_len, n):
    cfg, _, _, prompt, qm, head = setup(name, seed, prompt_len)
    g = generate_int(qm, head, prompt, n)
    seq = np.concatenate([prompt, g["ids"][:-1]])
    full = prefill_logits(qm, head, seq)
    # Every step's logits are the full prefill's at that position (step t: row P - 1 + t).
    diff = first_difference(g["logits"], full[prompt_len - 1:])
    assert diff is None, f"(step, vocab index), decode, prefill: {diff}"
    diff = first_difference(g["prefill"], full[:prompt_len])
    assert diff is None, f"(position, vocab index), decode prefill, whole prefill: {diff}"
    for t, row in enumerate(g["logits"]):
        assert g["ids"][t] == argmax_int(row)[0], f"step {t}"
    assert g["cache"].length == prompt_len + n - 1
    assert g["cache"].bytes() == cfg.n_layers * 2 * cfg.d_kv * (prompt_len + n - 1)


@pytest.mark.parametrize("name", MODELS)
def test_int_logits_track_float(name):
    """The dequantised int16 logits of a sequence against the float logits of the same one."""
    cfg, w, hw, prompt, qm, head = setup(name, 3, 4)
    seq = np.concatenate([prompt, generate_int(qm, head, prompt, 4)["ids"][:-1]])
    got = prefill_logits(qm, head, seq) * head.s_logit
    want = logits_float(cfg, hw, model_forward(cfg, w, embed_float(cfg, hw, seq)))
    for pos, (a, b) in enumerate(zip(got, want, strict=True)):
        cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        assert cos > 0.97, f"position {pos}: cosine {cos:.4f}"


def test_float_generation_is_greedy():
    cfg, w, hw, prompt, _, _ = setup("tiny", 5, 3)
    f = generate_float(cfg, w, hw, prompt, 3)
    seq = list(prompt)
    for t in range(3):
        row = logits_float(cfg, hw, model_forward(cfg, w, embed_float(cfg, hw, seq)))[-1]
        assert np.allclose(row, f["logits"][t], rtol=1e-12, atol=1e-12), f"step {t}"
        assert f["ids"][t] == int(np.argmax(row)), f"step {t}"
        seq.append(f["ids"][t])


def test_argmax_lowest_index_wins_ties():
    assert argmax_int([3, 9, -2, 9, 9]) == (1, 9)
    assert argmax_int([-32768, -32768]) == (0, -32768)
    with pytest.raises(ValueError, match="empty"):
        argmax_int([])


def test_embedding_rows():
    cfg, _, _, _, _, head = setup("tiny", 2, 2)
    ids = [5, 0, cfg.vocab_size - 1]
    x = embed_int(cfg, head, ids, pos_base=2)
    tok = requant(head.emb8[ids], *head.emb_req, 16)
    pos = requant(head.pos8[2:5], *head.pos_req, 16)
    assert np.array_equal(x, np.clip(tok + pos, -32768, 32767))
    # Tied: the LM head's weights are the int8 table transposed.
    assert np.array_equal(head.lm.w, head.emb8.T)
    cfg, _, _, _, _, head = setup("tiny-llama", 2, 2)          # RoPE: no position table
    assert head.pos8 is None
    assert np.array_equal(embed_int(cfg, head, ids, 6), requant(head.emb8[ids], *head.emb_req, 16))
    assert not np.array_equal(head.lm.w, head.emb8.T)           # a separate LM head


def test_refusals():
    cfg, _, _, prompt, qm, head = setup("tiny", 1, 3)
    with pytest.raises(ValueError, match=r"token id 256 at index 1 is outside 0\.\.255"):
        generate_int(qm, head, [1, 256], 2)
    with pytest.raises(ValueError, match="must be >= 1, not 0"):
        generate_int(qm, head, prompt, 0)
    with pytest.raises(ValueError, match=r"context 9 exceeds the 8 learned positions"):
        generate_int(qm, head, prompt, 7)
    generate_int(qm, head, prompt, 6)                          # 3 + 5 = 8 positions fit
    cache = KVCache(cfg)
    with pytest.raises(ValueError, match="cache holds 0 positions, the rows start at 2"):
        block_step(qm, 0, np.zeros((1, cfg.d_model), np.int64), cache, 2)
    enc = dataclasses.replace(cfg, causal=False)
    with pytest.raises(ValueError, match="causal"):
        quantize_decode(enc, random_weights(enc, 1), random_head_weights(enc, 1), prompt)
