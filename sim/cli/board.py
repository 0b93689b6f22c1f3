"""``npu board``: compile for one chip, run it on an FPGA board over UART, compare with the
golden model (:func:`sim.api.run_board`); the report and exit statuses are ``npu sim``'s."""

from __future__ import annotations

import numpy as np

from hw.fpga.board import DEFAULT_BAUD
from hw.fpga.uart import MIN_DIVISOR

from ..errors import EXIT_MISMATCH, EXIT_OK, BadInput
from ..flows.board import BoardDriver, SerialTransport, run_board
from ..rtl.toolchain import ToolchainMissing
from ..rtl.verilator.board import VerilatorTransport
from .common import load_array, load_config, positive, write_json
from .simulate import _weights

__all__ = ["add_parser", "run", "SIM_DIVISOR"]

#: Clocks per UART bit of ``--sim``'s board top: the fewest the link takes (a short simulation).
SIM_DIVISOR = MIN_DIVISOR


def add_parser(sub):
    p = sub.add_parser("board", help="run a model on an FPGA board (ULX3S-85F) over UART")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", help="the board's serial port, e.g. /dev/ttyUSB0")
    where.add_argument("--sim", action="store_true",
                       help="no board: the board top Verilated behind a UART model "
                            f"({SIM_DIVISOR} clocks per bit)")
    p.add_argument("--baud", type=positive, default=None,
                   help="UART baud rate the bitstream was built for (default 1000000)")
    p.add_argument("--npu", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--strategy", default="single", choices=["single"],
                   help="one board is one chip")
    p.add_argument("--seed", type=int, default=0)
    for opt in ("--weights", "--input", "--calib", "--output", "--json"):
        p.add_argument(opt)
    p.add_argument("--batch", type=positive)
    p.add_argument("--max-cycles", type=positive)
    p.add_argument("--timeout", type=float, default=2.0,
                   help="seconds to wait for each reply of the board")
    p.set_defaults(run=run)


def run(args) -> int:
    npu = load_config(args, "npu")
    model = load_config(args, "model")
    if not args.timeout > 0:
        raise BadInput(f"--timeout {args.timeout} must be positive")
    weights = _weights(args.weights) if args.weights else None
    x = load_array(args.input, "--input") if args.input else None
    if x is not None and not isinstance(x, np.ndarray):
        raise BadInput(f"--input {args.input}: expected an .npy array, not an archive")
    calib = load_array(args.calib, "--calib") if args.calib else None
    if args.sim:
        if args.baud is not None:
            raise BadInput(f"--baud {args.baud} is for a board (--port); --sim runs "
                           f"{SIM_DIVISOR} clocks per bit")
        try:
            transport = VerilatorTransport(npu, divisor=SIM_DIVISOR)
        except ToolchainMissing as exc:
            raise BadInput(f"--sim: {exc}") from None
    else:
        transport = SerialTransport(args.port, args.baud or DEFAULT_BAUD, timeout=args.timeout)
    try:
        report = run_board(npu, model, BoardDriver(transport), seed=args.seed, weights=weights,
                           x=x, calib=calib, batch=args.batch, max_cycles=args.max_cycles)
    finally:
        transport.close()
    if args.output:
        np.save(args.output, report.output)
    if args.json:
        write_json(args.json, report.to_json())
    print(report.summary())
    return EXIT_OK if report.golden_match else EXIT_MISMATCH
