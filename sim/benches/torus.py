"""2-D all-reduce on a 4 x 4 torus against its alpha-beta bound and the 1-D ring of the same 16
chips (``docs/formats.md``, benchmarks).

int32 SUM, messages of M = 4 B .. 64 KiB per chip. Both run as programs on the chips (``npu
collective --topology 4x4`` / ``--chips 16 --backend iss``), timed by the ISS's cycle model
(equal to the RTL's, ``tests/sim/rtl/verilator``); the cycles are the collective's, from its
first COLL's launch to the last member's engine idle:

- the 2-D all-reduce (``sim.compiler.torus_collective``: small messages along the rows then the
  columns, large ones in two halves, one along the rows first and one along the columns first,
  both dimensions busy), against the bound of its phases, each phase its slowest ring's
  pipelined bound ``max(S w + a, S a + w)`` (``hw.spec.timing.collective.
  pipelined_bound_cycles``: S steps, blocks of ``w = ceil(M_phase / (n B))`` cycles, links of
  ``a`` cycles), the two halves' phases at once;
- the 2-D / 1-D ratio, the 1-D all-reduce on a ring of the same 16 chips (in chunks, one
  command; on bidirectional links half the message each way), with its own pipelined bound.

Three chips: the ``lpu-like`` preset, whose scratchpad word (320 B, a port's word a cycle) is
five times its links' 64 B a cycle and whose links take 200 cycles (bidirectional); the
``tiny`` preset with links of 2 B a cycle, half its scratchpad's 4-byte port; and the ``tiny``
preset itself, whose port moves as many bytes a cycle as a link. There a ring reduce-scatter,
which reads all n of its blocks through the collective engine's port while its links carry
n - 1, takes n blocks' time (``n w + 6`` cycles, not ``(n - 1) w``), an all-gather likewise
writes n; the 2-D all-reduce's first and last phases are such, and it stays about 1.15 x its
link bound at 64 KiB. About 3 minutes in all; quick mode measures 4 B and 4 KiB on lpu-like
and on the tiny preset.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hw.spec import npu_preset
from hw.spec.timing.collective import pipelined_bound_cycles
from hw.spec.topology import Topology
from sim.compiler.torus_collective import torus_collective
from sim.flows.collective import run_collective

SIZES = (4, 64, 1024, 4096, 16384, 65536)
#: The chips measured: (label, NPU); the tiny preset's own links last (its port bound).
CHIPS = {"lpu-like": lambda: npu_preset("lpu-like"),
         "tiny, 2-byte links": lambda: dataclasses.replace(npu_preset("tiny"),
                                                           link_bytes_per_cycle=2),
         "tiny": lambda: npu_preset("tiny")}


def _buffers(chips, length, rng):
    return rng.integers(-1000, 1000, size=(chips, length), dtype=np.int32)


def point(nbytes: int, rng, npu=None, label: str = "tiny") -> list[dict]:
    npu = npu or npu_preset("tiny")
    topo = Topology((4, 4))
    torus = dataclasses.replace(npu, topology=topo)
    length = nbytes // 4
    two = run_collective(torus, kind="all_reduce", chips=16, x=_buffers(16, length, rng),
                         backend="iss")
    one = run_collective(npu, kind="all_reduce", chips=16, x=_buffers(16, length, rng),
                         backend="iss")
    for report in (two, one):
        if not report.golden_match:
            raise RuntimeError(f"{nbytes} B: {report.summary()}")
    b, a = npu.link_bytes_per_cycle, npu.link_latency_cycles
    plan = torus_collective("all_reduce", "sum", 32, length, topo, base=0,
                            size=npu.array_size, link_bytes=b)
    two_bound = plan.bound_cycles(torus, pipelined=True)
    one_bound = pipelined_bound_cycles("all_reduce", nbytes, 16, b, a,
                                       2 if npu.link_bidirectional else 1)
    where = f"{label}, B={b} a={a}"
    return [
        {"bench": f"2-D all_reduce 4x4 M={nbytes}B ({two.algorithm}; {where})",
         "value": two.cycles, "unit": "cycles", "ref": two_bound,
         "ratio": two.cycles / two_bound,
         "note": "ref: its phases' pipelined bounds max(Sw+a, Sa+w), added; cycle model"},
        {"bench": f"1-D all_reduce ring of 16 M={nbytes}B ({where})", "value": one.cycles,
         "unit": "cycles", "ref": one_bound, "ratio": one.cycles / one_bound,
         "note": "ref: pipelined bound max(Sw+a, Sa+w), S=30; cycle model"},
        {"bench": f"2-D / 1-D all_reduce 16 chips M={nbytes}B ({where})", "value": two.cycles,
         "unit": "cycles", "ref": one.cycles, "ratio": two.cycles / one.cycles,
         "note": "the same chips: a 4x4 torus against a ring"},
    ]


def run(quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for label, make in CHIPS.items():
        if quick and label == "tiny, 2-byte links":
            continue
        for nbytes in (4, 4096) if quick else SIZES:
            rows += point(nbytes, rng, make(), label)
    return rows
