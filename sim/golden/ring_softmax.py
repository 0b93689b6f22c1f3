"""Exact merge of partial softmaxes over chunks of keys (ring attention with full attention).

The integer softmax (``sim.golden.softmax``, ``hw.spec.softmax``) of a row is **not** a
function of the softmaxes of its chunks: a lane's exponential ``e = LUT[y mod 256] >> (y div
256)`` with ``y = round((M - s) log2 e)`` depends on the row maximum M through a rounded product
and a truncating shift, so the float trick of rescaling a chunk's sum by ``exp(m_chunk - M)``
(online softmax) does not give the row's integers. Three passes over the chunks do, because
each merge is an exact integer operation:

1. ``M = max_c max_c(s)`` over the visible lanes of every chunk (MAX is exact);
2. ``S = sum_c sum_j e_j(M)`` with every chunk's exponentials taken against the global M
   (integer sums; ``e <= 2**15``, so S fits 32 bits for up to 2**16 keys);
3. ``R = 2**(z + 12) // S`` (``z = bitlen(S) - 1``) once, then each chunk's probabilities
   ``p_j = min((e_j R + 2**(z+3)) >> (z + 4), 255)`` and its partial ``sum_j p_j v_j`` in int32,
   summed over the chunks with wrap-around (exact in any order), then requantised to int8.

The result equals ``sim.golden.layer.attention_int`` bit for bit (tested). A chip would need
softmax modes it does not have to run this (``docs/architecture.md``, Sequence parallelism):
emit a row's max, take an external max and emit its exponential sum, take both and emit
probabilities, and the attention buffer's raw int32 P.V without the output requantiser.
"""

from __future__ import annotations

import numpy as np

from hw.spec.formats import ACC_BITS, SCORE_BITS

from .matmul import wrap
from .softmax import exponentials, normalise

__all__ = ["chunk_max", "chunk_exp_sum", "chunk_pv", "merged_pv"]

_SCORE_MIN = -(1 << (SCORE_BITS - 1))


def chunk_max(scores, mask) -> np.ndarray:
    """Pass 1, per row: the largest visible score of the chunk (the int16 minimum if none)."""
    s, m = np.asarray(scores, np.int64), np.asarray(mask, bool)
    return np.max(np.where(m, s, _SCORE_MIN), axis=-1, initial=_SCORE_MIN)


def _exp(scores, mask, top):
    s, m = np.asarray(scores, np.int64), np.asarray(mask, bool)
    return exponentials(s, m, np.asarray(top, np.int64)[..., None])


def chunk_exp_sum(scores, mask, top) -> np.ndarray:
    """Pass 2, per row: the sum of the chunk's exponentials against the global max ``top``."""
    return _exp(scores, mask, top).sum(axis=-1)


def chunk_pv(scores, mask, top, total, values) -> np.ndarray:
    """Pass 3: the chunk's int32 ``sum_j p_j v_j`` per row, with the probabilities of the global
    max ``top`` and exponential sum ``total``; ``values`` [keys, D] int8."""
    e = _exp(scores, mask, top)
    p = normalise(e, np.asarray(total, np.int64)[..., None])["p"]
    p = np.where(np.asarray(mask, bool), p, 0)
    return wrap(p @ np.asarray(values, np.int64), ACC_BITS)


def merged_pv(scores, mask, values, bounds) -> np.ndarray:
    """The three passes over the key chunks ``bounds`` (``[(start, stop), ...]`` covering the
    columns of ``scores`` [rows, keys]): the int32 P.V of the whole rows, exactly."""
    cut = [(slice(None), slice(a, b)) for a, b in bounds]
    scores, mask = np.asarray(scores, np.int64), np.asarray(mask, bool)
    top = np.max([chunk_max(scores[c], mask[c]) for c in cut], axis=0)
    total = np.sum([chunk_exp_sum(scores[c], mask[c], top) for c in cut], axis=0)
    acc = sum(chunk_pv(scores[c], mask[c], top, total, values[a:b])
              for c, (a, b) in zip(cut, bounds, strict=True))
    return wrap(acc, ACC_BITS)
