"""``npu sim``: compile a model for N chips and simulate it (:func:`sim.api.simulate`)."""

from __future__ import annotations

import numpy as np

from hw.spec import QUANT_SCHEMES

from ..errors import EXIT_MISMATCH, EXIT_OK, BadInput
from ..flows.generate import generate, generate_summary, plot_generation
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
    p.add_argument("--order", choices=("auto", "plain", "zigzag"),
                   help="--strategy sequence: the tokens' order over the chips (auto: zig-zag "
                        "for causal ring attention where it pays, docs/architecture.md)")
    p.add_argument("--generate", type=int, metavar="N",
                   help="generate N tokens greedily after the prompt (a decoder; the prefill "
                        "and N - 1 decode steps on chip)")
    p.add_argument("--prompt-ids", help="the prompt's token ids (.npy of integers; default: "
                                        "seq_len random ids from --seed)")
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


def _prompt(args, model) -> np.ndarray:
    if args.prompt_ids is None:
        rng = np.random.default_rng(args.seed)
        batch = args.batch or (args.chips or 2 if args.strategy == "data" else 1)
        return rng.integers(0, model.vocab_size, (batch, model.seq_len // 2 or 1))
    ids = load_array(args.prompt_ids, "--prompt-ids")
    if not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu" or ids.ndim not in (1, 2):
        raise BadInput(f"--prompt-ids {args.prompt_ids}: expected a .npy array of integer "
                       "token ids, [P] or [batch, P]")
    if args.batch and (ids.ndim == 1 or ids.shape[0] != args.batch):
        raise BadInput(f"--batch {args.batch} does not match --prompt-ids {args.prompt_ids} "
                       f"of shape {list(ids.shape)}")
    return ids


def _run_generate(args, npu, model) -> int:
    for opt in ("input", "calib", "vcd", "trace", "output", "microbatches", "quant", "order"):
        if getattr(args, opt):
            raise BadInput(f"--{opt} does not apply to --generate")
    weights = _weights(args.weights) if args.weights else None
    out = generate(npu, model, prompt=_prompt(args, model), n=args.generate,
                   backend=args.backend, strategy=args.strategy, chips=args.chips,
                   grid=args.grid,
                   seed=args.seed, weights=weights,
                   head_weights=weights,
                   max_cycles=args.max_cycles or 5_000_000)
    print(generate_summary(out))
    written = []
    if args.json:
        data = {k: v for k, v in out.items() if k not in ("logits", "spans")}
        written.append(f"report {write_json(args.json, data)}")
    if args.plot:
        written.append(f"timeline {plot_generation(out, model, npu, args.plot)}")
    if written:
        print(f"  wrote {', '.join(written)}")
    return EXIT_OK if out["golden_match"] else EXIT_MISMATCH


def run(args) -> int:
    npu = load_config(args, "npu")
    model = load_config(args, "model")
    if args.generate is not None:
        if args.topology is not None:
            raise BadInput("npu sim: --generate runs a ring of --chips, without --topology")
        return _run_generate(args, npu, model)
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
                          reference=args.reference, grid=args.grid, quant=args.quant,
                          order=args.order)
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
