"""Run one point of a sweep: a small dispatch per backend, one result row out.

:func:`run_point` is the task every Dask worker (or the in-process loop) runs. It never raises
for a point that cannot run: a point the compiler or the planner refuses (a strategy that does
not divide, a scratchpad too small: :class:`~sim.errors.BadInput` or
:class:`hw.spec.ConfigError`) is a row with ``status = "invalid"``, ``fits = false`` and the
reason in ``error``; any other exception (a watchdog, a tool that failed, a bug) is a row with
``status = "failed"`` and ``error`` naming the exception. Only an interrupt gets through.

Backends (:data:`RUNNERS`):

- ``iss``, ``pysim``: :func:`sim.flows.simulate.simulate` (``reference="none"``: the sweep's own
  one-chip points are the reference);
- ``verilator``: the same, after the hardware configuration's Verilator build is made once for
  every point that shares it (:func:`sim.sweep.builds.shared_build` around
  :data:`VERILATOR_BUILD`);
- ``plan``: the planner (``sim.planner.plan.plan``), no simulation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Any

from hw.spec import ConfigError, NpuConfig
from hw.spec.isa import Insn, Op, encode

from ..errors import BadInput
from ..flows.simulate import simulate
from ..report.timeline import COMM_UNITS, busy_union
from ..rtl.chip_runner import run_chip_verilator
from ..strategies import GRIDS
from .builds import shared_build

try:  # the planner (sim/planner/plan.py, ``npu plan``) is not in every version of the tree yet
    from ..planner import plan as planner
except ImportError as exc:
    if not str(exc).startswith("cannot import name 'plan' from 'sim'"):
        raise                    # the planner is there but broken: say so, do not hide it
    planner = None

__all__ = ["BACKENDS", "RUNNERS", "METRICS", "run_point", "hardware_key", "VERILATOR_BUILD",
           "ready"]

#: The measured columns of a row, with their value when nothing was measured.
METRICS = {
    "status": None, "fits": None, "cycles": None, "latency_ms": None, "tokens_per_s": None,
    "sram_bytes_max": None, "sram_bytes_total": None, "sram_capacity": None,
    "comm_share": None, "golden_match": None, "cosine": None, "samples": None,
    "error": None, "note": None, "wall_s": None,
}


def _timing(point, cycles: int | None, samples: int) -> dict:
    """Latency at the NPU's clock and tokens per second over the point's batch."""
    if not cycles:
        return {"cycles": cycles, "latency_ms": None, "tokens_per_s": None}
    latency_ms = cycles / (point.npu.clock_mhz * 1e3)
    return {"cycles": int(cycles), "latency_ms": latency_ms,
            "tokens_per_s": samples * point.model.seq_len / (latency_ms / 1e3)}


def _simulated(point) -> dict:
    p = point.params
    if p["strategy"] in GRIDS and p["grid"] is None:
        raise BadInput(f"--strategy {p['strategy']} on {p['chips']} chips: no A x B grid of "
                       f"{p['chips']} chips with A, B >= 2")
    report = simulate(point.npu, point.model, strategy=p["strategy"], chips=p["chips"],
                      backend=p["backend"], seed=p["seed"], grid=p["grid"],
                      max_cycles=point.max_cycles, reference="none")
    used = [c.sram_bytes_used for c in report.per_chip]
    comm = None
    if report.spans is not None and report.cycles:
        # Mean over chips of the share of the cycles in which a chip's link units were busy.
        comm = sum(busy_union(span, COMM_UNITS) for span in report.spans) / (
            len(report.spans) * report.cycles)
    return {"status": "ok" if report.golden_match else "mismatch", "fits": True,
            **_timing(point, report.cycles, report.samples),
            "sram_bytes_max": max(used), "sram_bytes_total": sum(used), "comm_share": comm,
            "golden_match": report.golden_match, "cosine": report.cosine,
            "samples": report.samples,
            "note": None if report.cycles is not None else f"{p['backend']} gives no cycles"}


def hardware_key(npu: NpuConfig, chips: int, backend: str) -> str:
    """What a build depends on: the NPU's hardware fields (not its name, description or
    file), the chip count and the backend, hashed. Points with one key share one build."""
    fields = {f.name: getattr(npu, f.name) for f in dataclasses.fields(npu)
              if f.name not in ("name", "description", "path", "topology")}
    if npu.topology is not None:
        fields["topology"] = npu.topology.to_json()
    text = json.dumps({"npu": fields, "chips": chips, "backend": backend}, sort_keys=True)
    return f"{backend}-{chips}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _cocotb_build(npu: NpuConfig, chips: int, directory) -> dict:
    """Make the Verilator build of one chip of ``npu`` (cocotb's cache, keyed by its
    Verilog) by running a program of one HALT on it; ``directory`` is left empty."""
    run_chip_verilator(npu, [encode(Insn(Op.HALT))], {}, [], max_cycles=1000)
    return {"build": "cocotb chip", "chips": chips}


#: ``build(npu, chips, directory) -> dict``: makes the Verilator build a point needs. A
#: backend with its own build step replaces this; :func:`shared_build` makes it once per key.
VERILATOR_BUILD = _cocotb_build


def _verilator(point) -> dict:
    p = point.params
    # The cocotb backend runs one chip; other points are refused by simulate() unbuilt.
    if p["chips"] == 1:
        shared_build(hardware_key(point.npu, p["chips"], "verilator"),
                     lambda d: VERILATOR_BUILD(point.npu, p["chips"], d))
    return _simulated(point)


def _planned(point) -> dict:
    p = point.params
    report = planner.plan(point.npu, point.model, chips=p["chips"], strategy=p["strategy"])
    plan = report.strategies[0]
    totals = [c.total for c in plan.per_chip]
    notes = list(plan.notes)
    if plan.grid:
        notes.insert(0, f"grid {plan.grid} (the planner's best)")
    if plan.timing:
        notes.append(f"timing: {plan.timing}")
    return {"status": "ok" if plan.fits else "invalid", "fits": plan.fits,
            "cycles": plan.predicted_cycles, "latency_ms": plan.latency_ms,
            "tokens_per_s": plan.tokens_per_s,
            "sram_bytes_max": max(totals) if totals else None,
            "sram_bytes_total": sum(totals) if totals else None,
            "samples": point.model.batch,
            "error": "; ".join(str(r) for r in plan.reasons) or None,
            "note": "; ".join(notes) or None}


#: The point runner of each backend: ``runner(point) -> dict`` of :data:`METRICS`.
RUNNERS = {"plan": _planned, "iss": _simulated, "pysim": _simulated, "verilator": _verilator}
BACKENDS = tuple(RUNNERS)


def ready() -> int:
    """Nothing but this module's imports: a worker that runs it has loaded the simulators
    (so that a sweep counts their loading as starting up, not as its first points)."""
    return os.getpid()


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def run_point(point) -> dict[str, Any]:
    """The result row of ``point`` (a :class:`sim.sweep.spec.Point`): its parameters, then
    :data:`METRICS`. Never raises but for an interrupt."""
    start = time.perf_counter()
    try:
        measured = RUNNERS[point.params["backend"]](point)
    except (BadInput, ConfigError) as exc:
        measured = {"status": "invalid", "fits": False, "error": _one_line(exc)}
    except Exception as exc:
        measured = {"status": "failed", "error": _one_line(f"{type(exc).__name__}: {exc}")}
    row = {**point.params, **METRICS, "sram_capacity": point.npu.sram_bytes, **measured}
    row["wall_s"] = time.perf_counter() - start
    return row
