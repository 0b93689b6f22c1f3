"""``npu plan``: capacity, compatibility and predicted speed of a model on N chips, per
strategy (:func:`sim.planner.plan.plan`)."""

from __future__ import annotations

from ..errors import EXIT_OK, BadInput
from ..planner.decode import generate_table, plan_generate
from ..planner.plan import plan
from ..strategies import NAMES
from .common import load_config, positive, write_json

__all__ = ["add_parser", "run"]


def add_parser(sub):
    p = sub.add_parser("plan", help="check capacity and compatibility per strategy, predict "
                                    "cycles")
    p.add_argument("--npu", required=True)
    p.add_argument("--model", required=True)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--chips", type=positive)
    group.add_argument("--min-chips", action="store_true",
                       help="plan each strategy on the fewest chips that fit")
    p.add_argument("--strategy", default="all", choices=("all",) + NAMES)
    p.add_argument("--generate", type=int, metavar="N",
                   help="plan greedy generation of N tokens (single and head): time to first "
                        "token, step cycles, tokens/s, KV bytes, the longest prompt and "
                        "largest batch that fit")
    p.add_argument("--context", type=int, metavar="P",
                   help="with --generate: the prompt's tokens (default: seq_len // 2)")
    p.add_argument("--batch", type=int, default=1,
                   help="with --generate: sequences decoding together (default 1)")
    p.add_argument("--json")
    p.set_defaults(run=run)


def _run_generate(args, npu, model) -> int:
    if args.strategy not in ("all", "single", "head"):
        raise BadInput(f"--generate plans strategy single or head, not {args.strategy}")
    prompt = args.context if args.context is not None else max(1, model.seq_len // 2)
    kw = {"generate": args.generate, "prompt_len": prompt, "batch": args.batch}
    plans = []
    if args.strategy in ("all", "single") and args.chips in (None, 1):
        plans.append(plan_generate(npu, model, strategy="single", chips=1, **kw))
    if args.strategy in ("all", "head") and args.chips != 1:
        if args.chips:
            plans.append(plan_generate(npu, model, strategy="head", chips=args.chips, **kw))
        else:       # --min-chips: the fewest chips that fit (a head per chip at most)
            for chips in range(2, model.n_heads + 1):
                p = plan_generate(npu, model, strategy="head", chips=chips, search=False, **kw)
                if p.fits:
                    plans.append(plan_generate(npu, model, strategy="head", chips=chips,
                                               **kw))
                    break
            else:
                plans.append(p)
    if not plans:
        raise BadInput(f"--generate with --strategy {args.strategy} and --chips {args.chips}: "
                       "nothing to plan (single runs on 1 chip, head on 2 or more)")
    if args.json:
        write_json(args.json, {"generate": [p.to_json() for p in plans]})
    print(generate_table(plans))
    return EXIT_OK


def run(args) -> int:
    npu = load_config(args, "npu")
    model = load_config(args, "model")
    if args.generate is not None:
        return _run_generate(args, npu, model)
    for opt in ("context",):
        if getattr(args, opt) is not None:
            raise BadInput(f"--{opt} applies to --generate only")
    if args.batch != 1:
        raise BadInput("--batch applies to --generate only")
    report = plan(npu, model, chips=args.chips, min_chips=args.min_chips,
                  strategy=args.strategy)
    if args.json:
        write_json(args.json, report.to_json())
    print(report.table())
    return EXIT_OK
