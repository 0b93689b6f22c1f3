"""``npu collective``: one collective on a simulated ring or torus
(:func:`sim.api.run_collective`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import EXIT_MISMATCH, EXIT_OK, BadInput
from ..flows.collective import DEFAULT_MAX_CYCLES, run_collective, run_gradients
from .common import add_topology, load_config, positive, system_of, write_json

__all__ = ["add_parser", "run"]


def add_parser(sub):
    p = sub.add_parser("collective", help="run one collective on a simulated ring (its "
                       "engines) or torus (its chips: the 2-D collective)")
    p.add_argument("--kind", choices=["all_reduce", "reduce_scatter", "all_gather"],
                   help="the collective (required unless --model)")
    p.add_argument("--model", help="MODEL.toml: training's gradient all-reduce instead, int32 "
                                   "SUM of one element per parameter, on the chips "
                                   "(--backend, default iss)")
    p.add_argument("--op", default="sum", choices=["sum", "max", "min", "avg"])
    p.add_argument("--chips", type=positive, help="the ring's chips (or --topology N)")
    add_topology(p)
    p.add_argument("--npu", required=True)
    p.add_argument("--width", type=int, default=32, choices=[32, 64])
    p.add_argument("--group", help="FIRST:COUNT, a group of consecutive chips (default: all)")
    p.add_argument("--rect", help="a torus's X0,Y0,WxH: the rectangle of chips (default: all)")
    p.add_argument("--algorithm", default="auto", choices=["auto", "halves", "rows_columns"],
                   help="a torus's all-reduce: both dimensions at once on two halves, or the "
                        "rows then the columns (auto: by the message's size)")
    p.add_argument("--backend", choices=["iss", "pysim", "verilator"],
                   help="on a torus: the chips on iss (default, timed by the cycle model), "
                        "pysim or verilator; on a ring: its engines on the ring testbed "
                        "(pysim, default) or its chips on iss or verilator")
    p.add_argument("--seed", type=int, default=0)
    for opt in ("--input", "--output", "--json"):
        p.add_argument(opt)
    p.add_argument("--max-cycles", type=positive)
    p.set_defaults(run=run)


def _group(text, chips):
    if text is None:
        return 0, chips
    try:
        first, count = (int(part, 0) for part in text.split(":"))
    except ValueError:
        raise BadInput(f"--group {text!r} is not FIRST:COUNT") from None
    return first, count


def _rect(text):
    """``X0,Y0,WxH`` as ``(x0, y0, w, h)``."""
    if text is None:
        return None
    try:
        origin, shape = text.rsplit(",", 1)
        x0, y0 = (int(v) for v in origin.split(","))
        w, h = (int(v) for v in shape.lower().split("x"))
    except ValueError:
        raise BadInput(f"--rect {text!r} is not X0,Y0,WxH (e.g. 0,0,4x2)") from None
    return x0, y0, w, h


def _read_input(path, chips):
    """[chips, length] from an ``.npy``, or an ``.npz`` with ``chip0..chip{N-1}`` of one
    length."""
    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot read --input {path}: {exc}") from None
    if isinstance(x, np.ndarray):
        return x
    with x as npz:
        names = [f"chip{i}" for i in range(chips)]
        missing = [n for n in names if n not in npz.files]
        if missing or len(npz.files) != chips:
            raise BadInput(f"--input {path} must hold arrays {names[0]}..{names[-1]} "
                           f"(has {', '.join(npz.files) or 'nothing'})")
        rows = [npz[n] for n in names]
    for name, row in zip(names, rows, strict=True):
        if row.ndim != 1:
            raise BadInput(f"--input {path}: {name} has shape {row.shape}; expected a vector")
        if row.shape != rows[0].shape:
            raise BadInput(f"--input {path}: length mismatch between chips: chip0 has "
                           f"{rows[0].shape[0]} elements, {name} has {row.shape[0]}")
    return np.stack(rows)


def _write_output(path, outputs):
    """[chips, length] as ``.npy``, or an ``.npz`` of ``chip0..`` when the lengths differ."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if len({o.shape[0] for o in outputs}) == 1:
        np.save(path, np.stack(outputs))
        return path
    if path.suffix != ".npz":
        path = path.with_suffix(".npz")
    np.savez(path, **{f"chip{i}": o for i, o in enumerate(outputs)})
    return path


def run(args) -> int:
    npu = load_config(args, "npu")
    npu, chips = system_of(args, npu, args.chips)
    if chips is None:
        raise BadInput("npu collective: give --chips N or --topology N")
    torus = npu.topology is not None and npu.topology.is_torus
    if torus and args.group:
        raise BadInput("npu collective: --group is a ring's; a torus's group is --rect")
    if not torus and args.rect:
        raise BadInput("npu collective: --rect is a torus's (--topology XxY)")
    if args.model:
        for opt in ("kind", "input", "group", "rect"):
            if getattr(args, opt):
                raise BadInput(f"npu collective: --{opt} does not go with --model (the "
                               "gradient all-reduce of every chip's parameters)")
        model = load_config(args, "model")
        report = run_gradients(npu, model, chips=chips, seed=args.seed,
                               max_cycles=args.max_cycles or DEFAULT_MAX_CYCLES,
                               backend=args.backend or "iss",
                               algorithm=args.algorithm)
        if args.json:
            write_json(args.json, report.to_json())
        print(report.summary())
        return EXIT_OK if report.golden_match else EXIT_MISMATCH
    if args.kind is None:
        raise BadInput("npu collective: give --kind (or --model for the gradient all-reduce)")
    first, count = _group(args.group, chips)
    x = _read_input(args.input, chips) if args.input else None
    try:
        report = run_collective(npu, kind=args.kind, op=args.op, chips=chips,
                                width=args.width, first=first, count=count, x=x, seed=args.seed,
                                max_cycles=args.max_cycles or DEFAULT_MAX_CYCLES,
                                backend=args.backend, rect=_rect(args.rect),
                                algorithm=args.algorithm)
    except BadInput as exc:
        text = str(exc)
        if args.input and text.startswith("input "):
            text = f"--input {args.input} {text[len('input '):]}"
        raise BadInput(text) from None
    data = report.to_json()
    if args.output:
        data["output"] = str(_write_output(args.output, report.outputs))
    if args.json:
        write_json(args.json, data)
    print(report.summary())
    return EXIT_OK if report.golden_match else EXIT_MISMATCH
