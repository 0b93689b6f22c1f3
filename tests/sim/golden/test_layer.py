"""Quantised blocks through the integer model (sim.golden.layer) against the float64 reference.

Distributions: weights N(0, 1/fan_in) (``random_weights``), LayerNorm gamma 1 + N(0, 0.1^2),
beta and biases N(0, 0.05^2); inputs N(0, 1) per element. The BERT-style case adds outlier
channels: 4 of 64 channels scaled by 3, 4, 4.5 and 5, as real encoders show.
"""

import dataclasses

import numpy as np
import pytest

from hw.spec import ModelConfig, model_preset
from sim.compiler.quantize import dequantize_residual, quantize_input, quantize_model
from sim.golden.float_model import model_forward, random_weights
from sim.golden.layer import model_int


def cosine(a, b):
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def quantised_vs_float(cfg, seed, x):
    w = random_weights(cfg, seed)
    qm = quantize_model(cfg, w, x)
    got = dequantize_residual(qm, model_int(qm, quantize_input(qm, x)))
    return got, model_forward(cfg, w, x)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tiny_model_cosine(seed):
    print(f"seed={seed}")
    cfg = model_preset("tiny")
    x = np.random.default_rng(100 + seed).standard_normal((cfg.seq_len, cfg.d_model))
    got, ref = quantised_vs_float(cfg, seed, x)
    assert cosine(got, ref) >= 0.99, cosine(got, ref)


def test_bert_style_post_norm_with_outlier_channels():
    cfg = ModelConfig(n_layers=1, d_model=64, n_heads=4, d_ff=256, seq_len=16, causal=False,
                      norm="post", name="bert-style")
    rng = np.random.default_rng(7)
    print("seed=7")
    x = rng.standard_normal((cfg.seq_len, cfg.d_model))
    x[:, [3, 17, 40, 59]] *= [3.0, 4.0, 4.5, 5.0]
    got, ref = quantised_vs_float(cfg, 7, x)
    assert cosine(got, ref) >= 0.98, cosine(got, ref)


@pytest.mark.parametrize("norm, causal, window, activation", [
    ("pre", True, 4, "relu"), ("post", False, 0, "gelu"), ("pre", True, 0, "gelu")])
def test_variants_cosine(norm, causal, window, activation):
    cfg = dataclasses.replace(model_preset("tiny"), norm=norm, causal=causal, window=window,
                              activation=activation, n_layers=2)
    x = np.random.default_rng(5).standard_normal((cfg.seq_len, cfg.d_model))
    got, ref = quantised_vs_float(cfg, 5, x)
    assert cosine(got, ref) >= 0.99, cosine(got, ref)
