"""How far the integer model is from float64, layer by layer (``npu bench``'s accuracy module,
``docs/accuracy.md``).

:func:`layer_accuracy` quantises a model with the scheme of its ``quant`` and runs the integer
golden model (``sim.golden.layer``; the ISS and the RTL give the same integers, tested) two
ways against the float64 reference (``sim.golden.float_model``):

- **local**: each block alone, on the float64 reference's input to it quantised to the int16
  residual (and, post-norm int8, the int8 copy a chip starting at that block makes): the
  block's own error;
- **chained**: every block from the model's input on, as ``npu sim`` runs it: the errors
  accumulate.

Each gives the cosine similarity and the largest absolute difference of the dequantised
output to the reference's, and the worst token's cosine (one row of the output against the
reference's row: a decoder's massive activations put most of the whole tensor's norm in its
first token, so the whole-tensor cosine can hide the other tokens' error).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw.spec import ModelConfig

from ..compiler.quantize import dequantize_residual, quantize_input, quantize_model
from ..golden.float_model import model_forward
from ..golden.layer import layer_int
from ..golden.matmul import requant

__all__ = ["LayerAccuracy", "layer_accuracy", "cosine", "token_cosine"]


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) or 1.0))


def token_cosine(a, b) -> float:
    """The worst row's cosine of ``a`` against ``b`` ([tokens, d]): the token furthest off."""
    return min(cosine(x, y) for x, y in zip(np.asarray(a), np.asarray(b), strict=True))


@dataclass(frozen=True)
class LayerAccuracy:
    """One block's output against float64: alone (local) and from the model's input (chained)."""

    layer: int
    local_cosine: float
    local_max_abs: float
    chained_cosine: float
    chained_max_abs: float
    local_token_cosine: float = 1.0      # the worst token's cosine, alone
    chained_token_cosine: float = 1.0    # ... and chained


def layer_accuracy(cfg: ModelConfig, weights: dict, x, calib=None) -> list[LayerAccuracy]:
    """Per block of ``cfg`` (scheme ``cfg.quant``) on the float input ``x`` [seq, d_model],
    scales calibrated on ``calib`` (default ``x``, as ``npu sim`` does)."""
    x = np.asarray(x, np.float64)
    qm = quantize_model(cfg, weights, x if calib is None else calib)
    ref: dict = {}
    model_forward(cfg, weights, x, ref)
    out = []
    chained, x8 = quantize_input(qm, x), None
    for i in range(cfg.n_layers):
        want = ref[f"layers.{i}.out"]
        chained, x8 = layer_int(qm, i, chained, x8)
        alone = quantize_input(qm, ref[f"layers.{i}.in"], i)
        alone8 = requant(alone, *qm.input_requant(i), 8) if cfg.norm == "post" else None
        alone, _ = layer_int(qm, i, alone, alone8)
        got_l, got_c = dequantize_residual(qm, alone, i), dequantize_residual(qm, chained, i)
        out.append(LayerAccuracy(i, cosine(got_l, want), float(np.abs(got_l - want).max()),
                                 cosine(got_c, want), float(np.abs(got_c - want).max()),
                                 token_cosine(got_l, want), token_cosine(got_c, want)))
    return out
