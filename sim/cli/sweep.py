"""``npu sweep``: run a design-space sweep on Dask (:func:`sim.api.run_sweep`)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import EXIT_MISMATCH, EXIT_OK
from ..sweep import load_spec, run_sweep
from .common import count

__all__ = ["add_parser", "run"]


def add_parser(sub):
    p = sub.add_parser("sweep", help="run a design-space sweep (points crossed from a TOML "
                                     "spec) on a Dask cluster")
    p.add_argument("spec", metavar="SPEC.toml")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="ADDRESS",
                       help="run on an existing Dask cluster (e.g. tcp://host:8786)")
    where.add_argument("--workers", type=count, metavar="N",
                       help="worker processes of the local cluster (default: one per core; "
                            "0 runs the points in this process)")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default build/sweep/<spec name>); points already "
                        "in it are skipped")
    p.add_argument("--retry-failed", action="store_true",
                   help="run again the points whose rows say failed")
    p.set_defaults(run=run)


def run(args) -> int:
    spec = load_spec(args.spec)
    out = Path(args.out) if args.out else Path("build") / "sweep" / Path(args.spec).stem
    result = run_sweep(spec, out, scheduler=args.scheduler, workers=args.workers,
                       progress=sys.stderr.isatty(), retry_failed=args.retry_failed)
    counts = result.counts()
    where = result.cluster
    if not result.computed:
        ran = "(nothing new)"
    elif where["kind"] == "in-process":
        ran = "in this process"
    elif where["kind"] == "local":
        ran = f"on a local cluster of {where['workers']} workers"
    else:
        ran = f"on {where['scheduler']} ({where['workers']} workers)"
    rate = "" if result.points_per_s is None else f", {result.points_per_s:.2f} points/s"
    print(f"npu sweep: {result.points} points: {result.computed} computed {ran}, "
          f"{result.skipped} already in {out}{rate}")
    print("  " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    for row in result.rows[:result.points]:
        if row["status"] in ("failed", "mismatch"):
            what = ", ".join(f"{k}={row[k]}" for k in ("strategy", "chips", "grid", "backend")
                             if row.get(k) is not None)
            print(f"  {row['status']}: {what}: {row['error'] or 'golden mismatch'}")
    print(f"  wrote {', '.join(str(p) for p in result.files.values())}")
    bad = counts["failed"] or counts["mismatch"]
    return EXIT_MISMATCH if bad else EXIT_OK
