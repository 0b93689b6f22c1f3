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

On the tiny preset the scratchpad's port moves as many bytes a cycle as a link (N = B = 4): a
reduce-scatter, which reads all n of its blocks while it sends n - 1, is bound by the port at
n / (n - 1) of its links' time, and so is the 2-D all-reduce's first phase (1.15 of its bound
at 64 KiB). The same points with links of 2 bytes a cycle (the port twice the link) show the
algorithm against its bound where the links bound it. About 2.5 minutes in all; quick mode
measures 4 B and 4 KiB on the tiny preset.
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


def point(nbytes: int, rng, npu=None, label: str = "tiny") -> list[dict]:
    npu = npu or npu_preset("tiny")
    torus = dataclasses.replace(npu, topology=Topology((4, 4)))
    length = nbytes // 4
    two = run_collective(torus, kind="all_reduce", chips=16, x=_buffers(16, length, rng),
                         backend="iss")
    one = run_collective(npu, kind="all_reduce", chips=16, x=_buffers(16, length, rng),
                         backend="iss")
    for report in (two, one):
        if not report.golden_match:
            raise RuntimeError(f"{nbytes} B: {report.summary()}")
    b, a = npu.link_bytes_per_cycle, npu.link_latency_cycles
    ring_bound = ring_bound_cycles("all_reduce", nbytes, 16, b, a)
    where = f"{label}, B={b} a={a}"
    return [
        {"bench": f"2-D all_reduce 4x4 M={nbytes}B ({two.algorithm}; {where})",
         "value": two.cycles, "unit": "cycles", "ref": two.bound_cycles,
         "ratio": two.cycles / two.bound_cycles,
         "note": "ref: the algorithm's phases, sum of steps*(ceil(M/(nB))+a); cycle model"},
        {"bench": f"1-D all_reduce ring of 16 M={nbytes}B ({where})", "value": one.cycles,
         "unit": "cycles", "ref": ring_bound, "ratio": one.cycles / ring_bound,
         "note": "ref 2(N-1)*(ceil(M/(N*B))+a); cycle model"},
        {"bench": f"2-D / 1-D all_reduce 16 chips M={nbytes}B ({where})", "value": two.cycles,
         "unit": "cycles", "ref": one.cycles, "ratio": two.cycles / one.cycles,
         "note": "the same chips: a 4x4 torus against a ring"},
    ]


def run(quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for nbytes in (4, 4096) if quick else SIZES:
        rows += point(nbytes, rng)
    if not quick:
        # Links half the scratchpad's port: the reduce-scatters and all-gathers are no longer
        # bound by the port (N bytes a cycle) but by the links.
        narrow = dataclasses.replace(npu_preset("tiny"), link_bytes_per_cycle=2)
        for nbytes in (4, 4096, 65536):
            rows += point(nbytes, rng, narrow, "tiny, 2-byte links")
    return rows
