"""``npu plan``: capacity, compatibility and predicted speed of a model on N chips, per
strategy (:func:`sim.planner.plan.plan`)."""

from __future__ import annotations

import time

from ..errors import EXIT_OK, BadInput
from ..planner.plan import plan, plan_chip_counts
from ..strategies import NAMES
from .common import add_topology, load_config, positive, system_of, write_json

__all__ = ["add_parser", "run"]


def add_parser(sub):
    p = sub.add_parser("plan", help="check capacity and compatibility per strategy, predict "
                                    "cycles")
    p.add_argument("--npu", required=True)
    p.add_argument("--model", required=True)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--chips", type=positive)
    group.add_argument("--min-chips", action="store_true",
                       help="plan each strategy on the fewest chips that fit")
    group.add_argument("--up-to", type=positive, metavar="N",
                       help="plan every chip count 1..N (each 2-D grid on the torus of its "
                            "shape) and list the counts that fit")
    add_topology(p)
    p.add_argument("--strategy", default="all", choices=("all",) + NAMES)
    p.add_argument("--json")
    p.set_defaults(run=run)


def run(args) -> int:
    npu = load_config(args, "npu")
    model = load_config(args, "model")
    npu, chips = system_of(args, npu, args.chips)
    if args.up_to is not None:
        return _up_to(args, npu, model)
    if args.min_chips and npu.topology is not None:
        raise BadInput("npu plan: --min-chips searches the chip counts itself (each 2-D grid "
                       "on a torus of its shape): give it without --topology")
    if chips is None and not args.min_chips:
        raise BadInput("npu plan: give --chips N, --topology N or XxY, or --min-chips")
    report = plan(npu, model, chips=chips, min_chips=args.min_chips,
                  strategy=args.strategy)
    if args.json:
        write_json(args.json, report.to_json())
    print(report.table())
    return EXIT_OK


def _up_to(args, npu, model) -> int:
    if npu.topology is not None:
        raise BadInput("npu plan: --up-to plans each count on its own ring or torus: give it "
                       "without --topology")
    start = time.perf_counter()
    reports = plan_chip_counts(npu, model, range(1, args.up_to + 1), strategy=args.strategy)
    wall = time.perf_counter() - start
    fitting = [r.best for r in reports if r.best is not None]
    lines = [f"npu plan: {model.name} on {npu.name}, every chip count 1..{args.up_to}, "
             f"strategy {args.strategy}"]
    for p in fitting:
        where = f" on the {p.topology} torus" if p.topology else ""
        speed = "-" if p.latency_ms is None else f"{p.latency_ms:.4g} ms"
        lines.append(f"  {p.chips} chips: {p.strategy}" + (f" {p.grid}" if p.grid else "") +
                     f"{where}, {speed}")
    if fitting:
        timed = [p for p in fitting if p.latency_ms is not None]
        fastest = min(timed, key=lambda p: p.latency_ms) if timed else None
        lines.append(f"  fewest chips that fit: {fitting[0].chips}; fitting counts: "
                     f"{len(fitting)}" + (f"; fastest: {fastest.chips} chips" if fastest
                                          else ""))
    else:
        lines.append(f"  no chip count up to {args.up_to} fits")
    lines.append(f"  planned {args.up_to} chip counts in {wall:.2f} s")
    if args.json:
        write_json(args.json, {"npu": npu.name, "model": model.name, "counts": [
            r.to_json() for r in reports], "wall_s": wall})
    print("\n".join(lines))
    return EXIT_OK
