"""``npu bench``: run the benchmarks, print a table, write JSON (:func:`sim.api.run_benchmarks`)."""

from __future__ import annotations

from ..errors import EXIT_OK
from ..flows.bench import format_table, run_benchmarks, write_json

__all__ = ["add_parser", "run"]


def add_parser(sub):
    p = sub.add_parser("bench", help="run the benchmarks; write JSON and a table")
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="smaller workloads (smoke test)")
    p.add_argument("--only", action="append", help="run this benchmark module (repeatable)")
    p.set_defaults(run=run)


def run(args) -> int:
    rows = run_benchmarks(quick=args.quick, only=args.only,
                          progress=lambda name, s: print(f"[{name}] {s:.1f} s", flush=True))
    print(format_table(rows))
    if args.json:
        print(f"wrote {write_json(rows, args.json)}")
    return EXIT_OK
