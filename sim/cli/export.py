"""``npu export``: the Verilog of a top-level design (:func:`sim.api.export_verilog`)."""

from __future__ import annotations

from ..errors import EXIT_OK
from ..rtl.export import export_verilog
from .common import load_config, positive

__all__ = ["add_parser", "run"]


def add_parser(sub):
    p = sub.add_parser("export", help="write the Verilog of a top-level design")
    p.add_argument("--top", required=True)
    p.add_argument("--npu", required=True)
    p.add_argument("--chips", type=positive, help="chip count (default: the top's own)")
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.set_defaults(run=run)


def run(args) -> int:
    npu = load_config(args, "npu")
    out = export_verilog(args.top, npu, args.output, chips=args.chips)
    print(f"{out.path}: {out.top} for {npu.name} ({npu.array_size}x{npu.array_size} array"
          f"{f', {out.chips} chips' if out.chips > 1 else ''}), {out.lines} lines")
    return EXIT_OK
