"""Post-training quantisation of a float model into the chip's integer formats.

The formats are those of ``docs/formats.md``:

- Weights: symmetric int8 per output channel, ``s_w[c] = max|W[:, c]| / 127``.
- Activations: one scale per tensor, calibrated **once** from the float64 reference run on the
  whole input (or ``--calib`` data), so every strategy and chip count uses the same integers:
  int8 tensors ``s = max|x| / 127``; the int16 residual stream has one scale ``s_r`` for all
  layers, ``max|residual| / 32767``.
- Matmul outputs are requantised per column with ``(mult, shift) = quantize_multiplier(
  s_in * s_w[c] / s_out)``; biases become ``round(b / (s_in * s_w[c]))`` in int32.
- Attention: the score Q.K (int32, scale ``s_q * s_k``) becomes int16 Q8.8 logits with
  ``s_q * s_k * 256 / sqrt(d_head)``; the P.V sum (scale ``s_v / 256``) becomes int8 ``s_o``.
- LayerNorm (``sim.golden.vector``): int16 gamma with a shift, int16 beta, output int16 at
  ``s_y`` then int8 at ``s_h``. Post-norm keeps ``s_y = s_r`` (the output is the residual).
- GELU/ReLU: a 256-entry table from the int8 input scale to the int8 output scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hw.spec import ModelConfig
from hw.spec.formats import OutMode, quantize_multiplier

from ..golden.float_model import model_forward
from ..golden.vector import gelu_table, relu_table

__all__ = ["QLinear", "QLayerNorm", "QLayer", "QModel", "quantize_model", "quantize_input",
           "dequantize_residual"]

_I8, _I16, _I32 = 127, 32767, 2**31 - 1


def _absmax(x) -> float:
    m = float(np.max(np.abs(x))) if np.size(x) else 0.0
    return m if m > 0 else 1.0


def _round_half_up(x):
    return np.floor(np.asarray(x, np.float64) + 0.5).astype(np.int64)


def _mult_shift(scale) -> tuple[np.ndarray, np.ndarray]:
    pairs = [quantize_multiplier(float(s)) for s in np.atleast_1d(scale)]
    return (np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64))


@dataclass
class QLinear:
    """``out = requant(wrap32(x @ w + bias), mult, shift)`` per column (or raw)."""

    w: np.ndarray       # [K, N] int8
    bias: np.ndarray    # [N] int32
    mult: np.ndarray    # [N]
    shift: np.ndarray   # [N]
    mode: OutMode


@dataclass
class QLayerNorm:
    gamma: np.ndarray   # [d] int16
    beta: np.ndarray    # [d] int16
    gshift: int
    mult: int           # int16 output -> int8 matmul input
    shift: int


@dataclass
class QLayer:
    ln1: QLayerNorm
    q: QLinear
    k: QLinear
    v: QLinear
    o: QLinear
    ln2: QLayerNorm
    ffn1: QLinear
    ffn2: QLinear
    score_mult: int
    score_shift: int
    out_mult: int        # P.V int32 -> int8 attention output
    out_shift: int
    lut: np.ndarray      # [256] int8, the activation table


@dataclass
class QModel:
    cfg: ModelConfig
    layers: list[QLayer]
    s_res: float                 # residual stream scale (int16)
    scales: dict                 # every calibrated activation scale, by name
    in_mult: int = 1             # post-norm: residual int16 -> int8 input of layer 0
    in_shift: int = 1


def _linear(w, b, s_in, s_out, mode) -> QLinear:
    w = np.asarray(w, np.float64)
    s_w = np.maximum(np.max(np.abs(w), axis=0), 1e-30) / _I8
    wq = np.clip(_round_half_up(w / s_w), -128, 127)
    acc_scale = s_in * s_w
    bias = np.zeros(w.shape[1]) if b is None else np.asarray(b, np.float64)
    bq = np.clip(_round_half_up(bias / acc_scale), -_I32 - 1, _I32)
    mult, shift = _mult_shift(acc_scale / s_out)
    return QLinear(wq, bq, mult, shift, OutMode(mode))


def _layernorm(gamma, beta, s_y, s_h) -> QLayerNorm:
    gamma = np.asarray(gamma, np.float64)
    beta = np.asarray(beta, np.float64)
    # y16 = (z * 2**16 * gamma_int) >> gshift + beta_int, so gamma_int = g / s_y * 2**(gshift-16).
    gmax = max(float(np.max(np.abs(gamma))), 1e-30)
    gshift = 16 + math.floor(math.log2(_I16 * s_y / gmax))
    gshift = min(max(gshift, 0), 63)
    gq = np.clip(_round_half_up(gamma / s_y * 2.0 ** (gshift - 16)), -_I16 - 1, _I16)
    bq = np.clip(_round_half_up(beta / s_y), -_I16 - 1, _I16)
    mult, shift = quantize_multiplier(s_y / s_h)
    return QLayerNorm(gq, bq, gshift, mult, shift)


def quantize_model(cfg: ModelConfig, weights: dict, calib) -> QModel:
    """Quantise ``weights`` with activation scales calibrated on ``calib`` ([.., seq, d])."""
    record: dict = {}
    maxima: dict = {}
    calib = np.asarray(calib, np.float64)
    for sample in (calib if calib.ndim == 3 else calib[None]):
        model_forward(cfg, weights, sample, record)
        for key, value in record.items():
            maxima[key] = max(maxima.get(key, 0.0), _absmax(value))
    resid_keys = [k for k in maxima if k.rsplit(".", 1)[-1] in
                  ("in", "mid", "mid_pre", "out_pre", "out")]
    resid_keys += [k for k in maxima if k.endswith("attn_out") or k.endswith("ffn_out")]
    s_res = max(maxima[k] for k in resid_keys) / _I16
    scales = {"residual": s_res}
    layers = []
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        w = weights

        def s8(name, p=p):
            scales[p + name] = maxima[p + name] / _I8
            return scales[p + name]

        if cfg.norm == "pre":
            s_h1, s_h2 = s8("ln1_out"), s8("ln2_out")
            s_y1 = maxima[p + "ln1_out"] / _I16
            s_y2 = maxima[p + "ln2_out"] / _I16
            s_in_attn, s_in_ffn = s_h1, s_h2
        else:
            # Post-norm: attention and FFN read the int8 copy of the residual (the previous
            # LayerNorm's q8 output, or the quantised input for layer 0).
            scales[p + "in8"] = maxima[p + "in"] / _I8
            s_in_attn = scales[p + "in8"]
            s_h1 = scales[p + "mid8"] = maxima[p + "mid"] / _I8
            s_h2 = maxima[p + "out"] / _I8
            s_y1 = s_y2 = s_res
            s_in_ffn = s_h1
        s_q, s_k, s_v, s_o = s8("q"), s8("k"), s8("v"), s8("attn_o")
        s_f1, s_f2 = s8("ffn_pre"), s8("ffn_act")
        score_mult, score_shift = quantize_multiplier(s_q * s_k * 256 / math.sqrt(cfg.d_head))
        out_mult, out_shift = quantize_multiplier(s_v / 256 / s_o)
        act_table = gelu_table if cfg.activation == "gelu" else relu_table
        layers.append(QLayer(
            ln1=_layernorm(w[p + "ln1.weight"], w[p + "ln1.bias"], s_y1, s_h1),
            q=_linear(w[p + "attn.wq"], w.get(p + "attn.bq"), s_in_attn, s_q, OutMode.INT8),
            k=_linear(w[p + "attn.wk"], w.get(p + "attn.bk"), s_in_attn, s_k, OutMode.INT8),
            v=_linear(w[p + "attn.wv"], w.get(p + "attn.bv"), s_in_attn, s_v, OutMode.INT8),
            o=_linear(w[p + "attn.wo"], w.get(p + "attn.bo"), s_o, s_res, OutMode.INT16),
            ln2=_layernorm(w[p + "ln2.weight"], w[p + "ln2.bias"], s_y2, s_h2),
            ffn1=_linear(w[p + "ffn.w1"], w.get(p + "ffn.b1"), s_in_ffn, s_f1, OutMode.INT8),
            ffn2=_linear(w[p + "ffn.w2"], w.get(p + "ffn.b2"), s_f2, s_res, OutMode.INT16),
            score_mult=score_mult, score_shift=score_shift,
            out_mult=out_mult, out_shift=out_shift,
            lut=act_table(s_f1, s_f2).astype(np.int64)))
    qm = QModel(cfg, layers, s_res, scales)
    if cfg.norm == "post":
        qm.in_mult, qm.in_shift = quantize_multiplier(s_res / scales["layers.0.in8"])
    return qm


def quantize_input(qm: QModel, x) -> np.ndarray:
    """Float activations -> the int16 residual stream (round half up, saturate)."""
    return np.clip(_round_half_up(np.asarray(x, np.float64) / qm.s_res), -_I16 - 1, _I16)


def dequantize_residual(qm: QModel, x) -> np.ndarray:
    return np.asarray(x, np.float64) * qm.s_res
