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
  RMSNorm (``norm_kind = "rmsnorm"``) is calibrated the same way, with beta = 0.
- RoPE (``rope_theta`` > 0, :mod:`sim.golden.rope`): the rotated copies ``q'``, ``k'`` are Q's
  and K's integer columns permuted and negated (the same requantisation), and the rotated Q
  and K are int8 at ``s_qr = max|q_rope| / 127`` (likewise K), made by REQUANT with
  ``quantize_multiplier(s_q / (127 s_qr))``; the score scale is then ``s_qr * s_kr``.
  Grouped-query attention changes only K's and V's widths.
- GELU/ReLU/SiLU: a 256-entry table from the int8 input scale to the int8 output scale.
- A gated FFN (``ffn = "gated"``): the gate is calibrated like FFN1 (the up matrix; both
  per column from the LayerNorm output), the table maps the gate's int8 scale ``s_g`` to the
  activated gate's ``s_a``, and MUL requantises the int16 product to the FFN2 input's ``s_m``
  with ``(mult, shift) = quantize_multiplier(s_a * s_u / s_m)`` (``s_u``: FFN1's output).
  Not under smooth16 (``sim.compiler.compat`` refuses it: the hidden would be int16; a SiLU
  MLP is fine there, with SiLU's GELU16 knots, :func:`~sim.golden.vector.silu16_table`).

``quant = "smooth16"`` (the model's scheme, ``docs/formats.md``, Quantisation schemes) changes
three things, every one a static scale computed here from the whole calibration run, so the
integers still do not depend on how the work is split:

- **Smoothing** of the LayerNorm outputs that feed QKV and FFN1 (SmoothQuant): per input
  channel ``t_j = max|y_j|**alpha / max_c|W[j, c]|**(1 - alpha)`` (geometric mean 1), the
  weight rows multiplied by ``t_j`` before their per-column quantisation, the int8 input
  ``y_j / t_j`` at ``s_x = max_j(max|y_j| / t_j) / 127``. Pre-norm folds ``1 / t`` into the
  LayerNorm's gamma and beta (its int16 output feeds nothing else). Post-norm cannot (the int16
  output is the residual): a per-lane REQUANT makes the int8 copy, ``(m_j, sh_j) =
  quantize_multiplier(s_res / (t_j s_x))``; ``t_j`` is raised where that ratio would exceed
  2**14.
- **FFN1 output int16** at ``s_p = max|ffn_pre| / 32767``, activated by GELU16 (257 knots at
  ``s_p``, :func:`sim.golden.vector.gelu16_table`; SiLU: :func:`~sim.golden.vector.silu16_table`
  over twice GELU's span; ReLU: :func:`~sim.golden.vector.relu16_table`, exact) into int16 at
  the same scale.
- **FFN2 over the int16 hidden** as two int8 passes (:func:`sim.golden.matmul.linear16`): the
  per-column ``(mult, shift)`` requantises the whole product (``s_p s_w[c] / s_res``, shift at
  least 9, the hi pass using ``shift - 8``).

``quant = "llm16"`` (pre-norm only) is smooth16 made for decoders whose residual stream spans
five decades (Llama's massive activations: SmolLM2-135M's first token reaches 22,000 in one
channel from block 11 on, while block 0's input is below 1), again every scale static:

- **A residual scale per block**: block i's stream (its input, both adds, the O and FFN2
  outputs) is int16 at ``s_i = RESIDUAL_HEADROOM * max|block i's residual tensors| / 32767``;
  the block starts with a per-tensor REQUANT of the residual, ``quantize_multiplier(s_(i-1) /
  s_i)`` (``QLayer.res_req``; every block after the first has one, exact where the two scales
  are equal, so the program does not depend on the data). The model's input is quantised at
  ``s_0``, its output dequantised at the last block's scale.
- **Smoothing** of both norms' outputs, folded into gamma as smooth16 does for pre-norm (the
  FFN side's weight maxima over W1 and the gate together).
- **A gated FFN's hidden int16**: the gate and up outputs stay int8 (MUL takes int8
  operands), MUL writes their exact int16 product (``(mult, shift) = (2, 1)``, scale
  ``s_a s_u``), GELU16 with identity knots (:func:`~sim.golden.vector.identity16_table`,
  g = 7) splits it into the two int8 planes and FFN2 runs the two passes of smooth16. An MLP
  FFN is smooth16's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hw.spec import ModelConfig
from hw.spec.formats import OutMode, quantize_multiplier

from ..golden.float_model import model_forward
from ..golden.matmul import LINEAR16_SHIFT_MIN
from ..golden.rope import ROPE_ONE, rotation
from ..golden.vector import (
    SILU16_SPAN,
    SPLIT16_G,
    gelu16_knot_shift,
    gelu16_table,
    gelu_table,
    identity16_table,
    relu16_table,
    relu_table,
    silu16_table,
    silu_table,
    split16_table,
)

__all__ = ["QLinear", "QLayerNorm", "QRope", "QLayer", "QModel", "quantize_model", "quantize_input",
           "dequantize_residual", "smoothing_factors", "RELU16_G", "LANE_RATIO_MAX",
           "RESIDUAL_HEADROOM", "IDENTITY16_G", "EXACT_MUL", "QGated16", "LLM_SCHEMES",
           "CHANNEL_FLOOR", "CHANNEL_RATIO_MAX", "GATED16_HEADROOM", "PRODUCT16_HEADROOM"]

_I8, _I16, _I32 = 127, 32767, 2**31 - 1

#: GELU16 knot spacing of a ReLU model under smooth16 (any g is exact; 7 keeps every knot int16).
RELU16_G = 7
#: Largest per-lane requantisation ratio smoothing may ask for (quantize_multiplier represents
#: up to about 2**15; a channel whose ratio would exceed this gets a larger t_j).
LANE_RATIO_MAX = 2.0 ** 14
#: llm16: each block's residual scale covers this many times the calibration's largest
#: residual value (static scales meet other text: SmolLM2-135M's block 2 peaks 18% above its
#: calibration on another prompt, and an int16 residual that saturates loses the channel).
RESIDUAL_HEADROOM = 1.25
#: llm16: the knot spacing of the identity GELU16 that splits the gated product into planes.
IDENTITY16_G = 7
#: MUL's ``(mult, shift)`` for the exact int16 product of two int8 (llm16's gated hidden).
EXACT_MUL = (2, 1)
#: The schemes with a residual scale per block (pre-norm decoders).
LLM_SCHEMES = ("llm16", "llm16c")
#: llm16c: a residual channel whose calibration maximum is below this many times the median
#: channel's shares that level (capped at the block's largest maximum): only outlier channels
#: get a scale of their own, the others one that generalises like a per-tensor scale.
CHANNEL_FLOOR = 16.0
#: llm16c: the largest ratio of a block's coarsest residual channel scale to its finest (finer
#: channels are raised to it): RMSNorm's z (:func:`sim.golden.vector.ln_normalise`, |z| < 256)
#: of a fine channel is at most this ratio times its share of the row's RMS.
CHANNEL_RATIO_MAX = 128.0
#: llm16c: the int16 gate and up outputs cover this many times their calibration maxima.
GATED16_HEADROOM = 2.0
#: llm16c: the int16 gated product covers this many times its calibration maximum (rounded
#: up to a power of two of the operands' product scale).
PRODUCT16_HEADROOM = 1.25


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
class QRope:
    """RoPE of one layer: the rotated projections ``q' = h @ (Wq P)`` and ``k'`` (Q's and K's
    integers, columns permuted and negated), and the per-tensor ``(mult, shift)`` of the
    int16 ``q C + q' S`` (and K's) into the rotated int8 Q (K)."""

    qr: QLinear
    kr: QLinear
    q_req: tuple[int, int]
    k_req: tuple[int, int]


@dataclass
class QGated16:
    """llm16c's gated FFN: the gate and up outputs int16 (per tensor), their product int16
    from their balanced byte digits (``x = 256 * xh + xl``, ``xh = round(x / 256)``,
    ``xl = int8(x & 0xFF)``)::

        y   = GELU16(silu, gate16)                      (SiLU at the gate's scale)
        p16 = (yh uh) 2**(16 - m) + round(yh ul / 2**(m - 8)) + round(yl uh / 2**(m - 8))
              + round(yl ul / 2**m)

    ``~= y * up16 / 2**m`` within 2 (four MULs, int16 out, added by three saturating ADDs in
    that order): ``hh``, ``hl`` and ``ll`` are the MULs' ``(mult, shift)`` (``hl`` for both
    middle terms)."""

    silu: np.ndarray     # [257] int16 GELU16 knots of SiLU at the gate's scale
    silu_g: int          # their spacing
    m: int               # the product's shift: p16 ~ y * up16 / 2**m
    hh: tuple[int, int]
    hl: tuple[int, int]
    ll: tuple[int, int]


def _pow2_mul(k: int) -> tuple[int, int]:
    """MUL's ``(mult, shift)`` for ``round(a * b * 2**k)`` (exact for k >= -1)."""
    return (1 << (k + 1), 1) if k >= 0 else (1, -k)


def _rotated(ql: QLinear, d_head: int, heads: int) -> QLinear:
    """``ql`` with ``rotate_half`` on its output columns: ``-col[j + d/2]``, ``col[j - d/2]``
    (the weights are at most 127 in magnitude, so negating them stays int8)."""
    src, sign = rotation(d_head, heads)
    return QLinear(ql.w[:, src] * sign, ql.bias[src] * sign, ql.mult[src], ql.shift[src],
                   ql.mode)


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
    lut: np.ndarray | None   # [256] int8, the activation table (None under smooth16)
    #: smooth16, post-norm: per-lane ``(mult, shift)`` of the int16 residual -> the int8 QKV
    #: input, and of LN1's int16 output -> the int8 FFN1 input (None otherwise).
    qkv_req: tuple[np.ndarray, np.ndarray] | None = None
    ffn_req: tuple[np.ndarray, np.ndarray] | None = None
    #: smooth16: the 257 int16 GELU16 knots and their spacing g (the FFN hidden is int16 and
    #: FFN2 two int8 passes); None under int8.
    lut16: np.ndarray | None = None
    gelu_g: int = 0
    #: smooth16: the smoothing factors t by the matmuls they feed (``"qkv"``, ``"ffn1"``).
    smooth: dict = field(default_factory=dict)
    #: A gated FFN: the gate matrix (FFN1's shape; ``lut`` activates it) and MUL's per-tensor
    #: requantisation of activated gate x FFN1 output into the FFN2 input (None: an MLP).
    gate: QLinear | None = None
    mul_mult: int = 1
    mul_shift: int = 1
    #: RoPE (``rope_theta`` > 0): the rotated projections and requantisations (None: none).
    rope: QRope | None = None
    #: llm16: the per-tensor ``(mult, shift)`` that brings the residual from the previous
    #: block's scale to this block's (llm16c: per lane, two arrays; None: nothing to do).
    res_req: tuple | None = None
    #: llm16c: the per-lane ``(mult, shift)`` of the residual into one int16 scale whose
    #: statistics feed both RMSNorms (RMS_APPLY with ``norm_n`` elements), or None.
    norm_req: tuple | None = None
    norm_n: int = 0
    #: llm16c: the gated FFN's int16 x int16 product (None otherwise).
    gated16: QGated16 | None = None

    @property
    def ffn16(self) -> bool:
        """The FFN hidden is int16 (GELU16, two-pass FFN2)."""
        return self.lut16 is not None


@dataclass
class QModel:
    cfg: ModelConfig
    layers: list[QLayer]
    s_res: float                 # residual stream scale (int16; llm16c: per channel, an array)
    scales: dict                 # every calibrated activation scale, by name
    in_mult: int = 1             # post-norm int8: residual int16 -> int8 input of layer 0
    in_shift: int = 1
    quant: str = "int8"          # the scheme (``ModelConfig.quant``)
    #: The residual scale of each block (llm16: its own; llm16c: its own per channel, an
    #: array; otherwise all ``s_res``); None: all ``s_res``.
    res_scales: list | None = None

    def residual_scale(self, layer: int | None = None) -> float:
        """The int16 residual's scale in block ``layer`` (its input after any ``res_req``, and
        its output); None: the last block's, the model's output."""
        if not self.res_scales:
            return self.s_res
        return self.res_scales[-1 if layer is None else layer]

    def input_scale(self, layer: int = 0) -> float:
        """The scale of the residual as block ``layer`` receives it (the previous block's
        output; block 0: the model's input, ``s_res``), before its ``res_req``."""
        return self.s_res if layer == 0 else self.residual_scale(layer - 1)

    def input_requant(self, layer: int) -> tuple[int, int]:
        """Post-norm int8: the per-tensor ``(mult, shift)`` of the int8 copy of the residual
        that block ``layer`` reads, made from the int16 residual when a chip starts there (the
        previous block's LayerNorm makes it at the same scale otherwise)."""
        if layer == 0:
            return self.in_mult, self.in_shift
        ln2 = self.layers[layer - 1].ln2
        return ln2.mult, ln2.shift


def _linear(w, b, s_in, s_out, mode, *, row_scale=None, two_pass=False) -> QLinear:
    """``row_scale``: smoothing factors multiplied into the rows of ``w`` first; ``two_pass``:
    the requantisation of an int16 input's two int8 passes (shift at least 9)."""
    w = np.asarray(w, np.float64)
    if row_scale is not None:
        w = w * np.asarray(row_scale, np.float64)[:, None]
    s_w = np.maximum(np.max(np.abs(w), axis=0), 1e-30) / _I8
    wq = np.clip(_round_half_up(w / s_w), -128, 127)
    acc_scale = s_in * s_w
    bias = np.zeros(w.shape[1]) if b is None else np.asarray(b, np.float64)
    bq = np.clip(_round_half_up(bias / acc_scale), -_I32 - 1, _I32)
    mult, shift = _mult_shift(acc_scale / s_out)
    if two_pass:
        mult, shift = _two_pass_params(acc_scale / s_out, mult, shift)
    return QLinear(wq, bq, mult, shift, OutMode(mode))


def _two_pass_params(ratio, mult, shift):
    """Pairs with ``shift >= LINEAR16_SHIFT_MIN``: a column whose closest pair has a smaller
    shift takes ``shift = LINEAR16_SHIFT_MIN`` and a smaller ``mult`` (ValueError when even
    ``mult = 65535`` is too small, a ratio of 128 or more)."""
    low = shift < LINEAR16_SHIFT_MIN
    if low.any():
        mult = mult.copy()
        shift = shift.copy()
        mult[low] = _round_half_up(ratio[low] * 2.0 ** LINEAR16_SHIFT_MIN)
        shift[low] = LINEAR16_SHIFT_MIN
        if mult.max() >= 1 << 16:
            raise ValueError(f"requantisation ratio {float(ratio.max()):.4g} is too large for "
                             f"two int8 passes (shift >= {LINEAR16_SHIFT_MIN} needs it below "
                             "128)")
    return mult, shift


def smoothing_factors(xmax, wmax, alpha: float) -> np.ndarray:
    """SmoothQuant's ``t_j = xmax_j**alpha / wmax_j**(1 - alpha)``, normalised to geometric
    mean 1: the input channel j is divided by ``t_j`` and the weight row j multiplied by it
    (``xmax``: the calibration's max |x| per channel; ``wmax``: max |W[j, :]|)."""
    t = (np.maximum(np.asarray(xmax, np.float64), 1e-5) ** alpha
         / np.maximum(np.asarray(wmax, np.float64), 1e-5) ** (1.0 - alpha))
    return t / np.exp(np.mean(np.log(t)))


def _smoothed_input(xmax, wmax, alpha, s_y):
    """Smoothing of an LN output at int16 scale ``s_y`` feeding weights with row maxima
    ``wmax``: ``(t, s_x, (mult, shift))``, the per-lane requantisation ``s_y / (t_j s_x)``
    kept at most :data:`LANE_RATIO_MAX`."""
    t = smoothing_factors(xmax, wmax, alpha)
    s_x = _absmax(np.asarray(xmax) / t) / _I8
    t = np.maximum(t, s_y / (LANE_RATIO_MAX * s_x))
    s_x = _absmax(np.asarray(xmax) / t) / _I8
    return t, s_x, _mult_shift(s_y / (t * s_x))


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


def _channel_scales(cmax) -> np.ndarray:
    """llm16c: one block's int16 residual scale per channel from its calibration maxima
    ``cmax`` (``RESIDUAL_HEADROOM`` above each): channels below ``CHANNEL_FLOOR`` times the
    median channel share that level (at most the largest maximum), and none is finer than the
    coarsest over ``CHANNEL_RATIO_MAX``."""
    cmax = np.maximum(np.asarray(cmax, np.float64), 1e-30)
    floor = min(CHANNEL_FLOOR * float(np.median(cmax)), float(cmax.max()))
    s = RESIDUAL_HEADROOM * np.maximum(cmax, floor) / _I16
    return np.maximum(s, s.max() / CHANNEL_RATIO_MAX)


def channel_norm(scales) -> tuple[tuple[np.ndarray, np.ndarray], int, np.ndarray]:
    """llm16c's RMSNorm of a residual at per-channel ``scales``: the per-lane ``(mult,
    shift)`` into the coarsest scale ``C`` (the copy's ``sum y**2`` is the row's ``sum x**2 /
    C**2``), the element count RMS_APPLY takes (1: ``z_j = x_j / sqrt(sum y**2)``, the real
    ``x_j / |x|`` times ``C / scales[j]``, so ``|z| <= CHANNEL_RATIO_MAX`` and no data can
    clamp it), and the factor ``(scales / C) * sqrt(n)`` that gamma carries so that the output
    is the row's RMSNorm."""
    scales = np.asarray(scales, np.float64)
    coarse = float(scales.max())
    return _mult_shift(scales / coarse), 1, scales / coarse * math.sqrt(scales.size)


def quantize_model(cfg: ModelConfig, weights: dict, calib) -> QModel:
    """Quantise ``weights`` with activation scales calibrated on ``calib`` ([.., seq, d]), in
    the model's scheme ``cfg.quant``."""
    record: dict = {}
    maxima: dict = {}
    channels: dict = {}          # per-channel max |x| of the 2-D tensors (smoothing)
    calib = np.asarray(calib, np.float64)
    for sample in (calib if calib.ndim == 3 else calib[None]):
        model_forward(cfg, weights, sample, record)
        for key, value in record.items():
            maxima[key] = max(maxima.get(key, 0.0), _absmax(value))
            if np.ndim(value) == 2:
                col = np.max(np.abs(value), axis=0)
                channels[key] = np.maximum(channels.get(key, col), col)
    resid_keys = [k for k in maxima if k.rsplit(".", 1)[-1] in
                  ("in", "mid", "mid_pre", "out_pre", "out")]
    resid_keys += [k for k in maxima if k.endswith("attn_out") or k.endswith("ffn_out")]
    s_res = max(maxima[k] for k in resid_keys) / _I16
    res_scales = [s_res] * cfg.n_layers
    if cfg.quant in LLM_SCHEMES:
        if cfg.norm != "pre":
            raise ValueError(f'quant="{cfg.quant}" is for pre-norm models (norm="pre")')
        for i in range(cfg.n_layers):
            keys = [k for k in resid_keys if k.startswith(f"layers.{i}.")]
            if cfg.quant == "llm16":
                res_scales[i] = RESIDUAL_HEADROOM * max(maxima[k] for k in keys) / _I16
            else:
                res_scales[i] = _channel_scales(np.max([channels[k] for k in keys], axis=0))
        s_res = res_scales[0]
    scales = {"residual": s_res}
    calibration = _Calibration(maxima, channels, scales)
    layers = [_quantize_layer(cfg, weights, i, calibration, res_scales[i])
              for i in range(cfg.n_layers)]
    if cfg.quant in LLM_SCHEMES:
        # Every block after the first requantises, by 1 where two scales are equal: the
        # program depends on the shapes and the scheme, never on the data.
        for i in range(1, cfg.n_layers):
            scales[f"layers.{i}.residual"] = res_scales[i]
            ratio = np.asarray(res_scales[i - 1]) / np.asarray(res_scales[i])
            layers[i].res_req = quantize_multiplier(float(ratio)) if ratio.ndim == 0 else \
                _mult_shift(ratio)
    qm = QModel(cfg, layers, s_res, scales, quant=cfg.quant,
                res_scales=res_scales if cfg.quant in LLM_SCHEMES else None)
    if cfg.norm == "post":
        qm.in_mult, qm.in_shift = quantize_multiplier(s_res / scales["layers.0.in8"])
    return qm


@dataclass
class _Calibration:
    maxima: dict         # max |x| of every recorded tensor
    channels: dict       # max |x| per channel of the 2-D ones
    scales: dict         # the scales chosen, by name (filled in)

    def s8(self, name: str) -> float:
        self.scales[name] = self.maxima[name] / _I8
        return self.scales[name]


def _quantize_layer(cfg: ModelConfig, w: dict, i: int, cal: _Calibration, s_res):
    p = f"layers.{i}."
    llm = cfg.quant in LLM_SCHEMES
    smooth16 = cfg.quant == "smooth16" or llm       # llm16, llm16c: smooth16 and more
    gated16 = llm and cfg.ffn == "gated"
    wide = cfg.quant == "llm16c"
    norm_req, norm_n, gamma_factor = None, 0, None
    if wide:
        norm_req, norm_n, gamma_factor = channel_norm(s_res)
    wqkv = np.concatenate([np.asarray(w[p + f"attn.w{c}"], np.float64) for c in "qkv"], axis=1)
    # The FFN's input feeds W1 and, gated, the gate: smoothing scales the rows of both.
    wffn = np.concatenate([np.asarray(w[p + k], np.float64)
                           for k in ("ffn.w1", "ffn.wg") if p + k in w], axis=1)
    wmax = {"qkv": np.max(np.abs(wqkv), axis=1), "ffn1": np.max(np.abs(wffn), axis=1)}
    smooth, lane, fold = {}, {}, {}
    if cfg.norm == "pre":
        # Pre-norm: the LayerNorms' int8 outputs feed QKV and FFN1 and nothing else, so
        # smooth16 folds 1/t into their gamma and beta.
        ln_in = {}
        for what, src in (("qkv", "ln1_out"), ("ffn1", "ln2_out")):
            peak = cal.maxima[p + src]
            if smooth16:
                smooth[what] = fold[what] = smoothing_factors(cal.channels[p + src],
                                                              wmax[what], cfg.smooth_alpha)
                peak = _absmax(cal.channels[p + src] / smooth[what])
            cal.scales[p + src] = peak / _I8
            ln_in[what] = (peak / _I16, peak / _I8)     # int16 output, int8 output
        (s_y1, s_h1), (s_y2, s_h2) = ln_in["qkv"], ln_in["ffn1"]
        s_in_attn, s_in_ffn = s_h1, s_h2
    else:
        # Post-norm: attention and FFN read the int8 copy of the residual (the previous
        # LayerNorm's q8 output, or the quantised input for layer 0; under smooth16 a
        # per-lane REQUANT of it).
        cal.scales[p + "in8"] = cal.maxima[p + "in"] / _I8
        s_h1 = cal.scales[p + "mid8"] = cal.maxima[p + "mid"] / _I8
        s_h2 = cal.maxima[p + "out"] / _I8
        s_y1 = s_y2 = s_res
        if smooth16:
            for what, src, name in (("qkv", "in", "in8"), ("ffn1", "mid", "mid8")):
                smooth[what], cal.scales[p + name], lane[what] = _smoothed_input(
                    cal.channels[p + src], wmax[what], cfg.smooth_alpha, s_res)
        s_in_attn, s_in_ffn = cal.scales[p + "in8"], cal.scales[p + "mid8"]
    s_q, s_k, s_v, s_o = (cal.s8(p + n) for n in ("q", "k", "v", "attn_o"))
    # The scores read the rotated Q and K under RoPE.
    s_sq, s_sk = (cal.s8(p + "q_rope"), cal.s8(p + "k_rope")) if cfg.rope else (s_q, s_k)
    score_mult, score_shift = quantize_multiplier(s_sq * s_sk * 256 / math.sqrt(cfg.d_head))
    out_mult, out_shift = quantize_multiplier(s_v / 256 / s_o)

    def ln(k, s_y, s_h, t):
        g = np.asarray(w[p + f"ln{k}.weight"], np.float64)
        # RMSNorm has no beta: the unit adds beta = 0 (the words keep LayerNorm's layout).
        b = np.zeros_like(g) if cfg.rmsnorm else np.asarray(w[p + f"ln{k}.bias"], np.float64)
        if t is not None:
            g, b = g / t, b / t
        if gamma_factor is not None:
            g = g * gamma_factor
        return _layernorm(g, b, s_y, s_h)

    gate, mul_mult, mul_shift, wide16 = None, 1, 1, None
    if gated16 and wide:
        # Gate and up int16 (per tensor), SiLU by GELU16, their product int16 from the
        # operands' byte digits (QGated16), split into planes, FFN2 in two passes.
        s_g = cal.scales[p + "ffn_gate16"] = GATED16_HEADROOM * cal.maxima[p + "ffn_gate"] / _I16
        s_u = cal.scales[p + "ffn_pre16"] = GATED16_HEADROOM * cal.maxima[p + "ffn_pre"] / _I16
        peak = PRODUCT16_HEADROOM * cal.maxima[p + "ffn_act"] / (s_g * s_u)
        m = max(2, math.ceil(math.log2(peak / _I16)))     # hh's mult below 2**16
        s_p = cal.scales[p + "ffn_act16"] = s_g * s_u * 2.0 ** m
        ffn1 = _linear(w[p + "ffn.w1"], w.get(p + "ffn.b1"), s_in_ffn, s_u, OutMode.INT16,
                       row_scale=smooth["ffn1"])
        gate = _linear(w[p + "ffn.wg"], w.get(p + "ffn.bg"), s_in_ffn, s_g, OutMode.INT16,
                       row_scale=smooth["ffn1"])
        ffn2 = _linear(w[p + "ffn.w2"], w.get(p + "ffn.b2"), s_p, s_res, OutMode.INT16,
                       two_pass=True)
        act16 = {"silu": silu16_table, "gelu": gelu16_table}.get(cfg.activation)
        if act16 is None:
            g_act, knots = RELU16_G, relu16_table(RELU16_G)
        else:
            g_act = gelu16_knot_shift(s_g, SILU16_SPAN if cfg.activation == "silu" else 8.0)
            knots = act16(s_g, g_act)
        wide16 = QGated16(knots, g_act, m, _pow2_mul(16 - m), _pow2_mul(8 - m), _pow2_mul(-m))
        lut, g, lut16 = None, SPLIT16_G, split16_table()
    elif gated16:
        # Gate and up int8 as under int8 (smoothed), their product exact in int16 (scale
        # s_a s_u), split into planes by an identity GELU16, FFN2 in two passes.
        s_f1, s_g, s_a = (cal.s8(p + k) for k in ("ffn_pre", "ffn_gate", "ffn_gact"))
        cal.scales[p + "ffn_act16"] = s_a * s_f1
        ffn1 = _linear(w[p + "ffn.w1"], w.get(p + "ffn.b1"), s_in_ffn, s_f1, OutMode.INT8,
                       row_scale=smooth["ffn1"])
        gate = _linear(w[p + "ffn.wg"], w.get(p + "ffn.bg"), s_in_ffn, s_g, OutMode.INT8,
                       row_scale=smooth["ffn1"])
        ffn2 = _linear(w[p + "ffn.w2"], w.get(p + "ffn.b2"), s_a * s_f1, s_res, OutMode.INT16,
                       two_pass=True)
        mul_mult, mul_shift = EXACT_MUL
        lut = silu_table(s_g, s_a).astype(np.int64) if cfg.activation == "silu" else \
            {"gelu": gelu_table, "relu": relu_table}[cfg.activation](s_g, s_a).astype(np.int64)
        g, lut16 = IDENTITY16_G, identity16_table(IDENTITY16_G)
    elif smooth16:
        s_p = cal.scales[p + "ffn_pre16"] = cal.maxima[p + "ffn_pre"] / _I16
        ffn1 = _linear(w[p + "ffn.w1"], w.get(p + "ffn.b1"), s_in_ffn, s_p, OutMode.INT16,
                       row_scale=smooth["ffn1"])
        ffn2 = _linear(w[p + "ffn.w2"], w.get(p + "ffn.b2"), s_p, s_res, OutMode.INT16,
                       two_pass=True)
        if cfg.activation == "gelu":
            g = gelu16_knot_shift(s_p)
            lut16 = gelu16_table(s_p, g)
        elif cfg.activation == "silu":
            g = gelu16_knot_shift(s_p, SILU16_SPAN)
            lut16 = silu16_table(s_p, g)
        else:
            g, lut16 = RELU16_G, relu16_table(RELU16_G)
        lut = None
    else:
        s_f1, s_f2 = cal.s8(p + "ffn_pre"), cal.s8(p + "ffn_act")
        ffn1 = _linear(w[p + "ffn.w1"], w.get(p + "ffn.b1"), s_in_ffn, s_f1, OutMode.INT8)
        ffn2 = _linear(w[p + "ffn.w2"], w.get(p + "ffn.b2"), s_f2, s_res, OutMode.INT16)
        act_table = {"gelu": gelu_table, "relu": relu_table, "silu": silu_table}[cfg.activation]
        if cfg.ffn == "gated":
            # FFN1 is the up matrix (s_f1), the product silu(gate) * up the FFN2 input (s_f2).
            s_g, s_a = cal.s8(p + "ffn_gate"), cal.s8(p + "ffn_gact")
            gate = _linear(w[p + "ffn.wg"], w.get(p + "ffn.bg"), s_in_ffn, s_g, OutMode.INT8)
            mul_mult, mul_shift = quantize_multiplier(s_a * s_f1 / s_f2)
            lut = act_table(s_g, s_a).astype(np.int64)
        else:
            lut = act_table(s_f1, s_f2).astype(np.int64)
        lut16, g = None, 0
    q, k, v = (_linear(w[p + f"attn.w{c}"], w.get(p + f"attn.b{c}"), s_in_attn, s_out,
                       OutMode.INT8, row_scale=smooth.get("qkv"))
               for c, s_out in (("q", s_q), ("k", s_k), ("v", s_v)))
    rope = None
    if cfg.rope:
        rope = QRope(_rotated(q, cfg.d_head, cfg.n_heads), _rotated(k, cfg.d_head, cfg.n_kv_heads),
                     quantize_multiplier(s_q / (ROPE_ONE * s_sq)),
                     quantize_multiplier(s_k / (ROPE_ONE * s_sk)))
    return QLayer(
        ln1=ln(1, s_y1, s_h1, fold.get("qkv")), q=q, k=k, v=v,
        o=_linear(w[p + "attn.wo"], w.get(p + "attn.bo"), s_o, s_res, OutMode.INT16),
        ln2=ln(2, s_y2, s_h2, fold.get("ffn1")), ffn1=ffn1, ffn2=ffn2,
        score_mult=score_mult, score_shift=score_shift, out_mult=out_mult, out_shift=out_shift,
        lut=lut, qkv_req=lane.get("qkv"), ffn_req=lane.get("ffn1"), lut16=lut16, gelu_g=g,
        smooth=smooth, gate=gate, mul_mult=mul_mult, mul_shift=mul_shift, rope=rope,
        norm_req=norm_req, norm_n=norm_n, gated16=wide16)


def quantize_input(qm: QModel, x, layer: int = 0) -> np.ndarray:
    """Float activations -> the int16 residual stream as block ``layer`` receives it
    (:meth:`QModel.input_scale`; the model's input by default; round half up, saturate)."""
    return np.clip(_round_half_up(np.asarray(x, np.float64) / qm.input_scale(layer)),
                   -_I16 - 1, _I16)


def dequantize_residual(qm: QModel, x, layer: int | None = None) -> np.ndarray:
    """The int16 residual of block ``layer``'s output as floats (None: the model's output)."""
    return np.asarray(x, np.float64) * qm.residual_scale(layer)
