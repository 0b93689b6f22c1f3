"""Sweep throughput: points per second of one sweep in this process and on a local Dask cluster
of 2 worker processes (``npu sweep --workers 0`` and ``--workers 2``), and their ratio.

The points are the tiny model on the tiny NPU on the ISS (head, pipeline and data parallelism on
1, 2 and 4 chips, two link widths; quick: 1 and 2 chips, one width), each a few tenths of a
second, so the figure includes Dask's per-task cost. Throughput counts the time from the first
point to the last; the cluster's start (worker processes spawned and their simulators loaded)
is reported on its own row.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..sweep import parse_spec, run_sweep


def run(quick: bool):
    spec = parse_spec({"npu": "tiny", "model": "tiny", "strategy": ["head", "pipeline", "data"],
                       "chips": [1, 2] if quick else [1, 2, 4], "backend": "iss",
                       "npu_overrides": {"link_bytes_per_cycle": [4] if quick else [4, 8]}},
                      "sweep-bench.toml")
    with tempfile.TemporaryDirectory(prefix="npu-sweep-bench-") as tmp:
        alone = run_sweep(spec, Path(tmp) / "in-process", workers=0, plots=False)
        pair = run_sweep(spec, Path(tmp) / "2-workers", workers=2, plots=False)
    n = alone.points
    same = [{k: v for k, v in r.items() if k != "wall_s"} for r in alone.rows] == \
        [{k: v for k, v in r.items() if k != "wall_s"} for r in pair.rows]
    return [
        {"bench": f"sweep throughput, {n} ISS points, in this process",
         "value": alone.points_per_s, "unit": "points/s",
         "note": f"{alone.wall_s:.1f} s (npu sweep --workers 0)"},
        {"bench": f"sweep throughput, {n} ISS points, local cluster of 2 workers",
         "value": pair.points_per_s, "unit": "points/s", "ref": alone.points_per_s,
         "ratio": pair.points_per_s / alone.points_per_s,
         "note": f"ref = in this process; {pair.wall_s:.1f} s in all; same rows: {same}"},
        {"bench": "sweep: local cluster start (2 workers)", "value": pair.startup_s,
         "unit": "s", "note": "spawn the worker processes and load the simulators in them"},
    ]
