"""Multi-chip strategies: speed-up over one chip, scaling efficiency, pipeline bubbles, the
collectives' and transfers' cycles against the ring bound, communication shares.

Every point simulates the compiled programs cycle by cycle and the same model and batch on one
chip in the same run (the reference). Quick mode runs a small model on 2 chips with Amaranth's
simulator; the full run uses the Verilator backend when its toolchain is there (else pysim, on
smaller points):

- head: 2 and 4 chips, the tiny model and a d_model 128 model (8x8 array);
- pipeline: 4 chips, m = 1..8 microbatches of one sample each: the bubble against
  (p - 1) / (m + p - 1), and throughput (samples per cycle) against one chip;
- per run: the share of each chip's cycles spent only communicating, and every all-reduce and
  send against its ring bound.
"""

from __future__ import annotations

import dataclasses

from hw.spec import ModelConfig, model_preset, npu_preset
from sim.flows.simulate import simulate
from sim.report.timeline import COMM_UNITS, COMPUTE_UNITS, busy_union
from sim.rtl.toolchain import toolchain_problem

_SMALL = ModelConfig(n_layers=4, d_model=16, n_heads=4, d_head=4, d_ff=32, seq_len=4,
                     name="small4")
_D128 = ModelConfig(n_layers=1, d_model=128, n_heads=4, d_head=32, d_ff=512, seq_len=16,
                    name="d128")


def _exposed_comm(report) -> float:
    """Mean share of the cycles in which a chip communicated and computed nothing."""
    if report.spans is None:
        return 0.0
    only = [busy_union(span, COMPUTE_UNITS + COMM_UNITS) - busy_union(span, COMPUTE_UNITS)
            for span in report.spans]
    return sum(only) / len(only) / report.cycles


def _rows(label, r):
    rows = [{"bench": f"{label}: cycles", "value": r.cycles, "unit": "cycles",
             "ref": r.reference["cycles"] if r.reference else None,
             "ratio": (r.cycles / r.reference["cycles"]) if r.speedup else None,
             "note": f"one chip = ref; golden match {r.golden_match}"}]
    if r.speedup is not None:
        rows.append({"bench": f"{label}: speed-up over one chip", "value": r.speedup,
                     "unit": "x", "ref": r.chips, "ratio": r.scaling_efficiency,
                     "note": "ratio = scaling efficiency (speed-up / chips)"})
    rows.append({"bench": f"{label}: communication only", "value": _exposed_comm(r),
                 "unit": "of cycles", "note": "mean over chips: communicating, not computing"})
    return rows + transfer_rows(label, r)


def transfer_rows(label, r) -> list[dict]:
    """A row per kind of collective and for the sends: their cycles against the ring bound."""
    rows = []
    for kind in ("all_reduce", "reduce_scatter", "all_gather", "send"):
        items = [c for c in r.collectives if c["kind"] == kind and "cycles" in c]
        if items:
            cycles = sum(c["cycles"] for c in items)
            bound = sum(c["bound_cycles"] for c in items)
            rows.append({"bench": f"{label}: {len(items)} x {kind} vs ring bound",
                         "value": cycles, "unit": "cycles", "ref": bound,
                         "ratio": cycles / bound,
                         "note": f"{sum(c['bytes'] for c in items):,} bytes"})
    return rows


def run(quick: bool):
    tiny = npu_preset("tiny")
    if quick:
        r = simulate(tiny, _SMALL, strategy="head", chips=2, backend="pysim", reference="same")
        rows = _rows("head, small4 on 2 tiny (pysim)", r)
        r = simulate(tiny, _SMALL, strategy="pipeline", chips=2, backend="pysim", batch=2,
                     reference="same")
        rows += _rows("pipeline, small4 on 2 tiny, m=2 (pysim)", r)
        p = r.pipeline
        rows.append({"bench": "pipeline bubble, 2 stages, m=2", "value": p["bubble_fraction"],
                     "unit": "of cycles", "ref": p["bubble_formula"],
                     "ratio": p["bubble_fraction"] / p["bubble_formula"],
                     "note": "ref = (p-1)/(m+p-1)"})
        return rows
    backend = "verilator" if toolchain_problem() is None else "pysim"
    rows = []
    fpga = dataclasses.replace(npu_preset("fpga"), sram_bytes=512 * 1024, name="fpga-512k")
    for cfg, npu in ((model_preset("tiny"), tiny), (_D128, fpga)):
        for chips in (2, 4):
            r = simulate(npu, cfg, strategy="head", chips=chips, backend=backend,
                         reference="same")
            rows += _rows(f"head, {cfg.name} on {chips} {npu.name} ({backend})", r)
    for m in range(1, 9):
        r = simulate(tiny, model_preset("tiny"), strategy="pipeline", chips=4, batch=m,
                     microbatches=m, backend=backend, reference="same")
        p = r.pipeline
        rows.append({"bench": f"pipeline bubble, 4 stages, m={m} ({backend})",
                     "value": p["bubble_fraction"], "unit": "of cycles",
                     "ref": p["bubble_formula"],
                     "ratio": p["bubble_fraction"] / p["bubble_formula"] if m > 1 else None,
                     "note": f"ref = (p-1)/(m+p-1); difference "
                             f"{100 * (p['bubble_fraction'] - p['bubble_formula']):+.1f} points"})
        if m in (4, 8):
            rows += _rows(f"pipeline, tiny on 4 tiny, m={m} ({backend})", r)
    return rows
