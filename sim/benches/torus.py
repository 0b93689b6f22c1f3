"""2-D all-reduce on a 4 x 4 torus against its alpha-beta bound and the 1-D ring of the same 16
chips (``docs/formats.md``, benchmarks).

On the tiny preset (links of B = 4 bytes per cycle, a = 2 cycles; the scratchpad's ports move
N = 4 bytes per cycle), int32 SUM, messages of M = 4 B .. 64 KiB per chip. Both run as programs
on the chips (``npu collective --topology 4x4`` / ``--chips 16 --backend iss``), timed by the
ISS's cycle model (equal to the RTL's, ``tests/sim/rtl/verilator``); the cycles are the
collective's, from its first COLL's launch to the last member's engine idle:

- the 2-D all-reduce (``sim.compiler.torus_collective``: small messages along the rows then the
  columns, large ones in two halves, one along the rows first and one along the columns first,
  both dimensions busy), against the bound of its phases ``sum over phases of steps *
  (ceil(M_phase / (n B)) + a)`` (the two halves' phases at once);
- the 2-D / 1-D ratio, the 1-D all-reduce on a ring of the same 16 chips (in chunks, one
  command) against ``2(N-1)(ceil(M/(N B)) + a)``.

The 64 KiB points take a few minutes of the cycle model each; quick mode measures 4 B and
4 KiB.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hw.spec import npu_preset
from hw.spec.timing.collective import ring_bound_cycles
from hw.spec.topology import Topology
from sim.flows.collective import run_collective

SIZES = (4, 64, 1024, 4096, 16384, 65536)


def _buffers(chips, length, rng):
    return rng.integers(-1000, 1000, size=(chips, length), dtype=np.int32)


def point(nbytes: int, rng) -> list[dict]:
    tiny = npu_preset("tiny")
    torus = dataclasses.replace(tiny, topology=Topology((4, 4)))
    length = nbytes // 4
    two = run_collective(torus, kind="all_reduce", chips=16, x=_buffers(16, length, rng),
                         backend="iss")
    one = run_collective(tiny, kind="all_reduce", chips=16, x=_buffers(16, length, rng),
                         backend="iss")
    for report in (two, one):
        if not report.golden_match:
            raise RuntimeError(f"{nbytes} B: {report.summary()}")
    b, a = tiny.link_bytes_per_cycle, tiny.link_latency_cycles
    ring_bound = ring_bound_cycles("all_reduce", nbytes, 16, b, a)
    return [
        {"bench": f"2-D all_reduce 4x4 M={nbytes}B ({two.algorithm})", "value": two.cycles,
         "unit": "cycles", "ref": two.bound_cycles, "ratio": two.cycles / two.bound_cycles,
         "note": "ref: the algorithm's phases, sum of steps*(ceil(M/(nB))+a); cycle model"},
        {"bench": f"1-D all_reduce ring of 16 M={nbytes}B", "value": one.cycles,
         "unit": "cycles", "ref": ring_bound, "ratio": one.cycles / ring_bound,
         "note": "ref 2(N-1)*(ceil(M/(N*B))+a); cycle model"},
        {"bench": f"2-D / 1-D all_reduce 16 chips M={nbytes}B", "value": two.cycles,
         "unit": "cycles", "ref": one.cycles, "ratio": two.cycles / one.cycles,
         "note": "the same chips: a 4x4 torus against a ring"},
    ]


def run(quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for nbytes in (4, 4096) if quick else SIZES:
        rows += point(nbytes, rng)
    return rows
