"""Integer golden model of rotary position embedding (RoPE) as the chip computes it.

The chip has no rotation datapath: RoPE is composed from what it has, so every step is an
existing unit's golden function.

- ``rotate_half`` is linear, so it is a signed permutation of the projection's columns:
  the QKV matmul also computes ``q' = h @ (Wq P)`` and ``k' = h @ (Wk P)`` with the integer
  weights, biases and per-column requantisation of Q and K permuted and negated
  (:func:`rotation`). ``q'`` is ``rotate_half(q)`` up to the rounding of a tie.
- The angles are two int8 tables of ``d_head`` lanes per position, ``C = round(127 cos)`` and
  ``S = round(127 sin)`` (:func:`rope_tables`, :data:`ROPE_ONE`), shared by every layer and head.
- The vector unit then runs four commands on Q and K together: ``MUL(q, C)`` and ``MUL(q', S)``
  exactly into int16 (``mult = 2, shift = 1``; ``|q C| <= 128 * 127``), ``ADD`` (the sum is at
  most ``2 * 128 * 127 = 32512``: the int16 clamp never acts) and a per-lane ``REQUANT`` to int8
  at the rotated tensor's scale (Q's lanes and K's lanes each their own ``(mult, shift)``).
"""

from __future__ import annotations

import numpy as np

from .float_model import rope_angles
from .matmul import requant
from .vector import gated_mul, residual_add

__all__ = ["ROPE_ONE", "ROPE_MUL", "rope_tables", "rotation", "rope_int"]

#: The tables' scale: ``C = round(ROPE_ONE * cos)`` (int8, so at most 127).
ROPE_ONE = 127
#: MUL's ``(mult, shift)`` for an exact int16 product.
ROPE_MUL = (2, 1)


def rope_tables(d_head: int, theta: float, positions) -> tuple[np.ndarray, np.ndarray]:
    """The int8 ``(C, S)`` tables [len(positions), d_head] (round half up)."""
    cos, sin = rope_angles(d_head, theta, positions)
    return (np.floor(cos * ROPE_ONE + 0.5).astype(np.int64),
            np.floor(sin * ROPE_ONE + 0.5).astype(np.int64))


def rotation(d_head: int, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """``(source, sign)`` over ``heads * d_head`` columns: ``rotate_half(x)[:, j] = sign[j] *
    x[:, source[j]]`` (per head: ``[x1, x2] -> [-x2, x1]``)."""
    half = d_head // 2
    one = np.concatenate([np.arange(half) + half, np.arange(half)])
    sign1 = np.concatenate([-np.ones(half, np.int64), np.ones(half, np.int64)])
    source = np.concatenate([one + h * d_head for h in range(heads)])
    return source, np.tile(sign1, heads)


def rope_int(x, xr, cos8, sin8, mult, shift) -> np.ndarray:
    """RoPE of the int8 rows ``x`` [rows, heads * d_head] with their rotated copy ``xr``
    (``h @ (W P)``) and the tables of their positions [rows, d_head]: the vector unit's
    ``REQUANT(ADD(MUL(x, C), MUL(xr, S)))``, ``mult``/``shift`` per tensor or per lane."""
    x, xr = np.asarray(x, np.int64), np.asarray(xr, np.int64)
    heads = x.shape[1] // cos8.shape[1]
    c, s = np.tile(cos8, (1, heads)), np.tile(sin8, (1, heads))
    t = residual_add(gated_mul(x, c, *ROPE_MUL, bits=16), gated_mul(xr, s, *ROPE_MUL, bits=16))
    return requant(t, mult, shift, 8)
