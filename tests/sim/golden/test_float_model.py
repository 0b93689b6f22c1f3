"""The float64 reference model (sim.golden.float_model): attention masks, RMSNorm."""

import dataclasses

import numpy as np

from hw.spec import model_preset
from sim.golden.float_model import (
    attention_mask,
    block_forward,
    layernorm,
    random_weights,
    rmsnorm,
    silu,
    weight_names,
)


def test_attention_masks():
    m = attention_mask(6, 3, True)
    assert m[5].tolist() == [False, False, False, True, True, True]
    assert m[0].tolist() == [True] + [False] * 5
    assert attention_mask(4, 0, False).all()
    assert attention_mask(5, 2, False)[2].tolist() == [False, True, True, True, False]


def test_rmsnorm_has_no_mean_no_beta_and_eps_zero():
    """x / sqrt(mean(x^2)) * gamma: a zero-mean row is LayerNorm's without beta; the mean is
    not removed; an all-zero row gives 0 (eps = 0, like LayerNorm's constant row)."""
    rng = np.random.default_rng(4)
    print("seed=4")
    x = rng.standard_normal((3, 16))
    gamma = 1 + 0.1 * rng.standard_normal(16)
    centred = x - x.mean(axis=1, keepdims=True)
    assert np.allclose(rmsnorm(centred, gamma), layernorm(centred, gamma, 0.0))
    y = rmsnorm(x + 5.0, gamma)
    assert np.allclose(y, (x + 5.0) / np.sqrt(((x + 5.0) ** 2).mean(1, keepdims=True)) * gamma)
    assert not np.allclose(y, layernorm(x + 5.0, gamma, 0.0))
    assert np.array_equal(rmsnorm(np.zeros((2, 16)), gamma), np.zeros((2, 16)))


def test_rmsnorm_model_reads_no_norm_bias():
    """norm_kind = "rmsnorm": the weights have no ln*.bias (none is generated or read), and
    each block's norms are RMSNorm."""
    base = dataclasses.replace(model_preset("tiny"), n_layers=1)
    cfg = dataclasses.replace(base, norm_kind="rmsnorm")
    names = set(weight_names(cfg, 0))
    assert set(weight_names(base, 0)) - names == {"layers.0.ln1.bias", "layers.0.ln2.bias"}
    w = random_weights(cfg, 1)
    assert not any(k.endswith("ln1.bias") or k.endswith("ln2.bias") for k in w)
    x = np.random.default_rng(2).standard_normal((cfg.seq_len, cfg.d_model))
    record = {}
    block_forward(cfg, w, 0, x, record)
    assert np.allclose(record["layers.0.ln1_out"], rmsnorm(x, w["layers.0.ln1.weight"]))
    assert np.allclose(record["layers.0.ln2_out"],
                       rmsnorm(record["layers.0.mid"], w["layers.0.ln2.weight"]))


def test_gated_ffn_is_silu_gate_times_up():
    """ffn = "gated": the weights gain the gate (ffn.wg, and ffn.bg with biases), and the FFN
    is (silu(h Wg + bg) * (h W1 + b1)) W2 + b2 with SiLU x / (1 + e^-x)."""
    base = dataclasses.replace(model_preset("tiny"), n_layers=1, activation="silu")
    cfg = dataclasses.replace(base, ffn="gated")
    assert set(weight_names(cfg, 0)) - set(weight_names(base, 0)) == {"layers.0.ffn.wg",
                                                                       "layers.0.ffn.bg"}
    nobias = dataclasses.replace(cfg, bias=False)
    assert "layers.0.ffn.wg" in weight_names(nobias, 0)
    assert "layers.0.ffn.bg" not in weight_names(nobias, 0)
    assert weight_names(cfg, 0)["layers.0.ffn.wg"] == (cfg.d_model, cfg.d_ff)
    w = random_weights(cfg, 5)
    x = np.random.default_rng(5).standard_normal((cfg.seq_len, cfg.d_model))
    record = {}
    block_forward(cfg, w, 0, x, record)
    h = record["layers.0.ln2_out"]
    p = "layers.0.ffn."
    gate, up = h @ w[p + "wg"] + w[p + "bg"], h @ w[p + "w1"] + w[p + "b1"]
    want = (gate / (1 + np.exp(-gate)) * up) @ w[p + "w2"] + w[p + "b2"]
    assert np.allclose(record["layers.0.ffn_out"], want)
    assert np.allclose(silu(np.array([0.0, 1.0])), [0.0, 1 / (1 + np.exp(-1.0))])
