"""``npu``: build the parser from the command modules, run one command, map errors to exit
statuses (0 bit-exact, 1 mismatch, 2 bad input, 3 watchdog, 4 tool failure; ``sim.errors``)."""

from __future__ import annotations

import sys

from hw.spec import ConfigError

from ..errors import EXIT_BAD_INPUT, NpuError
from . import bench, board, collective, export, fpga, import_, plan, simulate, sweep
from .common import Parser

__all__ = ["main", "build_parser", "COMMANDS"]

#: The command modules, in ``--help`` order: each has ``add_parser(sub)`` and ``run(args)``.
COMMANDS = {"sim": simulate, "collective": collective, "plan": plan, "sweep": sweep,
            "export": export, "fpga": fpga, "board": board, "bench": bench, "import": import_}


def build_parser() -> Parser:
    parser = Parser(prog="npu", description="npu-scale: multi-chip transformer NPU model")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv=None) -> int:
    """Run one ``npu`` command; return its exit status (never raises ``SystemExit``)."""
    parser = build_parser()
    args = None
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:
            # `--help` (argparse exits 0 after printing it); errors raise BadInput instead.
            return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
        return args.run(args)
    except (NpuError, ConfigError) as exc:
        message = str(exc)
        # Already named ("npu sim: ...", "npu: ..."), or to be named ("npu_overrides.x=...").
        if not message.startswith(("npu ", "npu:")):
            message = f"npu {getattr(args, 'command', '')}: {message}".replace("npu : ", "npu: ")
        # The contract is one line: fold any newline a message may carry (e.g. from a path).
        print(" ".join(message.splitlines()), file=sys.stderr)
        return exc.exit_code if isinstance(exc, NpuError) else EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
