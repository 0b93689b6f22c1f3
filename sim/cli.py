"""``npu`` command line (also ``python -m sim``).

Exit status (DESIGN.md §5): 0 bit-exact match, 1 golden mismatch, 2 bad input (one line on
stderr, no traceback), 3 watchdog (a simulation exceeded ``--max-cycles``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hw.spec import ConfigError, load_model, load_npu

__all__ = ["main", "EXIT_OK", "EXIT_MISMATCH", "EXIT_BAD_INPUT", "EXIT_WATCHDOG", "UsageError"]

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2
EXIT_WATCHDOG = 3


class UsageError(Exception):
    """Bad input detected by a command; becomes exit status 2 with one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, not argparse's usage block: scripts read the first line of stderr.
        raise UsageError(f"{self.prog}: {message}")


def _positive(text):
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _load(args, option):
    """Load the constraint file named by ``--npu`` or ``--model``; a bad one is a usage error."""
    loader = load_npu if option == "npu" else load_model
    try:
        return loader(getattr(args, option))
    except ConfigError as exc:
        # Same shape as argparse's own errors: which command, which option, then the problem
        # with its file, key, value and limit.
        raise UsageError(f"npu {args.command}: argument --{option}: {exc}") from None


def _load_configs(args):
    """Validate the constraint files a command names, so a bad file is reported as such."""
    npu = _load(args, "npu") if getattr(args, "npu", None) else None
    model = _load(args, "model") if getattr(args, "model", None) else None
    return npu, model


def _not_built(name, issue):
    def run(args):
        _load_configs(args)
        raise UsageError(f"npu {name}: not built yet ({issue})")
    run.not_built = True  # lets the tests find the commands still waiting for their issue
    return run


def _cmd_export(args):
    from amaranth.back import verilog

    from hw.tops import TOPS, build_top

    if args.top not in TOPS:
        raise UsageError(f"npu export: unknown --top {args.top!r}; choose from "
                         f"{', '.join(TOPS)}")
    npu = _load(args, "npu")
    try:
        design = build_top(args.top, npu, args.chips)
    except (NotImplementedError, ValueError) as exc:
        raise UsageError(f"npu export: {exc}") from None
    out_dir = Path(args.output)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"npu export: cannot create output directory {out_dir}: "
                         f"{exc.strerror}") from None
    name = f"npu_{args.top}"
    text = verilog.convert(design, name=name)
    path = out_dir / f"{name}.v"
    try:
        path.write_text(text)
    except OSError as exc:
        raise UsageError(f"npu export: cannot write {path}: {exc.strerror}") from None
    print(f"{path}: {args.top} for {npu.name} ({npu.array_size}x{npu.array_size} array), "
          f"{text.count(chr(10))} lines")
    return EXIT_OK


def _cmd_fpga(args):
    from .fpga import cmd_fpga

    return cmd_fpga(args, _load(args, "npu"), UsageError)


def _cmd_collective(args):
    from .collective import cmd_collective

    return cmd_collective(args)


def _cmd_bench(args):
    from .bench import run_bench

    return run_bench(json_path=args.json, quick=args.quick)


def _build_parser():
    parser = _Parser(prog="npu", description="npu-scale: multi-chip transformer NPU model")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("sim", help="compile a model for N chips and simulate it")
    p.add_argument("--strategy", default="single",
                   choices=["single", "head", "pipeline", "data", "hidden", "sequence"])
    p.add_argument("--chips", type=_positive, default=1)
    p.add_argument("--npu", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--backend", default="pysim", choices=["pysim", "verilator", "iss"])
    p.add_argument("--seed", type=int, default=0)
    for opt in ("--weights", "--input", "--calib", "--output", "--json", "--vcd", "--trace",
                "--plot"):
        p.add_argument(opt)
    p.add_argument("--microbatches", type=_positive)
    p.add_argument("--batch", type=_positive)
    p.add_argument("--max-cycles", type=_positive)
    p.set_defaults(run=_cmd_sim)

    p = sub.add_parser("collective", help="run one collective on the simulated ring")
    p.add_argument("--kind", required=True, choices=["all_reduce", "reduce_scatter", "all_gather"])
    p.add_argument("--op", default="sum", choices=["sum", "max", "min", "avg"])
    p.add_argument("--chips", type=_positive, required=True)
    p.add_argument("--npu", required=True)
    p.add_argument("--width", type=int, default=32, choices=[32, 64])
    p.add_argument("--group")
    p.add_argument("--seed", type=int, default=0)
    for opt in ("--input", "--output", "--json"):
        p.add_argument(opt)
    p.add_argument("--max-cycles", type=_positive)
    p.set_defaults(run=_cmd_collective)

    p = sub.add_parser("plan", help="check capacity and compatibility per strategy")
    p.add_argument("--npu", required=True)
    p.add_argument("--model", required=True)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--chips", type=_positive)
    group.add_argument("--min-chips", action="store_true")
    p.add_argument("--strategy", default="all")
    p.add_argument("--json")
    p.set_defaults(run=_not_built("plan", "planner issue"))

    p = sub.add_parser("export", help="write the Verilog of a top-level design")
    p.add_argument("--top", required=True)
    p.add_argument("--npu", required=True)
    p.add_argument("--chips", type=_positive, help="chip count (default: the top's own)")
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.set_defaults(run=_cmd_export)

    p = sub.add_parser("fpga", help="synthesise for an FPGA and report use and fmax")
    p.add_argument("--npu", required=True)
    p.add_argument("--device", default="ecp5-85k", choices=["ecp5-85k"])
    p.add_argument("--top", default="matmul", help="top from `npu export` (default: matmul)")
    p.add_argument("--json")
    p.add_argument("--build", help="keep the Verilog, netlists, logs and report in this directory")
    p.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    p.set_defaults(run=_cmd_fpga)

    p = sub.add_parser("bench", help="run the benchmarks; write JSON and a table")
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="smaller workloads (smoke test)")
    p.set_defaults(run=_cmd_bench)
    return parser


def _cmd_sim(args):
    from .run import SimError, Watchdog, run_sim_command

    _load_configs(args)
    try:
        return run_sim_command(args)
    except SimError as exc:
        raise UsageError(str(exc) if str(exc).startswith("npu sim") else f"npu sim: {exc}") \
            from None
    except ConfigError as exc:
        raise UsageError(f"npu sim: {exc}") from None
    except Watchdog as exc:
        print(f"npu sim: watchdog: {exc}", file=sys.stderr)
        return EXIT_WATCHDOG


def main(argv=None) -> int:
    """Run one ``npu`` command; return its exit status (never raises ``SystemExit``)."""
    parser = _build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            # `--help` (argparse exits 0 after printing it); errors raise UsageError instead.
            return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
        return args.run(args)
    except (UsageError, ConfigError) as exc:
        message = f"error: {exc}" if isinstance(exc, ConfigError) else str(exc)
        # The contract is one line: fold any newline a message may carry (e.g. from a path).
        print(" ".join(message.splitlines()), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
