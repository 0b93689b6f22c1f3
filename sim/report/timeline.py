"""What each chip's units did over time: busy intervals from the chips' trace buffers.

A chip's trace (``hw.tile.trace``) lists every change of its busy vector; :func:`intervals`
turns it into, per unit, the ``[start, end)`` cycles of each busy interval. A unit's k-th
interval is its k-th launch, so the intervals line up with a program's launches: the
collectives and transfers of a report, the bubble of a pipeline, the timeline plot and the
Chrome trace.
"""

from __future__ import annotations

from hw.spec.isa import UNIT_NAMES

__all__ = ["intervals", "busy_union", "COMPUTE_UNITS", "COMM_UNITS"]

COMPUTE_UNITS = ("matmul", "attention", "vector")
COMM_UNITS = ("collective", "send", "recv")


def intervals(entries, end: int) -> dict[str, list[tuple[int, int]]]:
    """Per unit name, its busy intervals ``[(start, end)]`` in cycles from ``start``.

    ``entries`` are ``(cycle, busy)`` pairs; the busy vector holds from its cycle to the next
    entry's; ``end`` closes an interval still open at the last entry.
    """
    out = {name: [] for name in UNIT_NAMES}
    opened = {}
    for cycle, busy in list(entries) + [(end, 0)]:
        for u, name in enumerate(UNIT_NAMES):
            on = busy >> u & 1
            if on and name not in opened:
                opened[name] = cycle
            elif not on and name in opened:
                out[name].append((opened.pop(name), cycle))
    return out


def busy_union(spans: dict[str, list[tuple[int, int]]], units) -> int:
    """Cycles in which any of ``units`` is busy."""
    edges = sorted((s, e) for u in units for s, e in spans[u])
    total, at = 0, None
    for s, e in edges:
        if at is None or s > at:
            total += e - s
            at = e
        elif e > at:
            total += e - at
            at = e
    return total
