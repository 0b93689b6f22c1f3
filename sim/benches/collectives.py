"""Ring collectives: cycles vs the step-synchronous ring cost (``docs/formats.md``, benchmarks).

For N = 2, 4, 8 chips and messages of M = 64 B .. 64 KiB (int32 elements, tiny preset: links
of B = 4 bytes per cycle, a = 2 cycles of latency):

- all-reduce cycles / ``2(N-1) * (ceil(M/(N*B)) + a)``;
- reduce-scatter and all-gather cycles / ``(N-1) * (ceil(M/(N*B)) + a)``;
- small-message latency (a one-element all-reduce), and the fpga preset's links (B = 8,
  a = 4) at 4 KiB;
- a bidirectional ring (``link_bidirectional``: the all-reduce is split over both rings),
  against the same unidirectional bound: the bandwidth term halves, so the ratio tends to 0.5.

Points up to 16 KiB (4 KiB in quick mode: only a few small points) are simulated with Amaranth's
simulator (RingTestbed, no stalls). Larger ones use :func:`hw.spec.collective.predicted_cycles`,
the engine's cycle model, which ``tests/hw/test_collective.py`` checks equals the simulated
count exactly; those rows say "model" in their note.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hw.spec import npu_preset
from hw.spec.collective import CollectiveRequest
from hw.spec.timing.collective import ring_bound_cycles, system_cycles
from sim.rtl.ring_runner import simulate_collective

SIZES = (64, 256, 1024, 4096, 16384, 65536)
KINDS = ("all_reduce", "reduce_scatter", "all_gather")


def _request(kind, chips, message_bytes):
    return CollectiveRequest(kind=kind, op="sum", width=32, length=message_bytes // 4,
                             chips=chips)


def _inputs(req, rng):
    if req.kind.name == "ALL_GATHER":
        sizes = [len(b) for b in np.array_split(np.zeros(req.length), req.count)]
        return [rng.integers(-1000, 1000, size=s, dtype=np.int32) for s in sizes]
    return [rng.integers(-1000, 1000, size=req.length, dtype=np.int32)
            for _ in range(req.chips)]


def _point(npu, kind, chips, message_bytes, simulate, rng):
    req = _request(kind, chips, message_bytes)
    b, a = npu.link_bytes_per_cycle, npu.link_latency_cycles
    bound = ring_bound_cycles(req.kind, message_bytes, chips, b, a)
    if simulate:
        run = simulate_collective(npu, req, _inputs(req, rng))
        cycles = run["cycles"]
        note = f"pysim, {run['sim']['cycles_per_s']:.0f} cycles/s"
    else:
        cycles = system_cycles(req, b, a, npu.link_bidirectional)
        note = "model (exact vs pysim in tests)"
    steps = "2(N-1)" if kind == "all_reduce" else "(N-1)"
    ring = ", bidirectional" if npu.link_bidirectional else ""
    return {"bench": f"{kind} N={chips} M={message_bytes}B B={b} a={a}{ring}", "value": cycles,
            "unit": "cycles", "ref": bound, "ratio": cycles / bound,
            "note": f"ref {steps}*(ceil(M/(N*B))+a); {note}"}


def run(quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    tiny = npu_preset("tiny")
    rows = []
    if quick:
        for kind in KINDS:
            for chips, size in ((2, 64), (4, 1024)):
                rows.append(_point(tiny, kind, chips, size, True, rng))
        rows.append(_point(tiny, "all_reduce", 8, 4096, False, rng))
        rows.append(_point(dataclasses.replace(tiny, link_bidirectional=True), "all_reduce", 4,
                           1024, True, rng))
    else:
        for kind in KINDS:
            for chips in (2, 4, 8):
                for size in SIZES:
                    rows.append(_point(tiny, kind, chips, size, size <= 16384, rng))
        fpga_link = dataclasses.replace(tiny, link_bytes_per_cycle=8, link_latency_cycles=4)
        for chips in (2, 4, 8):
            rows.append(_point(fpga_link, "all_reduce", chips, 4096, chips <= 4, rng))
        both = dataclasses.replace(tiny, link_bidirectional=True)
        for chips in (2, 4, 8):
            for size in (4096, 65536):
                rows.append(_point(both, "all_reduce", chips, size, size <= 4096, rng))
    for chips in (2, 4, 8) if not quick else (4,):
        req = CollectiveRequest(kind="all_reduce", op="sum", width=32, length=1, chips=chips)
        run_ = simulate_collective(tiny, req, _inputs(req, rng))
        bound = ring_bound_cycles(req.kind, 4, chips, 4, 2)
        rows.append({"bench": f"all_reduce latency N={chips} M=4B", "value": run_["cycles"],
                     "unit": "cycles", "ref": bound, "ratio": run_["cycles"] / bound,
                     "note": "one int32 element; pysim"})
    return rows
