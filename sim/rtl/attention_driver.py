"""Drive ``hw.tile.attention.AttentionBuffer`` in Amaranth's simulator from a command list.

Shared by the RTL tests and the benchmark. Commands are the golden model's
:class:`sim.golden.attention.KV` and :class:`~sim.golden.attention.Query`; a *sequencer*
testbench offers them in order (K/V on ``i_kv``, queries on ``i_q``), a *responder* stands in for
the softmax unit (and, in split-score mode, for the all-reduce), a *collector* takes ``o_out``.
All three use :mod:`sim.rtl.pysim`'s drivers, with seeded random idle/backpressure.

Every transfer is time-stamped with the number of clock edges since the start (the edge that
transferred it), so tests can check latencies cycle by cycle.
"""

from __future__ import annotations

import numpy as np
from amaranth.hdl import Elaboratable, Module, Signal

from sim.golden.attention import KV, Query

from .pysim import run_sim, stream_get, stream_put

__all__ = ["kv_payload", "q_payload", "run_attention"]


def kv_payload(cmd: KV) -> dict:
    return {"data": [int(x) for x in cmd.k] + [int(x) for x in cmd.v], "pos": int(cmd.pos),
            "first": int(cmd.first), "last": 0}


def q_payload(cmd: Query) -> dict:
    return {"data": [int(x) for x in cmd.q], "pos": int(cmd.pos), "mult": int(cmd.mult),
            "shift": int(cmd.shift), "bidir": int(cmd.bidirectional), "split": int(cmd.split),
            "last": int(cmd.last)}


def _lanes(view, count: int) -> np.ndarray:
    return np.array([int(view[i]) for i in range(count)], dtype=np.int64)


class CycleCounter(Elaboratable):
    """A top module around the DUT with a free-running edge counter ``cycles``."""

    def __init__(self, dut):
        self.dut = dut
        self.cycles = Signal(32)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = self.dut
        m.d.sync += self.cycles.eq(self.cycles + 1)
        return m


def run_attention(dut, commands, *, probs_fn, reduced_fn=None, rng=None, idle: float = 0.0,
                  stall: float = 0.0, max_cycles: int = 100_000) -> tuple[list[dict], dict]:
    """Run ``commands`` through ``dut``; return per-query results and the run statistics.

    ``probs_fn(n, scores, mask)`` gives query n's probability row (uint8 [L]); ``reduced_fn(n,
    partial)`` its reduced int32 row in split-score mode. Each result holds ``partial``,
    ``scores``, ``mask``, ``out`` (arrays), ``last`` flags and the edge numbers ``t_q``,
    ``t_partial``, ``t_reduced``, ``t_scores``, ``t_probs``, ``t_out`` of their transfers.
    """
    L, D = dut.length, dut.d_head
    queries = [c for c in commands if isinstance(c, Query)]
    got = [{} for _ in queries]
    top = CycleCounter(dut)
    seeds = rng.integers(0, 2**32, size=3) if rng is not None else [None] * 3
    rngs = [np.random.default_rng(s) if s is not None else None for s in seeds]

    async def sequencer(ctx):
        n = 0
        for cmd in commands:
            if isinstance(cmd, KV):
                await stream_put(ctx, dut.i_kv, kv_payload(cmd), rng=rngs[0], idle=idle)
            else:
                await stream_put(ctx, dut.i_q, q_payload(cmd), rng=rngs[0], idle=idle)
                got[n]["t_q"] = ctx.get(top.cycles)
                n += 1

    async def responder(ctx):
        for n, cmd in enumerate(queries):
            res = got[n]
            if cmd.split:
                p = await stream_get(ctx, dut.o_partial, rng=rngs[1], stall=stall)
                res["t_partial"] = ctx.get(top.cycles)
                res["partial"], res["partial_last"] = _lanes(p.data, L), int(p.last)
                reduced = np.asarray(reduced_fn(n, res["partial"]), dtype=np.int64)
                await stream_put(ctx, dut.i_reduced,
                                 {"data": [int(x) for x in reduced], "last": int(cmd.last)},
                                 rng=rngs[1], idle=idle)
                res["t_reduced"] = ctx.get(top.cycles)
            s = await stream_get(ctx, dut.o_scores, rng=rngs[1], stall=stall)
            res["t_scores"] = ctx.get(top.cycles)
            res["scores"], res["mask"] = _lanes(s.data, L), _lanes(s.mask, L)
            res["scores_last"] = int(s.last)
            probs = np.asarray(probs_fn(n, res["scores"], res["mask"]), dtype=np.int64)
            await stream_put(ctx, dut.i_probs, {"data": [int(x) for x in probs], "last": 0},
                             rng=rngs[1], idle=idle)
            res["t_probs"] = ctx.get(top.cycles)

    async def collector(ctx):
        for n in range(len(queries)):
            o = await stream_get(ctx, dut.o_out, rng=rngs[2], stall=stall)
            got[n]["t_out"] = ctx.get(top.cycles)
            got[n]["out"], got[n]["out_last"] = _lanes(o.data, D), int(o.last)

    stats = run_sim(top, [sequencer, responder, collector], max_cycles=max_cycles)
    return got, stats
