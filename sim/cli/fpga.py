"""``npu fpga``: synthesise, place and route for an FPGA (:func:`sim.api.synthesize`)."""

from __future__ import annotations

import dataclasses
import sys

from ..errors import EXIT_MISMATCH, EXIT_OK, BadInput
from ..flows.fpga import DEVICES, format_table, synthesize
from .common import load_config, write_json

__all__ = ["add_parser", "run"]

#: Exit status when the design does not fit the device.
EXIT_NO_FIT = EXIT_MISMATCH


def add_parser(sub):
    p = sub.add_parser("fpga", help="synthesise for an FPGA and report use and fmax")
    p.add_argument("--npu", required=True)
    p.add_argument("--device", default="ecp5-85k", choices=list(DEVICES))
    p.add_argument("--top", default="matmul", help="top from `npu export` (default: matmul)")
    p.add_argument("--json")
    p.add_argument("--build", help="keep the RTLIL, netlists, logs and report in this directory")
    p.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    p.add_argument("--synth-only", action="store_true",
                   help="synthesis only: the top without the shell, use from Yosys' cells, "
                        "no placement and no fmax (minutes)")
    p.add_argument("--place-only", action="store_true",
                   help="place without routing: fmax and critical path as nextpnr estimates "
                        "them after placement (minutes for a unit)")
    p.add_argument("--clock-mhz", type=float,
                   help="clock target instead of the NPU's clock_mhz (the board's PLL output)")
    p.set_defaults(run=run)


def run(args) -> int:
    npu = load_config(args, "npu")
    if args.synth_only and args.place_only:
        raise BadInput("--synth-only and --place-only exclude each other (synthesis only has "
                       "no placement)")
    if args.clock_mhz is not None:
        if not 0 < args.clock_mhz <= 400:
            raise BadInput(f"--clock-mhz {args.clock_mhz:g} is outside (0, 400] MHz")
        npu = dataclasses.replace(npu, clock_mhz=args.clock_mhz)
    result = synthesize(npu, top=args.top, device=args.device, build_dir=args.build,
                        seed=args.seed, synth_only=args.synth_only,
                        place_only=args.place_only)
    print(format_table(result))
    if args.json:
        write_json(args.json, result)
    if not result["fits"]:
        over = [n for n, r in result["resources"].items() if r["used"] > r["available"]]
        print(f"npu fpga: {args.top} does not fit {args.device}: {', '.join(over)} over",
              file=sys.stderr)
        return EXIT_NO_FIT
    return EXIT_OK
