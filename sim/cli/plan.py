"""``npu plan``: capacity, compatibility and predicted speed of a model on N chips, per
strategy (:func:`sim.planner.plan.plan`)."""

from __future__ import annotations

from ..errors import EXIT_OK, BadInput
from ..planner.plan import plan
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
    add_topology(p)
    p.add_argument("--strategy", default="all", choices=("all",) + NAMES)
    p.add_argument("--json")
    p.set_defaults(run=run)


def run(args) -> int:
    npu = load_config(args, "npu")
    model = load_config(args, "model")
    npu, chips = system_of(args, npu, args.chips)
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
