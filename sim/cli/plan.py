"""``npu plan``: capacity, compatibility and predicted speed of a model on N chips, per
strategy (:func:`sim.planner.plan.plan`)."""

from __future__ import annotations

import time

from hw.spec.topology import Topology

from ..compiler.decode import DECODE_STRATEGIES, GRID_STRATEGIES
from ..errors import EXIT_OK, BadInput
from ..planner.decode import generate_table, grid_min_chips, plan_generate
from ..planner.plan import longest_context, plan, plan_chip_counts
from ..planner.training import plan_training, training_table
from ..strategies import NAMES
from ..strategies.base import parse_grid
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
    p.add_argument("--generate", type=int, metavar="N",
                   help="plan greedy generation of N tokens (single, head, pipeline, data, "
                        "hidden; head+pipeline with --grid AxB or --min-chips): time to first "
                        "token, step cycles, tokens/s, KV bytes, the longest prompt and "
                        "largest batch that fit")
    p.add_argument("--grid", metavar="AxB",
                   help="with --generate and a 2-D strategy: A chips of its first part, B of "
                        "its second")
    p.add_argument("--context", type=int, metavar="P",
                   help="with --generate: the prompt's tokens (default: seq_len // 2)")
    p.add_argument("--batch", type=int, default=1,
                   help="with --generate: sequences decoding together (default 1)")
    p.add_argument("--training", action="store_true",
                   help="the per-step gradient all-reduce of training (int32, one per "
                        "parameter) over every chip of --chips N or --topology, with the 1-D "
                        "and 2-D algorithms")
    p.add_argument("--longest-context", action="store_true",
                   help="with --chips N: per strategy the longest seq_len that fits N chips "
                        "(max_seq_len, the K/V ring and its passes, every chip's bytes) and "
                        "the limit one more token breaks")
    p.add_argument("--json")
    p.set_defaults(run=run)


def _run_generate(args, npu, model) -> int:
    # --strategy all plans the 1-D strategies; a grid is planned when named (its A x B from
    # --grid, or head+pipeline's fewest chips).
    planned = tuple(s for s in DECODE_STRATEGIES if s not in GRID_STRATEGIES)
    if args.strategy != "all" and args.strategy not in DECODE_STRATEGIES:
        raise BadInput(f"--generate plans strategy {', '.join(DECODE_STRATEGIES)}, not "
                       f"{args.strategy}")
    prompt = args.context if args.context is not None else max(1, model.seq_len // 2)
    kw = {"generate": args.generate, "prompt_len": prompt, "batch": args.batch}
    if args.strategy in GRID_STRATEGIES:
        return _run_generate_grid(args, npu, model, kw)
    if args.grid is not None:
        raise BadInput(f"--grid applies to {', '.join(GRID_STRATEGIES)}, not {args.strategy}")
    # The most chips each strategy can use: a head, a layer, a sequence, a word of d_model
    # per chip.
    # Split-KV decode (sequence): 2 positions of the context a chip at least.
    most = {"single": 1, "head": model.n_heads, "pipeline": model.n_layers,
            "data": args.batch, "hidden": -(-model.d_model // npu.array_size),
            "sequence": max(2, (prompt + args.generate - 1) // 2)}
    plans = []
    for name in planned if args.strategy == "all" else (args.strategy,):
        if args.chips:
            if (args.chips == 1) != (name == "single") or args.chips > most[name]:
                continue
            plans.append(plan_generate(npu, model, strategy=name, chips=args.chips, **kw))
            continue
        last = None         # --min-chips: the fewest chips that fit
        for chips in range(1 if name == "single" else 2, most[name] + 1):
            last = plan_generate(npu, model, strategy=name, chips=chips, search=False, **kw)
            if last.fits:
                last = plan_generate(npu, model, strategy=name, chips=chips, **kw)
                break
        if last is not None:
            plans.append(last)
    if not plans:
        raise BadInput(f"--generate with --strategy {args.strategy} and --chips {args.chips}: "
                       "nothing to plan (single runs on 1 chip; head on 2 to n_heads, pipeline "
                       "on 2 to n_layers, data on 2 to --batch, hidden on 2 to d_model's "
                       "words, sequence on 2 to half the context's tokens)")
    if args.json:
        write_json(args.json, {"generate": [p.to_json() for p in plans]})
    print(generate_table(plans))
    return EXIT_OK


def _run_generate_grid(args, npu, model, kw) -> int:
    if args.grid is not None:
        try:
            grid = parse_grid(args.grid)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        if args.chips is not None and args.chips != grid[0] * grid[1]:
            raise BadInput(f"--chips {args.chips} is not the {grid[0]} x {grid[1]} chips of "
                           f"--grid {args.grid}")
        plan_ = plan_generate(npu, model, strategy=args.strategy, chips=grid[0] * grid[1],
                              grid=grid, **kw)
    elif args.min_chips and args.strategy == "head+pipeline":
        plan_ = grid_min_chips(npu, model, **kw)
    else:
        raise BadInput(f"--generate --strategy {args.strategy} needs --grid AxB"
                       + (" or --min-chips" if args.strategy == "head+pipeline" else ""))
    if args.json:
        write_json(args.json, {"generate": [plan_.to_json()]})
    print(generate_table([plan_]))
    return EXIT_OK


def run(args) -> int:
    npu = load_config(args, "npu")
    model = load_config(args, "model")
    if args.generate is not None:
        if args.topology is not None or args.up_to is not None:
            raise BadInput("npu plan: --generate plans a ring of --chips (or --min-chips), "
                           "without --topology or --up-to")
        if args.chips is None and not args.min_chips and args.grid is None:
            raise BadInput("npu plan: --generate needs --chips N, --grid AxB or --min-chips")
        return _run_generate(args, npu, model)
    for opt in ("context", "grid"):
        if getattr(args, opt) is not None:
            raise BadInput(f"--{opt} applies to --generate only")
    if args.batch != 1:
        raise BadInput("--batch applies to --generate only")
    npu, chips = system_of(args, npu, args.chips)
    if args.longest_context:
        return _longest(args, npu, model, chips)
    if args.training:
        if chips is None:
            raise BadInput("npu plan: --training needs --chips N or --topology N or XxY")
        topo = npu.topology or Topology.ring(chips)
        plans = plan_training(npu, model, topo)
        if args.json:
            write_json(args.json, {"npu": npu.name, "model": model.name,
                                   "training": [p.to_json() for p in plans]})
        print(training_table(plans))
        return EXIT_OK
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


def _longest(args, npu, model, chips) -> int:
    if chips is None or args.min_chips or args.up_to is not None:
        raise BadInput("npu plan: --longest-context needs --chips N (or --topology N)")
    start = time.perf_counter()
    found = longest_context(npu, model, chips, strategy=args.strategy)
    wall = time.perf_counter() - start
    lines = [f"npu plan: the longest context of {model.name} on {chips} {npu.name} chips"]
    for lc in found:
        name = lc.strategy + (f" {lc.grid}" if lc.grid else "")
        why = lc.beyond[0].message if lc.beyond else "the 16-bit positions' limit"
        lines.append(f"  {name}: {lc.tokens:,} tokens" if lc.tokens else f"  {name}: none")
        lines.append(f"    {'beyond' if lc.tokens else 'because'}: {why}")
    lines.append(f"  searched in {wall:.2f} s")
    if args.json:
        write_json(args.json, {"npu": npu.name, "model": model.name, "chips": chips,
                               "longest_context": [lc.to_json() for lc in found],
                               "wall_s": wall})
    print("\n".join(lines))
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
