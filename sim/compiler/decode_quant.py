"""Quantisation of a decoder's embedding, final norm and LM head (``sim.golden.decode``).

Calibrated **once**, like the blocks (``sim.compiler.quantize``), on the float prefill of the
calibration tokens (the prompt), and fixed for every decode step after it:

- The embedding table is int8 at one scale, ``s_e = max|E| / 127``; a learned position table
  likewise at ``s_p = max|P| / 127``. Each becomes the int16 residual (scale ``s_res``) by a
  per-tensor REQUANT, ``quantize_multiplier(s_e / s_res)`` (and ``s_p / s_res``).
- The final norm is calibrated as a block's LN: int16 at ``max|y| / 32767``, int8 at
  ``max|y| / 127`` (``y``: the float final norm output). Under ``quant = "llm16c"`` it is
  the blocks' RMSNorm of a residual at per-channel scales (the last block's:
  ``sim.compiler.quantize.channel_norm``), and the REQUANTs of the tables into the residual
  are per lane.
- The LM head writes int16 logits at ``s_l = max|logits| / 32767``. Tied, its weights are the
  int8 table itself transposed (every column at ``s_e``); untied, its own matrix, int8 per
  column like every other matmul. A logit beyond the calibrated range saturates at 32767.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw.spec import ModelConfig
from hw.spec.formats import OutMode, quantize_multiplier

from ..golden.decode import (
    check_decode,
    embed_float,
    head_weight_names,
    learned_positions,
    logits_float,
)
from ..golden.float_model import checked_tensor, model_forward
from .quantize import (
    QLayerNorm,
    QLinear,
    QModel,
    _absmax,
    _layernorm,
    _linear,
    _mult_shift,
    _round_half_up,
    channel_norm,
    quantize_model,
)

__all__ = ["QHead", "quantize_decode", "check_head_weights"]

_I8, _I16 = 127, 32767


@dataclass
class QHead:
    """The integer embedding, final norm and LM head."""

    emb8: np.ndarray              # [vocab, d_model] int8
    emb_req: tuple[int, int]      # int8 table -> int16 residual
    norm: QLayerNorm
    lm: QLinear                   # [d_model, vocab], int16 logits
    s_logit: float
    pos8: np.ndarray | None = None          # [seq_len, d_model] int8 (learned positions)
    pos_req: tuple[int, int] | None = None
    #: llm16c: the final norm's per-lane REQUANT into its one-scale copy and RMS_APPLY's
    #: element count (``sim.compiler.quantize.channel_norm``), or None.
    norm_req: tuple | None = None
    norm_n: int = 0


def check_head_weights(cfg: ModelConfig, hw: dict, source: str = "weights") -> dict:
    """Validate the head tensors' names and shapes; return float64 arrays."""
    return {name: checked_tensor(hw, name, shape, source)
            for name, shape in head_weight_names(cfg).items()}


def _table8(t) -> tuple[np.ndarray, float]:
    s = _absmax(t) / _I8
    return np.clip(_round_half_up(t / s), -128, 127), s


def quantize_decode(cfg: ModelConfig, weights: dict, hw: dict, calib_ids) -> tuple[QModel, QHead]:
    """The blocks' and the head's integer parameters, calibrated on the float prefill of
    ``calib_ids`` (the prompt)."""
    calib_ids = np.asarray(calib_ids, np.int64).reshape(-1)
    check_decode(cfg, calib_ids.size)
    hw = check_head_weights(cfg, hw)
    x = embed_float(cfg, hw, calib_ids)
    qm = quantize_model(cfg, weights, x)
    record: dict = {}
    logits_float(cfg, hw, model_forward(cfg, weights, x), record)
    s_res = qm.input_scale(0)

    def req(ratio):
        """Per tensor, or per lane where the residual has a scale per channel (llm16c)."""
        ratio = np.asarray(ratio, np.float64)
        return quantize_multiplier(float(ratio)) if ratio.ndim == 0 else _mult_shift(ratio)
    emb8, s_e = _table8(hw["embed.weight"])
    emb_req = req(s_e / s_res)
    pos8 = pos_req = None
    if learned_positions(cfg):
        pos8, s_p = _table8(hw["pos.weight"])
        pos_req = req(s_p / s_res)
    y = _absmax(record["final_norm"])
    s_y, s_h = y / _I16, y / _I8
    # A norm does not depend on its input's scale (RMSNorm: beta 0, no norm.bias), except
    # through llm16c's channel scales, which gamma carries.
    gamma, norm_req, norm_n = hw["norm.weight"], None, 0
    if cfg.quant == "llm16c":
        norm_req, norm_n, factor = channel_norm(qm.residual_scale())
        gamma = gamma * factor
    norm = _layernorm(gamma, hw.get("norm.bias", np.zeros(cfg.d_model)), s_y, s_h)
    s_l = _absmax(record["logits"]) / _I16
    if cfg.tie_embeddings:
        mult, shift = _mult_shift(np.full(cfg.vocab_size, s_h * s_e / s_l))
        lm = QLinear(emb8.T.copy(), np.zeros(cfg.vocab_size, np.int64), mult, shift,
                     OutMode.INT16)
    else:
        lm = _linear(hw["lm_head.weight"], None, s_h, s_l, OutMode.INT16)
    return qm, QHead(emb8, emb_req, norm, lm, s_l, pos8, pos_req, norm_req, norm_n)
