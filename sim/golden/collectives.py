"""Golden definitions of the ring collectives (semantics: :mod:`hw.spec.collective`).

Plain NumPy, independent of the engine's step schedule: a reduction is computed over the group's
rows at once, then split or concatenated. Results are one array per chip (``int32`` or
``int64``), empty for chips outside the group.
"""

from __future__ import annotations

import numpy as np

from hw.spec.collective import CollectiveRequest, Kind, ReduceOp

from .matmul import wrap

__all__ = ["reduce", "all_reduce", "reduce_scatter", "all_gather", "send_recv", "collective"]


def _dtype(width):
    return np.int32 if width == 32 else np.int64


def reduce(rows, op, width: int, divisor: int | None = None) -> np.ndarray:
    """Element-wise reduction of ``rows`` ([n, length]) with ``op`` at ``width`` bits.

    SUM wraps modulo ``2**width``; MAX and MIN are signed; AVG is ``floor(wrap(sum) / n)``
    (``floor(wrap(sum) / divisor)`` when given).
    """
    op = ReduceOp[op.upper()] if isinstance(op, str) else ReduceOp(op)
    rows = np.asarray(rows)
    n = rows.shape[0]
    if op == ReduceOp.MAX:
        return rows.max(axis=0).astype(_dtype(width))
    if op == ReduceOp.MIN:
        return rows.min(axis=0).astype(_dtype(width))
    if width == 32:
        total = wrap(rows.astype(np.int64).sum(axis=0), 32)
    else:
        # uint64 arithmetic wraps modulo 2**64 without warnings; reinterpret as signed.
        total = rows.astype(np.int64).view(np.uint64).sum(axis=0, dtype=np.uint64).view(np.int64)
    if op == ReduceOp.AVG:
        total = np.floor_divide(total, n if divisor is None else divisor)
    return np.asarray(total).astype(_dtype(width))


def _member_rows(req: CollectiveRequest, inputs):
    return np.stack([np.asarray(inputs[c]) for c in req.members])


def all_reduce(req: CollectiveRequest, inputs) -> list[np.ndarray]:
    total = reduce(_member_rows(req, inputs), req.op, req.width, req.divisor)
    return [total.copy() if req.position(c) is not None else np.zeros(0, _dtype(req.width))
            for c in range(req.chips)]


def reduce_scatter(req: CollectiveRequest, inputs) -> list[np.ndarray]:
    total = reduce(_member_rows(req, inputs), req.op, req.width, req.divisor)
    blocks = np.array_split(total, req.count)
    out = []
    for c in range(req.chips):
        p = req.position(c)
        out.append(blocks[p] if p is not None else np.zeros(0, _dtype(req.width)))
    return out


def all_gather(req: CollectiveRequest, inputs) -> list[np.ndarray]:
    """Member ``p`` contributes ``inputs[chip]`` (block ``p``, of ``array_split`` length)."""
    sizes = [b.size for b in np.array_split(np.zeros(req.length), req.count)]
    parts = []
    for p, c in enumerate(req.members):
        part = np.asarray(inputs[c]).astype(_dtype(req.width))
        if part.shape != (sizes[p],):
            raise ValueError(f"chip {c} contributes {part.shape[0] if part.ndim else 0} "
                             f"elements; block {p} of {req.length} over {req.count} chips "
                             f"has {sizes[p]}")
        parts.append(part)
    total = np.concatenate(parts)
    return [total.copy() if req.position(c) is not None else np.zeros(0, _dtype(req.width))
            for c in range(req.chips)]


def send_recv(req: CollectiveRequest, inputs) -> list[np.ndarray]:
    sender, receiver = req.members
    out = [np.zeros(0, _dtype(req.width)) for _ in range(req.chips)]
    out[receiver] = np.asarray(inputs[sender])[:req.length].astype(_dtype(req.width))
    return out


def collective(req: CollectiveRequest, inputs) -> list[np.ndarray]:
    """Every chip's result of ``req`` given each chip's local vector ``inputs[chip]``."""
    return {Kind.ALL_REDUCE: all_reduce, Kind.REDUCE_SCATTER: reduce_scatter,
            Kind.ALL_GATHER: all_gather, Kind.SEND_RECV: send_recv}[req.kind](req, inputs)
