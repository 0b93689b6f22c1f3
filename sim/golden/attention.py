"""Golden model of the attention buffer (``hw.tile.attention``): bit-exact NumPy.

The buffer holds the K and V vectors of the last ``window`` (W) tokens written to it, in a ring
of W slots filled in write order: the first token after a restart (``first``) goes to slot 0,
the next to slot 1, ..., token W to slot 0 again, overwriting the oldest. Every slot remembers
the absolute position of its token. **Lane j of a score row is slot j**; lanes ``W .. L-1``
(when the softmax length L exceeds W) are always masked.

For a query at absolute position ``i``:

- a slot is *held* when it has been written since the last restart (and not overwritten, which
  the ring guarantees: a slot always holds the newest token written to it);
- **causal window**: lane j is visible when its slot is held and ``i - W < pos_j <= i``;
- **bidirectional**: lane j is visible when its slot is held (whatever its position);
- the raw score is ``wrap32(q . k_j)`` (int8 x int8 summed in int32 with wrap-around);
- the scaled score is ``requant(raw, mult, shift, 16)`` (``sim.golden.matmul.requant``: the
  compiler folds 1/sqrt(d_head) and the Q/K scales into ``(mult, shift)``) in the softmax input
  format (``SCORE_BITS``-bit, ``SCORE_FRAC_BITS`` fraction bits); **masked lanes carry 0**.

P.V: ``out[d] = wrap32(sum_j p'_j * v_j[d])`` with ``p'_j = p_j`` (unsigned 8-bit, p/256) on
visible lanes and **0 on masked lanes** (whatever the softmax sent there).

Positions are absolute token indices (unsigned ``POS_BITS`` bits): a chip whose chunk starts at
``base`` writes its neighbour's halo tokens (positions below ``base``) first, then its own.

Split-score mode (d_head split across chips): each chip computes the raw partial score rows
over its shard of Q and K lanes; the int32 sum of the shards' rows (wrapping) equals the unsplit
raw row bit for bit, and the scaling/masking is then applied to that sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw.spec.attention import POS_BITS
from hw.spec.formats import ACC_BITS, PROB_BITS, SCORE_BITS

from .matmul import requant, wrap

__all__ = ["KVRing", "KV", "Query", "visible_mask", "score_row", "prob_weighted_sum",
           "split_partials", "shard_sizes", "run_sequence", "windowed_attention_reference"]


def visible_mask(slot_pos, held, qpos: int, window: int, *, bidirectional: bool):
    """Visibility of each slot for a query at ``qpos`` (boolean array like ``held``)."""
    slot_pos = np.asarray(slot_pos, dtype=np.int64)
    held = np.asarray(held, dtype=bool)
    if bidirectional:
        return held.copy()
    diff = qpos - slot_pos
    return held & (diff >= 0) & (diff < window)


def score_row(raw, mask, mult: int, shift: int) -> np.ndarray:
    """Scale raw int32 scores to the softmax format; masked lanes are 0."""
    scores = requant(wrap(raw), mult, shift, SCORE_BITS)
    return np.where(np.asarray(mask, dtype=bool), scores, 0).astype(np.int64)


def prob_weighted_sum(probs, mask, values) -> np.ndarray:
    """``wrap32(sum_j p_j v_j)`` over visible lanes; ``probs`` [L] uint8, ``values`` [L, D] int8."""
    probs = np.asarray(probs, dtype=np.int64)
    if probs.size and (probs.min() < 0 or probs.max() >= 1 << PROB_BITS):
        raise ValueError(f"probabilities must be unsigned {PROB_BITS}-bit")
    p = np.where(np.asarray(mask, dtype=bool), probs, 0)
    return wrap(p @ np.asarray(values, dtype=np.int64), ACC_BITS)


def shard_sizes(d_head: int, shards: int) -> list[int]:
    """Split ``d_head`` lanes like ``numpy.array_split`` (the first ones one lane longer)."""
    return [len(a) for a in np.array_split(np.arange(d_head), shards)]


def split_partials(q, keys, shards: int) -> list[np.ndarray]:
    """Raw partial score rows of each shard of the d_head lanes (``q`` [D], ``keys`` [n, D])."""
    q = np.asarray(q, dtype=np.int64)
    keys = np.asarray(keys, dtype=np.int64)
    out, start = [], 0
    for size in shard_sizes(q.shape[0], shards):
        out.append(wrap(keys[:, start:start + size] @ q[start:start + size], ACC_BITS))
        start += size
    return out


def _check_int8(x, name, d_head):
    x = np.asarray(x)
    if x.shape != (d_head,):
        raise ValueError(f"{name} must have shape ({d_head},), not {x.shape}")
    if x.min() < -128 or x.max() > 127:
        raise ValueError(f"{name} has values outside int8: {x.min()}..{x.max()}")


class KVRing:
    """The ring of W K/V slots with their absolute positions (see the module docstring)."""

    def __init__(self, *, window: int, d_head: int, length: int):
        if length < window:
            raise ValueError(f"length={length} must be >= window={window}")
        self.window, self.d_head, self.length = window, d_head, length
        self.keys = np.zeros((length, d_head), dtype=np.int64)
        self.values = np.zeros((length, d_head), dtype=np.int64)
        self.pos = np.zeros(length, dtype=np.int64)
        self.held = np.zeros(length, dtype=bool)
        self.wptr = 0

    def write(self, k, v, pos: int, *, first: bool = False):
        """Write one token; ``first`` restarts the ring (every other slot is dropped)."""
        if not 0 <= pos < 1 << POS_BITS:
            raise ValueError(f"position {pos} does not fit {POS_BITS} bits")
        _check_int8(k, "k", self.d_head)
        _check_int8(v, "v", self.d_head)
        if first:
            self.held[:] = False
            self.wptr = 0
        j = self.wptr
        self.keys[j], self.values[j], self.pos[j], self.held[j] = k, v, pos, True
        self.wptr = (j + 1) % self.window

    def mask(self, qpos: int, *, bidirectional: bool = False) -> np.ndarray:
        return visible_mask(self.pos, self.held, qpos, self.window, bidirectional=bidirectional)

    def raw_scores(self, q) -> np.ndarray:
        """``wrap32(q . k_j)`` for every lane (0 on lanes >= W, which hold nothing)."""
        _check_int8(q, "q", self.d_head)
        return wrap(self.keys @ np.asarray(q, dtype=np.int64), ACC_BITS)

    def pv(self, probs, mask) -> np.ndarray:
        return prob_weighted_sum(probs, mask, self.values)


@dataclass(frozen=True)
class Query:
    """One query of a command sequence (``q`` is int8 [D])."""

    q: np.ndarray
    pos: int
    mult: int
    shift: int
    bidirectional: bool = False
    split: bool = False
    last: bool = False


@dataclass(frozen=True)
class KV:
    """One K/V write of a command sequence."""

    k: np.ndarray
    v: np.ndarray
    pos: int
    first: bool = False


def run_sequence(commands, *, window: int, d_head: int, length: int, probs_fn,
                 reduced_fn=None) -> list[dict]:
    """Expected outputs of the unit for a list of :class:`KV` and :class:`Query` commands.

    ``probs_fn(n, scores, mask)`` returns the uint8 probability row of query ``n``;
    ``reduced_fn(n, partial)`` the reduced int32 row of a split query (default: the partial
    itself, i.e. one shard). Returns one dict per query: ``partial`` (split queries), ``reduced``
    (split), ``scores``, ``mask``, ``probs`` and ``out``.
    """
    ring = KVRing(window=window, d_head=d_head, length=length)
    results = []
    for cmd in commands:
        if isinstance(cmd, KV):
            ring.write(cmd.k, cmd.v, cmd.pos, first=cmd.first)
            continue
        n = len(results)
        res = {}
        raw = ring.raw_scores(cmd.q)
        mask = ring.mask(cmd.pos, bidirectional=cmd.bidirectional)
        if cmd.split:
            res["partial"] = raw
            raw = wrap(np.asarray(reduced_fn(n, raw) if reduced_fn else raw), ACC_BITS)
            res["reduced"] = raw
        res["scores"] = score_row(raw, mask, cmd.mult, cmd.shift)
        res["mask"] = mask.astype(np.int64)
        res["probs"] = np.asarray(probs_fn(n, res["scores"], res["mask"]), dtype=np.int64)
        res["out"] = ring.pv(res["probs"], mask)
        res["last"] = cmd.last
        results.append(res)
    return results


def windowed_attention_reference(q, k, v, *, window: int, causal: bool = True,
                                 scale: float | None = None) -> np.ndarray:
    """Float64 windowed attention: ``softmax(q k^T * scale + mask) v`` (documentation reference).

    ``q`` [n, D], ``k`` and ``v`` [n, D]; query i sees keys j with ``i - window < j <= i``
    (causal) or ``|i - j| < window`` (not causal). ``scale`` defaults to 1/sqrt(D).
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    n, d = q.shape
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    i, j = np.arange(n)[:, None], np.arange(k.shape[0])[None, :]
    visible = (i - j < window) & (j <= i) if causal else np.abs(i - j) < window
    s = np.where(visible, q @ k.T * scale, -np.inf)
    s -= s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return (e / e.sum(axis=1, keepdims=True)) @ v
