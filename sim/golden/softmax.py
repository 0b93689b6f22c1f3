"""Golden model of the softmax unit: masked integer softmax, bit-exact with ``hw.tile.softmax``.

The integer algorithm is specified step by step in :mod:`hw.spec.softmax` (max-subtraction,
base-2 exp with a 256-entry fraction table, sum, one normalised reciprocal per row, multiply and
round half up). Inputs are score rows ``[..., L]`` of int16 in Q8.8 (logit = score / 256, scaling
by 1/sqrt(d_head) already applied) and masks ``[..., L]`` (true = visible). Outputs are unsigned
8-bit probabilities ``p / 256``; masked lanes are exactly 0 and a fully masked row is all zeros;
a lane whose probability rounds to 1.0 saturates to 255.

:func:`softmax_float` is the float64 reference with the same masking.
"""

import numpy as np

from hw.spec import softmax as spec
from hw.spec.formats import PROB_BITS, SCORE_BITS, SCORE_FRAC_BITS

__all__ = ["softmax", "softmax_parts", "softmax_float", "exponentials", "normalise",
           "partial_softmax", "exp_factor"]

_SCORE_MIN = -(1 << (SCORE_BITS - 1))
_SCORE_MAX = (1 << (SCORE_BITS - 1)) - 1
_LUT = np.array(spec.EXP_LUT, dtype=np.int64)


def _check(scores, mask):
    scores = np.asarray(scores)
    if not np.issubdtype(scores.dtype, np.integer):
        raise TypeError(f"scores must be an integer array, not {scores.dtype}")
    if scores.ndim < 1 or scores.shape[-1] < 2:
        raise ValueError(f"scores must have rows of at least 2 lanes, not shape {scores.shape}")
    if scores.size and (scores.min() < _SCORE_MIN or scores.max() > _SCORE_MAX):
        raise ValueError(f"scores have values outside int16: {scores.min()}..{scores.max()}")
    if mask is None:
        mask = np.ones(scores.shape, dtype=bool)
    mask = np.asarray(mask)
    if mask.shape != scores.shape:
        raise ValueError(f"mask shape {mask.shape} differs from scores shape {scores.shape}")
    return scores.astype(np.int64), mask.astype(bool)


def exponentials(s, m, top) -> np.ndarray:
    """Each visible lane's base-2 exponential against the row maximum ``top`` (a trailing
    axis of 1): the difference saturated at ``D_MAX``, times log2(e) rounded, the fraction
    looked up and shifted by the integer part; 0 for masked lanes."""
    d = np.minimum(np.where(m, top - s, 0), spec.D_MAX)
    y = (d * spec.LOG2E_MULT + (1 << (spec.LOG2E_SHIFT - 1))) >> spec.LOG2E_SHIFT
    return np.where(m, _LUT[y & ((1 << spec.EXP_FRAC_BITS) - 1)] >> (y >> spec.EXP_FRAC_BITS), 0)


def normalise(e, total) -> dict:
    """The probabilities of exponentials ``e`` whose row sum is ``total`` (a trailing axis of
    1): one normalised reciprocal per row, by long division, then multiply, round half up and
    saturate; ``z``, ``recip`` and ``p``."""
    # frexp's exponent is the bit length, exactly, for integers below 2**53.
    z = np.frexp(total.astype(np.float64))[1].astype(np.int64) - 1
    z = np.where(total > 0, z, spec.EXP_BITS)
    recip = np.where(total > 0, (np.int64(1) << (z + spec.RECIP_BITS)) // np.maximum(total, 1), 0)
    sh = z + spec.RECIP_BITS - PROB_BITS
    p = np.minimum((e * recip + (np.int64(1) << (sh - 1))) >> sh, (1 << PROB_BITS) - 1)
    return {"z": z, "recip": recip, "p": p}


def softmax_parts(scores, mask=None) -> dict:
    """Every intermediate of the integer algorithm: ``max``, ``e``, ``sum``, ``z``, ``recip``,
    ``p`` (row quantities keep a trailing axis of 1)."""
    s, m = _check(scores, mask)
    top = np.max(np.where(m, s, _SCORE_MIN), axis=-1, keepdims=True)
    e = exponentials(s, m, top)
    total = e.sum(axis=-1, keepdims=True)
    return {"max": top, "e": e, "sum": total, **normalise(e, total)}


def partial_softmax(scores, mask=None) -> dict:
    """The unit's partial mode (``hw.spec.softmax``): each row's unnormalised probabilities
    ``u`` (relative to its own maximum, 8-bit), its maximum ``max`` (the int16 minimum for a
    fully masked row) and ``sum = sum(u)`` (row quantities without a trailing axis)."""
    s, m = _check(scores, mask)
    top = np.max(np.where(m, s, _SCORE_MIN), axis=-1, keepdims=True)
    e = exponentials(s, m, top)
    u = np.minimum((e + (1 << (spec.PARTIAL_SHIFT - 1))) >> spec.PARTIAL_SHIFT,
                   (1 << PROB_BITS) - 1)
    return {"u": u, "max": top[..., 0], "sum": u.sum(axis=-1)}


def exp_factor(d) -> np.ndarray:
    """The softmax's exp of ``-d / 256`` as a Q0.15 factor (``2**15`` for ``d = 0``), ``d >=
    0`` in score units: ``d`` clamped to ``D_MAX``, times log2(e) rounded, looked up and
    shifted (steps 2-4 of ``hw.spec.softmax``)."""
    d = np.minimum(np.asarray(d, np.int64), spec.D_MAX)
    if d.size and d.min() < 0:
        raise ValueError(f"exp_factor needs d >= 0, not {d.min()}")
    y = (d * spec.LOG2E_MULT + (1 << (spec.LOG2E_SHIFT - 1))) >> spec.LOG2E_SHIFT
    return _LUT[y & ((1 << spec.EXP_FRAC_BITS) - 1)] >> (y >> spec.EXP_FRAC_BITS)


def softmax(scores, mask=None) -> np.ndarray:
    """Integer softmax of each row: ``uint8`` probabilities ``p / 256``, same shape as scores."""
    return softmax_parts(scores, mask)["p"].astype(np.uint8)


def softmax_float(scores, mask=None) -> np.ndarray:
    """float64 softmax of ``scores / 256`` over the visible lanes; masked lanes and fully masked
    rows give 0."""
    s, m = _check(scores, mask)
    x = np.where(m, s / float(1 << SCORE_FRAC_BITS), -np.inf)
    top = np.max(x, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    ex = np.where(m, np.exp(x - top), 0.0)
    total = ex.sum(axis=-1, keepdims=True)
    return np.where(total > 0, ex / np.where(total > 0, total, 1.0), 0.0)
