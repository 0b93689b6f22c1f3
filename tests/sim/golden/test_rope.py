"""RoPE and grouped-query attention in the golden models (sim.golden.float_model,
sim.golden.rope, sim.golden.layer): the float64 rotation against an independent complex form,
the integer composition against the float one, the rotated projections, and GQA against
multi-head attention with each K/V head repeated."""

import dataclasses

import numpy as np
import pytest

from hw.spec import model_preset
from sim.compiler.quantize import quantize_input, quantize_model
from sim.golden.float_model import apply_rope, model_forward, random_weights, rope_angles
from sim.golden.layer import model_int, qkv_int
from sim.golden.matmul import requant
from sim.golden.rope import ROPE_ONE, rope_int, rope_tables, rotation

LLAMA = model_preset("tiny-llama")


def _complex_rope(x, positions, theta):
    """HF's half layout as complex numbers: lane i and i + d/2 are the real and imaginary
    parts, rotated by e^(i p w_i)."""
    half = x.shape[1] // 2
    z = x[:, :half] + 1j * x[:, half:]
    w = theta ** (-np.arange(half) * 2.0 / x.shape[1])
    z = z * np.exp(1j * np.asarray(positions)[:, None] * w[None, :])
    return np.concatenate([z.real, z.imag], axis=1)


def test_float_rope_is_the_complex_rotation_and_relative():
    rng = np.random.default_rng(11)
    print("seed=11")
    cfg = dataclasses.replace(LLAMA, d_model=16, n_heads=1, n_kv_heads=1, d_head=16)
    x = rng.standard_normal((6, 16))
    got = apply_rope(cfg, x, pos_base=3)
    assert np.allclose(got, _complex_rope(x, 3 + np.arange(6), cfg.rope_theta), atol=1e-12)
    # q(p).k(p + d) depends on d only.
    q, k = rng.standard_normal((1, 16)), rng.standard_normal((1, 16))
    dots = [(apply_rope(cfg, q, p) @ apply_rope(cfg, k, p + 5).T).item() for p in (0, 7, 40)]
    assert np.allclose(dots, dots[0], rtol=1e-12), dots
    cos, sin = rope_angles(16, 10000.0, [0])
    assert np.array_equal(cos, np.ones((1, 16))) and np.array_equal(sin, np.zeros((1, 16)))


def test_rotation_is_rotate_half_of_the_columns():
    rng = np.random.default_rng(12)
    print("seed=12")
    x = rng.integers(-100, 100, (3, 24))
    src, sign = rotation(8, 3)
    from sim.golden.float_model import rotate_half
    want = np.concatenate([rotate_half(x[:, h * 8:(h + 1) * 8]) for h in range(3)], axis=1)
    assert np.array_equal(x[:, src] * sign, want)


def test_tables_and_integer_rope_bound():
    """The int8 tables are round(127 cos), round(127 sin); the int16 sum cannot clamp; the
    integer RoPE of int8 rows is the float rotation within its rounding (table error 0.5/127
    on each of two products, then the output's half LSB)."""
    c, s = rope_tables(8, 10000.0, np.arange(64))
    cos, sin = rope_angles(8, 10000.0, np.arange(64))
    assert np.array_equal(c, np.floor(cos * 127 + 0.5)) and np.abs(c).max() <= 127
    assert np.array_equal(s, np.floor(sin * 127 + 0.5)) and np.abs(s).max() <= 127
    rng = np.random.default_rng(13)
    print("seed=13")
    x = rng.integers(-90, 91, (64, 16))     # |rotated| <= sqrt(2) * 90 < 128: no saturation
    src, sign = rotation(8, 2)
    xr = x[:, src] * sign
    # The extreme operands (int8 -128 against the tables' largest entries): the int16 ADD of
    # the two exact products does not clamp.
    ext = np.full((1, 8), -128)
    big = np.full((1, 8), max(np.abs(c).max(), np.abs(s).max()))
    exact = rope_int(ext, ext, big, big, 1 << 15, 15 + 7)       # ratio 1/128: unsaturated
    assert exact[0, 0] == requant(np.array([2 * -128 * int(big[0, 0])]), 1 << 15, 22, 8)[0]
    # out = requant(sum, mult, shift) at the same scale: ratio 1/127.
    from hw.spec.formats import quantize_multiplier
    mult, shift = quantize_multiplier(1 / ROPE_ONE)
    got = rope_int(x, xr, c, s, mult, shift)
    fl = np.concatenate([x[:, h * 8:(h + 1) * 8] * cos + xr[:, h * 8:(h + 1) * 8] * sin
                         for h in range(2)], axis=1)
    err = np.abs(got - fl).max()
    bound = 2 * 128 * 0.5 / 127 + 0.5 + 1e-3
    print(f"max |int - float| = {err:.3f} LSB (bound {bound:.3f})")
    assert err <= bound
    assert np.array_equal(got, requant(x * np.tile(c, 2) + xr * np.tile(s, 2), mult, shift, 8))


def test_rotated_projections_are_permuted_integers():
    w = random_weights(LLAMA, 5)
    x = np.random.default_rng(5).standard_normal((8, 32))
    print("seed=5")
    qm = quantize_model(LLAMA, w, x)
    L = qm.layers[0]
    for ql, qr, heads in ((L.q, L.rope.qr, 4), (L.k, L.rope.kr, 2)):
        src, sign = rotation(8, heads)
        assert np.array_equal(qr.w, ql.w[:, src] * sign)
        assert np.array_equal(qr.mult, ql.mult[src]) and np.array_equal(qr.shift, ql.shift[src])
        assert np.abs(ql.w).max() <= 127


@pytest.mark.parametrize("rope", [False, True])
def test_gqa_equals_mha_with_repeated_kv_heads(rope):
    """Grouped-query attention on 2 K/V heads equals multi-head attention whose K/V heads are
    each repeated for their 2 query heads: in float64, and in integers when the quantiser sees
    the same (repeated) tensors."""
    cfg = LLAMA if rope else dataclasses.replace(LLAMA, rope_theta=0.0)
    mha = dataclasses.replace(cfg, n_kv_heads=4)
    w = random_weights(cfg, 7)
    print("seed=7")
    rep = dict(w)
    for i in range(cfg.n_layers):
        for m in ("wk", "wv"):
            a = w[f"layers.{i}.attn.{m}"]
            rep[f"layers.{i}.attn.{m}"] = np.repeat(a.reshape(32, 2, 8), 2, axis=1).reshape(32, 32)
    x = np.random.default_rng(8).standard_normal((8, 32))
    assert np.allclose(model_forward(cfg, w, x), model_forward(mha, rep, x), atol=1e-12)
    qg, qh = quantize_model(cfg, w, x), quantize_model(mha, rep, x)
    xi = quantize_input(qg, x)
    assert np.array_equal(model_int(qg, xi), model_int(qh, xi))


def test_integer_rope_layer_is_near_float():
    """The rotated Q and K of layer 0 against the float64 ones: cosine above 0.999."""
    w = random_weights(LLAMA, 9)
    x = np.random.default_rng(9).standard_normal((8, 32))
    print("seed=9")
    qm = quantize_model(LLAMA, w, x)
    rec = {}
    model_forward(LLAMA, w, x, rec)
    from sim.golden.layer import layernorm_rows
    _, h = layernorm_rows(quantize_input(qm, x), qm.layers[0].ln1, rms=True)
    q, k, _ = qkv_int(LLAMA, qm.layers[0], h)
    for got, name in ((q, "q_rope"), (k, "k_rope")):
        ref = rec["layers.0." + name]
        cos = float((got * ref).sum() / np.linalg.norm(got) / np.linalg.norm(ref))
        print(name, f"cosine {cos:.5f}")
        assert cos > 0.999, (name, cos)
