"""sim.compiler.quantize: the smooth16 scheme's parameters, and that its integers do not depend
on how the work is split.

Every built strategy on 1..4 chips runs a model with outlier channels and massive activations
(``tests.helpers.outlier_model``, seeds printed) on the ISS and must equal the single-chip
golden model bit for bit; the RTL runs each new operation path once on a one-layer model:
per-lane REQUANTs of the int16 LayerNorm outputs, GELU16 writing its two planes over the int16
hidden, the two FFN2 passes (one chip), and (head parallelism on 4 chips; on 2 in the slow
suite) each pass's partial sums reduced and requantised on their own: on the Verilator builds
the other Verilator tests share (the units' smooth16 operations are held to Amaranth's simulator
in tests/hw/tile), and on Amaranth's simulator in the slow suite.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hw.spec import ConfigError, ModelConfig, npu_preset
from hw.spec.formats import OutMode
from sim.compiler.quantize import (
    LANE_RATIO_MAX,
    RELU16_G,
    _two_pass_params,
    quantize_model,
    smoothing_factors,
)
from sim.flows.simulate import simulate
from sim.golden.matmul import LINEAR16_SHIFT_MIN
from sim.golden.vector import gelu16_knot_shift, relu16_table
from tests.helpers import check_report, outlier_model

TINY = npu_preset("tiny")
#: Four layers, four heads, d_ff 32: every strategy on up to 4 chips (uneven FFN splits on 3).
SMALL = ModelConfig(n_layers=4, d_model=16, n_heads=4, d_head=4, d_ff=32, seq_len=4,
                    name="small4", quant="smooth16")
POST = dataclasses.replace(SMALL, norm="post", causal=False, name="small4-post")
PRE_RELU = dataclasses.replace(SMALL, activation="relu", name="small4-pre-relu")


def test_smoothing_factors():
    xmax, wmax = np.array([1.0, 4.0, 16.0]), np.array([2.0, 1.0, 0.5])
    t = smoothing_factors(xmax, wmax, 0.5)
    raw = np.sqrt(xmax) / np.sqrt(wmax)
    assert np.allclose(t, raw / np.exp(np.log(raw).mean()))
    assert abs(np.log(t).mean()) < 1e-12                        # geometric mean 1
    # alpha 1 moves everything into the weights: x / t is constant across channels.
    flat = xmax / smoothing_factors(xmax, wmax, 1.0)
    assert np.allclose(flat, flat[0])


@pytest.mark.parametrize("norm, quant", [("pre", "int8"), ("post", "int8"),
                                         ("pre", "smooth16")])
def test_rmsnorm_parameters(norm, quant):
    """RMSNorm is calibrated as LayerNorm is (gamma, gshift and the int8 requantisation from
    the norms' float outputs), with beta = 0; its weights have no ln*.bias to read."""
    from sim.golden.float_model import random_weights
    cfg = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_ff=32, seq_len=4, norm=norm,
                      quant=quant, norm_kind="rmsnorm", name="rms")
    w = random_weights(cfg, 3)
    assert "layers.0.ln1.bias" not in w
    x = np.random.default_rng(3).standard_normal((cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, w, x)
    for layer in qm.layers:
        for ln in (layer.ln1, layer.ln2):
            assert not ln.beta.any() and ln.gamma.any() and 0 <= ln.gshift <= 63


def test_two_pass_params():
    ratio = np.array([1e-3, 100.0])
    mult, shift = np.array([32768, 51200]), np.array([25, 6])
    m, s = _two_pass_params(ratio, mult, shift)
    assert list(s) == [25, LINEAR16_SHIFT_MIN] and list(m) == [32768, 51200]
    with pytest.raises(ValueError, match=r"ratio 200 is too large for two int8 passes"):
        _two_pass_params(np.array([200.0]), np.array([51200]), np.array([6]))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_smooth16_parameters(norm):
    cfg = dataclasses.replace(POST if norm == "post" else SMALL, n_layers=2)
    w, x = outlier_model(cfg, 11)
    x[:, 5] = 0.0                               # a dead input channel: t_5 is clamped
    int8 = quantize_model(dataclasses.replace(cfg, quant="int8"), w, x)
    qm = quantize_model(cfg, w, x)
    assert (int8.quant, qm.quant) == ("int8", "smooth16")
    for i, (a, b) in enumerate(zip(int8.layers, qm.layers, strict=True)):
        assert a.lut is not None and not a.ffn16 and a.qkv_req is None
        assert b.lut is None and b.ffn16 and b.lut16.shape == (257,)
        assert b.ffn1.mode is OutMode.INT16
        assert b.ffn2.shift.min() >= LINEAR16_SHIFT_MIN, f"layer {i}"
        s_p = qm.scales[f"layers.{i}.ffn_pre16"]
        assert b.gelu_g == gelu16_knot_shift(s_p)
        assert set(b.smooth) == {"qkv", "ffn1"}
        if norm == "post":
            for what, req in (("qkv", b.qkv_req), ("ffn1", b.ffn_req)):
                mult, shift = req
                ratio = mult / 2.0 ** shift
                assert ratio.max() <= LANE_RATIO_MAX * 1.001, f"layer {i} {what}"
        else:
            assert b.qkv_req is None and b.ffn_req is None
            # 1/t folded into gamma: the int16 gamma ratio follows 1/t.
            ga = a.ln1.gamma * 2.0 ** -a.ln1.gshift
            gb = b.ln1.gamma * 2.0 ** -b.ln1.gshift
            big = np.abs(ga) > 1000 * 2.0 ** -a.ln1.gshift
            rel = (gb[big] / ga[big]) * b.smooth["qkv"][big]
            assert np.allclose(rel, rel[0], rtol=2e-3), f"layer {i}"


def test_relu_under_smooth16():
    cfg = dataclasses.replace(PRE_RELU, n_layers=1)
    w, x = outlier_model(cfg, 12)
    layer = quantize_model(cfg, w, x).layers[0]
    assert layer.gelu_g == RELU16_G and np.array_equal(layer.lut16, relu16_table(RELU16_G))


#: (strategy, chips, grid) for every built strategy on 1..4 chips.
MATRIX = [("single", 1, None)]
MATRIX += [(s, c, None) for s in ("head", "pipeline", "data") for c in range(1, 5)]
#: A grid with a side of 1 is the plain strategy on the other side: make test keeps 1x2, 2x1
#: and 2x2; 1x1, 1x3, 3x1, 1x4 and 4x1 (the plain strategies on 1, 3 and 4 chips above) are
#: slow.
GRIDS = [(s, a * b, f"{a}x{b}") for s in ("head+pipeline", "data+head", "data+pipeline")
         for a, b in ((1, 2), (2, 1), (2, 2))]
SLOW_GRIDS = [(s, a * b, f"{a}x{b}") for s in ("head+pipeline", "data+head", "data+pipeline")
              for a, b in ((1, 1), (1, 3), (3, 1), (1, 4), (4, 1))]


def _every_strategy():
    """Each (strategy, chips, grid) of make test on one of the two models in turn (the other
    model in the slow suite), and on both when it splits heads over 2x2: both models pass
    every point in the slow suite."""
    out = []
    for k, point in enumerate(MATRIX + GRIDS + SLOW_GRIDS):
        for j, cfg in enumerate((POST, PRE_RELU)):
            default = (point not in SLOW_GRIDS
                       and (j == k % 2 or point[2] == "2x2" and "head" in point[0]))
            out.append(pytest.param(cfg, *point, id=f"{point[0]}-{point[1]}-{point[2]}-"
                                    f"{cfg.name}", marks=() if default else pytest.mark.slow))
    return out


@pytest.mark.parametrize("cfg, strategy, chips, grid", _every_strategy())
def test_every_strategy_on_the_iss(cfg, strategy, chips, grid):
    """Batch 4 (data replicas and microbatches have samples), calibrated on the whole batch."""
    seed = 20 + chips
    w, x = outlier_model(cfg, seed)
    rng = np.random.default_rng(seed)
    batch = np.stack([x] + [x * rng.uniform(0.7, 1.3, x.shape[1]) for _ in range(3)])
    r = simulate(TINY, cfg, strategy=strategy, chips=chips, backend="iss", weights=w, x=batch,
                 grid=grid)
    check_report(r, f"{cfg.name} {strategy} on {chips} chips {grid or ''}")
    if "head" in strategy and r.grid["shards"] > 1:
        # Each layer: O, then FFN2's hi and lo passes, reduced on their own (all-reduced, or
        # reduce-scattered when the group splits the rows).
        per_layer = [c["what"] for c in r.collectives
                     if c["kind"] in ("all_reduce", "reduce_scatter") and c["layer"] == 0]
        assert per_layer and per_layer == ["attention output", "FFN output (hi pass)",
                                           "FFN output (lo pass)"] * (len(per_layer) // 3)


@pytest.mark.parametrize("strategy, chips, backend", [
    pytest.param("single", 1, "verilator", marks=pytest.mark.verilator),
    pytest.param("head", 4, "verilator", marks=pytest.mark.verilator),
    pytest.param("single", 1, "pysim", marks=pytest.mark.slow),
    pytest.param("head", 2, "pysim", marks=pytest.mark.slow)])
def test_rtl_equals_the_iss(strategy, chips, backend, request):
    if backend == "verilator":
        request.getfixturevalue("verilator_ok")
    cfg = dataclasses.replace(POST, n_layers=1)
    w, x = outlier_model(cfg, 30)
    iss = simulate(TINY, cfg, strategy=strategy, chips=chips, backend="iss", weights=w, x=x)
    rtl = simulate(TINY, cfg, strategy=strategy, chips=chips, backend=backend, weights=w, x=x)
    what = f"{strategy} on {chips} chips ({backend})"
    check_report(rtl, what)
    assert np.array_equal(rtl.output, iss.output)
    # The ISS's cycle model: LOAD_LUT16 beside the FFN1 matmul takes a knot word whenever
    # the shared read port grants one, and ends with the unit (no output pipeline).
    assert rtl.cycles == iss.cycles, (what, rtl.cycles, iss.cycles)
    for c, (a, b) in enumerate(zip(rtl.per_chip, iss.per_chip, strict=True)):
        assert a.busy == b.busy, (what, c, a.busy, b.busy)
    print(f"{strategy} on {chips} chips: {rtl.cycles} cycles")


def test_capacity_refusal_names_the_int16_hidden():
    """A model that fits with the int8 hidden but not with the int16 one is refused with the
    scratchpad's size, every category and the int16 hidden's share."""
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=4, d_ff=64, seq_len=64, window=8, name="long",
                      quant="smooth16")
    # Five banks of 1,024 words (a bank's depth is a power of two).
    npu = dataclasses.replace(TINY, sram_bytes=20480, sram_banks=5)
    w, x = outlier_model(cfg, 31)
    r = simulate(npu, dataclasses.replace(cfg, quant="int8"), backend="iss", weights=w, x=x)
    assert r.golden_match
    with pytest.raises(ConfigError, match=r"^sram_bytes=20480 is too small: the model needs "
                       r"[\d,]+ bytes of scratchpad \(weights [\d,]+, kv_cache [\d,]+, "
                       r"activations [\d,]+\); the int16 FFN hidden of quant=\"smooth16\" "
                       r"takes 8,256 bytes of the activations \(64 rows of 64 int16 and half "
                       r"a row\)"):
        simulate(npu, cfg, backend="iss", weights=w, x=x)


def test_gated_ffn_parameters():
    """A gated FFN: the gate is quantised like FFN1 (int8 per column, FFN1's shape), the LUT
    is SiLU from the gate's scale to the activated gate's, and MUL's per-tensor (mult, shift)
    is s_a * s_u / s_m; the MLP's layers have none of it."""
    from sim.golden.float_model import random_weights
    from sim.golden.vector import silu_table
    cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, seq_len=4,
                      activation="silu", ffn="gated", norm_kind="rmsnorm", bias=False,
                      name="llama")
    w = random_weights(cfg, 3)
    x = np.random.default_rng(3).standard_normal((cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, w, x)
    L, s = qm.layers[0], qm.scales
    assert L.gate.w.shape == L.ffn1.w.shape == (16, 32) and not L.gate.bias.any()
    assert np.array_equal(L.lut, silu_table(s["layers.0.ffn_gate"], s["layers.0.ffn_gact"]))
    ratio = s["layers.0.ffn_gact"] * s["layers.0.ffn_pre"] / s["layers.0.ffn_act"]
    assert abs(L.mul_mult / 2.0 ** L.mul_shift / ratio - 1) < 2.0 ** -15
    mlp = quantize_model(dataclasses.replace(cfg, ffn="mlp"),
                         {k: v for k, v in w.items() if ".wg" not in k}, x)
    assert mlp.layers[0].gate is None
