"""``npu sim``: compile a model for N chips and simulate it (:func:`sim.api.simulate`)."""

from __future__ import annotations

import numpy as np

from hw.spec import QUANT_SCHEMES

from ..errors import EXIT_MISMATCH, EXIT_OK, BadInput
from ..flows.simulate import BACKENDS, simulate
from ..report.chrome_trace import write_trace
from ..report.plot import plot_timeline
from ..strategies import NAMES
from .common import (
    add_topology,
    load_array,
    load_config,
    positive,
    probability,
    progress_bar,
    system_of,
    write_json,
)

__all__ = ["add_parser", "run"]


def add_parser(sub):
    p = sub.add_parser("sim", help="compile a model for N chips and simulate it")
    p.add_argument("--strategy", default="single", choices=NAMES)
    p.add_argument("--chips", type=positive, help="default: A x B of --grid, else 1")
    p.add_argument("--grid", help="AxB chips for a 2-D strategy")
    add_topology(p)
    p.add_argument("--npu", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--backend", default="pysim", choices=BACKENDS)
    p.add_argument("--quant", choices=QUANT_SCHEMES,
                   help="quantisation scheme (default: the model file's quant, int8 when unset)")
    p.add_argument("--seed", type=int, default=0)
    for opt in ("--weights", "--input", "--calib", "--output", "--json", "--vcd", "--trace",
                "--plot"):
        p.add_argument(opt)
    p.add_argument("--microbatches", type=positive)
    p.add_argument("--batch", type=positive)
    p.add_argument("--link-stalls", type=probability, default=0.0,
                   help="probability per cycle of a stall on every link (from --seed)")
    p.add_argument("--max-cycles", type=positive)
    p.add_argument("--reference", default="auto", choices=["auto", "same", "none"],
                   help="how a multi-chip run measures one chip's cycles for its speed-up "
                        "(auto: simulate it too, except on pysim)")
    p.set_defaults(run=run)


def _weights(path):
    npz = load_array(path, "--weights")
    if not hasattr(npz, "files"):
        raise BadInput(f"--weights {path}: expected an .npz archive")
    with npz:
        return {k: npz[k] for k in npz.files}


def run(args) -> int:
    npu = load_config(args, "npu")
    model = load_config(args, "model")
    npu, chips = system_of(args, npu, args.chips)
    weights = _weights(args.weights) if args.weights else None
    x = load_array(args.input, "--input") if args.input else None
    if x is not None and not isinstance(x, np.ndarray):
        raise BadInput(f"--input {args.input}: expected an .npy array, not an archive")
    calib = load_array(args.calib, "--calib") if args.calib else None
    try:
        report = simulate(npu, model, strategy=args.strategy, chips=chips,
                          backend=args.backend, seed=args.seed, weights=weights, x=x,
                          calib=calib, batch=args.batch, microbatches=args.microbatches,
                          max_cycles=args.max_cycles, vcd=args.vcd,
                          link_stalls=args.link_stalls, progress=progress_bar(),
                          reference=args.reference, grid=args.grid, quant=args.quant)
    except BadInput as exc:
        # Name the file the problem came from.
        text = str(exc)
        if args.input and text.startswith("input:"):
            text = f"--input {args.input}:{text[len('input:'):]}"
        if args.weights and text.startswith("weights:"):
            text = f"--weights:{text[len('weights:'):]}"
        raise BadInput(text) from None
    if args.output:
        np.save(args.output, report.output)
    written = []
    if args.json:
        written.append(f"report {write_json(args.json, report.to_json())}")
    if args.plot:
        written.append(f"timeline {plot_timeline(report, args.plot)}")
    if args.trace:
        written.append(f"trace {write_trace(report, args.trace)}")
    print(report.summary())
    if written:
        print(f"  wrote {', '.join(written)}")
    return EXIT_OK if report.golden_match else EXIT_MISMATCH
