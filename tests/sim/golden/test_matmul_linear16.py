"""The two-pass int16 x int8 product (sim.golden.matmul.linear16): its definition, its distance
to one exact requantisation, its split-K invariance and its rejections."""

from __future__ import annotations

import numpy as np
import pytest

from hw.spec.formats import quantize_multiplier
from sim.golden.matmul import (
    LINEAR16_SHIFT_MIN,
    bias_add,
    linear16,
    linear16_passes,
    matmul,
    requant,
    wrap,
)

I16 = (-(1 << 15), 1 << 15)


def _case(rng, m=6, k=40, n=5):
    a16 = rng.integers(*I16, (m, k))
    w = rng.integers(-128, 128, (k, n))
    bias = rng.integers(-(1 << 20), 1 << 20, n)
    mult = rng.integers(1 << 15, 1 << 16, n)
    shift = rng.integers(LINEAR16_SHIFT_MIN + 12, 32, n)
    return a16, w, bias, mult, shift


def test_passes_are_the_documented_formula(rng):
    a16, w, bias, mult, shift = _case(rng)
    hi, lo = a16 >> 8, a16 & 0xFF
    f_hi, f_lo = linear16_passes(a16, w, bias, mult, shift)
    assert np.array_equal(f_hi, requant(matmul(hi, w), mult, shift - 8, 16))
    assert np.array_equal(f_lo, requant(bias_add(matmul(lo, w, a_unsigned=True), bias), mult,
                                        shift, 16))
    res = rng.integers(*I16, f_hi.shape)
    want = np.clip(np.clip(res + f_hi, *(-(1 << 15), (1 << 15) - 1)) + f_lo, -(1 << 15),
                   (1 << 15) - 1)
    assert np.array_equal(linear16(a16, w, bias, mult, shift, res), want)


def test_within_one_lsb_of_the_exact_product(rng):
    """Before saturation the two rounded passes differ from requantising the exact
    256 * (hi @ W) + lo @ W + bias = a16 @ W + bias (42 bits) by at most one LSB."""
    worst = 0
    for _ in range(20):
        a16, w, bias, mult, shift = _case(rng)
        f_hi, f_lo = linear16_passes(a16, w, bias, mult, shift)
        exact = a16 @ w + bias                       # int64, exact
        want = (exact * mult + (np.int64(1) << (shift - 1))) >> shift
        inside = np.abs(want) < (1 << 14)
        worst = max(worst, int(np.abs((f_hi + f_lo) - want)[inside].max(initial=0)))
    print(f"max |two passes - exact| = {worst} LSB")
    assert worst <= 1


def test_tracks_the_float_product(rng):
    """Dequantised, the result follows the product of the dequantised operands."""
    m, k, n = 8, 64, 6
    a = rng.standard_normal((m, k))
    wf = rng.standard_normal((k, n)) / np.sqrt(k)
    s_a = np.abs(a).max() / 32767
    s_w = np.abs(wf).max(axis=0) / 127
    a16 = np.round(a / s_a).astype(np.int64)
    w = np.round(wf / s_w).astype(np.int64)
    s_out = np.abs(a @ wf).max() / 16000
    mult, shift = zip(*(quantize_multiplier(s_a * sw / s_out) for sw in s_w), strict=True)
    y = linear16(a16, w, np.zeros(n, np.int64), np.array(mult), np.array(shift),
                 np.zeros((m, n), np.int64)) * s_out
    ref = (a16 * s_a) @ (w * s_w)
    # Two roundings (1 LSB) plus the multipliers' relative error 2**-16 of |y| <= 2**14.
    err = np.abs(y - ref).max() / s_out
    print(f"max error {err:.2f} LSB")
    assert err <= 1.25


def test_split_k_partials_give_the_same_passes(rng):
    """Each pass's int32 partial sums over a K split, summed with wrap, are the unsplit ones:
    so the result does not depend on how chips share K."""
    a16, w, bias, mult, shift = _case(rng, k=48)
    hi, lo = a16 >> 8, a16 & 0xFF
    cut = 20
    acc_hi = wrap(matmul(hi[:, :cut], w[:cut]) + matmul(hi[:, cut:], w[cut:]))
    acc_lo = wrap(matmul(lo[:, :cut], w[:cut], a_unsigned=True)
                  + matmul(lo[:, cut:], w[cut:], a_unsigned=True))
    f_hi, f_lo = linear16_passes(a16, w, bias, mult, shift)
    assert np.array_equal(requant(acc_hi, mult, shift - 8, 16), f_hi)
    assert np.array_equal(requant(bias_add(acc_lo, bias), mult, shift, 16), f_lo)


def test_rejects():
    a16 = np.zeros((2, 4), np.int64)
    w = np.zeros((4, 3), np.int64)
    with pytest.raises(ValueError, match=r"shift 8 is below 9: the hi pass requantises with "
                                         r"shift - 8 >= 1"):
        linear16_passes(a16, w, 0, 1, np.array([8, 9, 9]))
    with pytest.raises(ValueError, match=r"a16 has values outside \[-32768, 32767\]"):
        linear16_passes(a16 + 40000, w, 0, 1, 9)
    with pytest.raises(ValueError, match=r"residual has values outside"):
        linear16(a16, w, 0, 1, 9, np.full((2, 3), 1 << 15))
