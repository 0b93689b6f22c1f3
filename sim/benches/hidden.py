"""Hidden-dimension parallelism: collectives and bytes per layer, the share of cycles spent
only communicating, the projections' reduce-scatter against all-reduce, speed-up over one chip,
and a model one chip cannot run.

Every point runs the compiled programs on the ISS, timed by its cycle model (equal to the RTL's
cycles, busy counters and traces: ``tests/sim/timing/test_cycle.py``) and, where the model fits
one chip, the same model and batch on one chip in the same run:

- quick: a one-layer model (d_model 16, two heads of 8) on 2 and 4 tiny chips (on 4 chips
  both heads are split over two chips);
- full: a one-layer tiny-shaped model (d_model 32, 4 heads of 8, d_ff 64, 8 tokens) on 2, 3, 4
  and 8 chips with reduce-scatter (on 8 chips every head is split), both reductions on 2 and
  4 chips, and a head of 32 lanes (twice ``d_head_max``) on 2 chips.
"""

from __future__ import annotations

from hw.spec import ModelConfig, npu_preset
from sim.benches.strategies import transfer_rows
from sim.flows.simulate import simulate
from sim.report.timeline import COMM_UNITS, COMPUTE_UNITS, busy_union

_SMALL = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_ff=32, seq_len=4,
                     name="h2x8")
_TINY1 = ModelConfig(n_layers=1, d_model=32, n_heads=4, d_head=8, d_ff=64, seq_len=8,
                     name="tiny-1layer")
_HEAD32 = ModelConfig(n_layers=1, d_model=32, n_heads=1, d_head=32, d_ff=64, seq_len=8,
                      name="head32")


def _shares(report) -> tuple[float, float]:
    """Mean over chips: the share of cycles communicating while computing nothing, and the
    share with some communication unit busy."""
    only, busy = [], []
    for span in report.spans:
        comm = busy_union(span, COMM_UNITS)
        only.append(busy_union(span, COMPUTE_UNITS + COMM_UNITS)
                    - busy_union(span, COMPUTE_UNITS))
        busy.append(comm)
    n = len(report.spans) * report.cycles
    return sum(only) / n, sum(busy) / n


def _rows(label, r) -> list[dict]:
    h = r.hidden
    rows = [{"bench": f"{label}: cycles", "value": r.cycles, "unit": "cycles",
             "ref": r.reference["cycles"] if r.reference else None,
             "ratio": r.cycles / r.reference["cycles"] if r.speedup else None,
             "note": f"one chip = ref; golden match {r.golden_match}"
                     + ("" if r.speedup else f"; {r.reference['source']}"
                        if r.reference else "")}]
    if r.speedup is not None:
        rows.append({"bench": f"{label}: speed-up over one chip", "value": r.speedup,
                     "unit": "x", "ref": r.chips, "ratio": r.scaling_efficiency,
                     "note": "ratio = scaling efficiency (speed-up / chips)"})
    only, busy = _shares(r)
    rows.append({"bench": f"{label}: communication only", "value": only, "unit": "of cycles",
                 "ref": busy, "ratio": only / busy if busy else None,
                 "note": "mean over chips; ref = some communication unit busy"})
    parts = ", ".join(f"{c['what']} {c['launches']}x" for c in h["per_layer"])
    rows.append({"bench": f"{label}: collectives per layer", "value": h["collectives_per_layer"],
                 "unit": "collectives", "ref": 4,
                 "ratio": h["collectives_per_layer"] / 4,
                 "note": f"ref = the seed's {h['seed_estimate']}; {h['coll_launches_per_layer']}"
                         f" COLL launches: {parts}"})
    rows.append({"bench": f"{label}: bytes per layer", "value": h["bytes_per_layer"],
                 "unit": "bytes", "note": "message bytes of the layer's collectives "
                                          f"(projections by {h['reduce']})"})
    return rows + transfer_rows(label, r)


def _compare(label, rs, ar) -> dict:
    return {"bench": f"{label}: projections by all-reduce vs reduce-scatter",
            "value": ar.cycles, "unit": "cycles", "ref": rs.cycles,
            "ratio": ar.cycles / rs.cycles,
            "note": f"whole layer; reduce-scatter moves half the bytes per chip; "
                    f"golden match {ar.golden_match and rs.golden_match}"}


def run(quick: bool):
    tiny = npu_preset("tiny")
    rows = []
    if quick:
        points, compare = [(_SMALL, 2), (_SMALL, 4)], [(_SMALL, 2)]
        extra = []
    else:
        points, compare = [(_TINY1, c) for c in (2, 3, 4, 8)], [(_TINY1, 2), (_TINY1, 4)]
        extra = [(_HEAD32, 2)]
    done = {}
    for cfg, chips in points:
        r = simulate(tiny, cfg, strategy="hidden", chips=chips, backend="iss",
                     reference="same")
        done[(cfg.name, chips)] = r
        rows += _rows(f"hidden, {cfg.name} on {chips} tiny", r)
    for cfg, chips in compare:
        ar = simulate(tiny, cfg, strategy="hidden", chips=chips, backend="iss",
                      reference="none", reduce="all_reduce")
        rows.append(_compare(f"hidden, {cfg.name} on {chips} tiny", done[(cfg.name, chips)],
                             ar))
    for cfg, chips in extra:
        r = simulate(tiny, cfg, strategy="hidden", chips=chips, backend="iss",
                     reference="same")
        rows += _rows(f"hidden, {cfg.name} (d_head 32 > d_head_max 16) on {chips} tiny", r)
    return rows
