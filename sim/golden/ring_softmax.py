"""Partial softmax over chunks of keys and the exact merge of partial results (long context).

A query row whose keys do not fit one K/V ring is computed chunk by chunk (ring attention across
chips, passes over K/V chunks on one chip, split-KV decode). Each chunk gives a **state**
``(m, l, o)``: the chunk's largest visible score ``m`` (int16), the sum ``l`` of its
unnormalised 8-bit probabilities ``u`` (the softmax unit's partial mode, relative to ``m``) and
``o = sum_j u_j v_j`` (int32, the attention buffer's P.V). States merge as the online softmax
does, in integers (``hw.spec.softmax``, State and merge)::

    m = max(m_a, m_b);  fa, fb = exp factors of m_a - m, m_b - m (Q0.15, 1.0 for the larger)
    l = scale(l_a, fa) + scale(l_b, fb);  o = wrap32(scale(o_a, fa) + scale(o_b, fb))

and the last state is normalised, ``acc = o * 256 / l`` with one reciprocal per row
(:func:`normalise_state`), then requantised to int8 like a P.V. The side with the larger
maximum keeps its integers exactly and the empty state (no visible key) is the identity, but
the merge rounds the other side, so it is not associative: the order of the chunks is part of
the definition (:func:`chunked_attention` takes it), and a chip that merges the same chunks in
the same order gives the same integers whichever chip holds them.

The results are not those of one softmax over the whole row (``sim.golden.softmax``), whose
exponentials depend on the row maximum through a rounded product and a truncating shift; they
approximate the float64 softmax as closely (``tests/sim/golden/test_ring_softmax.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw.spec import softmax as spec
from hw.spec.formats import ACC_BITS, PROB_BITS

from .matmul import requant, wrap
from .softmax import exp_factor, partial_softmax, softmax

__all__ = ["State", "empty_state", "partial_state", "merge", "normalise_state",
           "chunked_attention"]

_ONE = 1 << spec.MERGE_BITS


@dataclass(frozen=True)
class State:
    """Partial results of rows: ``m`` [rows] (int16), ``l`` [rows] and ``o`` [rows, h]
    (int32)."""

    m: np.ndarray
    l: np.ndarray
    o: np.ndarray


def empty_state(rows: int, h: int) -> State:
    """The state of rows that have seen no visible key: the merge's identity."""
    return State(np.full(rows, spec.EMPTY_MAX, np.int64), np.zeros(rows, np.int64),
                 np.zeros((rows, h), np.int64))


def _lanes(scores, mask):
    """Rows of at least two lanes (the softmax's shortest), padded with masked lanes."""
    scores, mask = np.asarray(scores, np.int64), np.asarray(mask, bool)
    pad = max(0, 2 - scores.shape[-1])
    return (np.pad(scores, ((0, 0), (0, pad))), np.pad(mask, ((0, 0), (0, pad))), pad)


def partial_state(scores, mask, values) -> State:
    """The state of one chunk: the softmax's partial mode on ``scores`` [rows, keys] (int16,
    masked lanes 0) and P.V of ``u`` with ``values`` [keys, h] (int8) over the visible lanes."""
    s, m, pad = _lanes(scores, mask)
    part = partial_softmax(s, m)
    u = np.where(m, part["u"], 0)[:, :s.shape[1] - pad]
    return State(part["max"], part["sum"], wrap(u @ np.asarray(values, np.int64), ACC_BITS))


def _scale(x, f):
    return (np.asarray(x, np.int64) * f + (_ONE >> 1)) >> spec.MERGE_BITS


def merge(a: State, b: State) -> State:
    """The exact merge of two states of the same rows (``hw.spec.softmax``). ``m`` is taken
    as its low 16 bits, signed, and ``l`` and ``o`` as int32 (what the hardware reads from a
    state row)."""
    ma, mb = _int16(a.m), _int16(b.m)
    f = exp_factor(np.abs(ma - mb))
    fa = np.where(ma >= mb, _ONE, f)
    fb = np.where(mb >= ma, _ONE, f)
    la, lb, oa, ob = (wrap(np.asarray(x, np.int64), ACC_BITS) for x in (a.l, b.l, a.o, b.o))
    return State(np.maximum(ma, mb), wrap(_scale(la, fa) + _scale(lb, fb), ACC_BITS),
                 wrap(_scale(oa, fa[:, None]) + _scale(ob, fb[:, None]), ACC_BITS))


def _int16(m):
    m = np.asarray(m, np.int64) & 0xFFFF
    return np.where(m >= 1 << 15, m - (1 << 16), m)


def normalise_state(state: State) -> np.ndarray:
    """``acc = wrap32((o * R + 2**(sh-1)) >> sh)`` per row, ``R = 2**(z + NORM_BITS) // l``,
    ``z = bitlen(l) - 1``, ``sh = z + NORM_BITS - PROB_BITS``: ``o / l`` scaled to a P.V of
    probabilities summing to 256; rows with ``l <= 0`` give 0."""
    total = wrap(np.asarray(state.l, np.int64), ACC_BITS)
    pos = total > 0
    z = np.where(pos, np.frexp(np.maximum(total, 1).astype(np.float64))[1] - 1, 0)
    z = z.astype(np.int64)
    recip = np.where(pos, (np.int64(1) << (z + spec.NORM_BITS)) // np.maximum(total, 1), 0)
    sh = z + spec.NORM_BITS - PROB_BITS
    o = wrap(np.asarray(state.o, np.int64), ACC_BITS)
    # |o * R| <= 2**47: exact in int64.
    return wrap((o * recip[:, None] + (np.int64(1) << (sh[:, None] - 1))) >> sh[:, None],
                ACC_BITS)


def chunked_attention(scores, mask, values, order, out_mult: int, out_shift: int) -> np.ndarray:
    """The int8 outputs of rows whose keys are merged chunk by chunk.

    ``scores`` [rows, keys] (int16, already requantised; masked lanes any value), ``mask``
    [rows, keys], ``values`` [keys, h]; ``order`` lists, for runs of rows, the key chunks in
    merge order: ``[(row_start, row_stop, [(key_start, key_stop), ...]), ...]`` covering every
    row once. A run with one chunk is one softmax (what a plain ``ATTN`` computes); with more,
    the partial states are merged in the order given (an ``ATTN`` per chunk with state rows),
    from the empty state, then normalised.
    """
    scores = np.where(np.asarray(mask, bool), np.asarray(scores, np.int64), 0)
    mask = np.asarray(mask, bool)
    values = np.asarray(values, np.int64)
    out = np.full((scores.shape[0], values.shape[1]), np.iinfo(np.int64).min, np.int64)
    for r0, r1, chunks in order:
        rows = slice(r0, r1)
        if len(chunks) == 1:
            (k0, k1), = chunks
            s, m, pad = _lanes(scores[rows, k0:k1], mask[rows, k0:k1])
            probs = np.where(m, softmax(s, m).astype(np.int64), 0)[:, :s.shape[1] - pad]
            acc = wrap(probs @ values[k0:k1], ACC_BITS)
        else:
            state = empty_state(r1 - r0, values.shape[1])
            for k0, k1 in chunks:
                state = merge(state, partial_state(scores[rows, k0:k1], mask[rows, k0:k1],
                                                   values[k0:k1]))
            acc = normalise_state(state)
        out[rows] = requant(acc, out_mult, out_shift, 8)
    if (out == np.iinfo(np.int64).min).any():
        raise ValueError("order does not cover every row")
    return out
