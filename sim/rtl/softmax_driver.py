"""Drive the softmax unit with score rows in Amaranth's simulator; record when rows move.

Used by the RTL tests and the benchmark. Rows are offered on ``i`` and taken from ``o`` either
with seeded random idle/backpressure (:mod:`sim.rtl.pysim` helpers) or with fixed gaps (cycles
with ``valid``/``ready`` low before each row), which the cocotb testbench reproduces exactly.
"""

from __future__ import annotations

import numpy as np

from .pysim import Clock, run_sim, stream_get, stream_put

__all__ = ["row_payload", "simulate_rows"]


def row_payload(scores, mask, last, partial=0) -> dict:
    """The ``i`` payload of one row (``partial``: the unit's partial mode)."""
    return {"data": [int(x) for x in scores], "mask": [int(x) for x in mask], "last": int(last),
            "partial": int(partial)}


def simulate_rows(dut, scores, mask, last=None, *, partial=None, rng=None, idle: float = 0.0,
                  stall: float = 0.0, idle_gaps=None, stall_gaps=None,
                  max_cycles: int = 50_000) -> dict:
    """Stream ``scores``/``mask`` rows ``[N, L]`` through ``dut`` (a ``SoftmaxUnit``).

    ``idle``/``stall`` are probabilities of a random idle/backpressure cycle (drawn from
    ``rng``); ``idle_gaps``/``stall_gaps`` are per-row fixed gaps instead; ``partial`` [N] the
    rows in partial mode. Returns ``{"rows": [N, L] int64, "last": [N], "max": [N], "sum": [N],
    "t_in": [N], "t_out": [N], "sim": run_sim's dict}`` where ``t_in`` and ``t_out`` count
    clock edges up to the one that transferred each row.
    """
    scores = np.asarray(scores)
    n = len(scores)
    last = np.zeros(n, dtype=np.int64) if last is None else np.asarray(last)
    partial = np.zeros(n, dtype=np.int64) if partial is None else np.asarray(partial)
    clock = Clock()
    t_in, t_out, rows, lasts, tops, sums = [], [], [], [], [], []

    async def producer(ctx):
        for r in range(n):
            if idle_gaps is not None and idle_gaps[r]:
                await ctx.tick().repeat(int(idle_gaps[r]))
            await stream_put(ctx, dut.i, row_payload(scores[r], mask[r], last[r], partial[r]),
                             rng=rng, idle=idle)
            t_in.append(clock.cycles)

    async def consumer(ctx):
        for r in range(n):
            if stall_gaps is not None and stall_gaps[r]:
                await ctx.tick().repeat(int(stall_gaps[r]))
            payload = await stream_get(ctx, dut.o, rng=rng, stall=stall)
            rows.append([int(x) for x in payload.data])
            lasts.append(int(payload.last))
            tops.append(int(payload.max))
            sums.append(int(payload.sum))
            t_out.append(clock.cycles)

    stats = run_sim(dut, [producer, consumer], processes=[clock.process], max_cycles=max_cycles)
    return {"rows": np.array(rows, dtype=np.int64).reshape(n, -1), "last": np.array(lasts),
            "max": np.array(tops), "sum": np.array(sums), "t_in": t_in, "t_out": t_out,
            "sim": stats}
