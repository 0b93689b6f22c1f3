"""The board top Verilated behind a C++ UART model: a transport for
:class:`sim.flows.board.BoardDriver` at Verilator's speed.

:class:`VerilatorTransport` has :class:`sim.rtl.uart_model.SimTransport`'s interface and line
model (``board.cpp`` is its C++ twin: 8N1 characters of ``divisor`` clocks per bit, ``uart_tx``
sampled in the middle of each bit, time advancing only while the driver waits for a reply or
keeps the line quiet), on a Verilated :class:`hw.fpga.board.BoardTop` (``sim=True``) instead of
Amaranth's simulator: a one-layer model's load, run and read-back over the UART (over 100,000
cycles) takes seconds instead of minutes.

The build is cached like the Verilator backend's (:mod:`sim.rtl.verilator.build`: under
``fast/``, ``board-<digest>/`` named by a hash of the Verilog, the harness, the flags and the
wheel's version; ``index/board-<key>.json`` maps the configuration and the gateware's text to the
Verilog's hash, so that a warm run does not export).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from amaranth.back import verilog

from hw.fpga.board import BoardTop
from hw.spec import NpuConfig

from ...errors import TransportTimeout
from ..toolchain import file_lock
from .build import (
    _SRC_ATTR,
    VERILATOR_FLAGS,
    _digest,
    _root,
    _version,
    config_key,
    make_opt,
    publish,
    run_verilator,
    write_index,
)

__all__ = ["VerilatorTransport", "ensure_board_build", "MODULE"]

HARNESS = Path(__file__).with_name("board.cpp")
MODULE = "npu_board_sim"


def _verilog(npu: NpuConfig, divisor: int) -> str:
    text = verilog.convert(BoardTop(npu=npu, divisor=divisor, sim=True), name=MODULE)
    return _SRC_ATTR.sub("", text)


def _build_name(digest: str) -> str:
    return "board-" + _digest(digest, HARNESS.read_bytes(), " ".join(VERILATOR_FLAGS + make_opt()),
                              _version("verilator"))


def _compile(work: Path, text: str) -> None:
    (work / f"{MODULE}.v").write_text(text)
    shutil.copy(HARNESS, work / "board.cpp")
    cmd = ["verilator", "--cc", "--exe", "--build", "-j", str(os.cpu_count() or 1),
           *VERILATOR_FLAGS, "--top-module", MODULE, "--Mdir", "obj_dir", "-o", "board",
           "-MAKEFLAGS", " ".join(make_opt()), f"{MODULE}.v", "board.cpp"]
    run_verilator(work, cmd, MODULE, "board")


def ensure_board_build(npu: NpuConfig, divisor: int) -> Path:
    """The Verilated board top of ``npu`` with a UART of ``divisor`` clocks per bit (its
    executable), built now unless the cache has it. Raises
    :class:`~sim.rtl.toolchain.ToolchainMissing` or :class:`~sim.rtl.verilator.build.BuildFailed`.
    """
    root = _root()
    key = _digest("board", config_key(npu), str(divisor))
    index = root / "index" / f"board-{key}.json"
    with file_lock(root / "locks" / f"board-{key}.lock"):
        if index.exists():
            final = root / _build_name(json.loads(index.read_text())["verilog"])
            if (final / "board").exists():
                return final / "board"
        start = time.perf_counter()
        text = _verilog(npu, divisor)
        digest = _digest(text)
        final = root / _build_name(digest)
        if not (final / "board").exists():
            publish(root, final, lambda work: _compile(work, text),
                    lambda: {"build_s": round(time.perf_counter() - start, 2),
                             "verilog_lines": text.count("\n")})
        write_index(index, digest)
        return final / "board"


class VerilatorTransport:
    """:class:`~sim.rtl.uart_model.SimTransport`'s interface on the Verilated board top.

    Parameters: ``npu``; ``divisor`` (clocks per bit); ``timeout_cycles``: a read that gets no
    byte for this many cycles raises :class:`~sim.errors.TransportTimeout`. ``cycles`` is the
    simulated cycle count so far. Close it (or use it as a context manager) to end the
    simulator's process.
    """

    def __init__(self, npu: NpuConfig, *, divisor: int = 4, timeout_cycles: int = 200_000):
        self.divisor = divisor
        self.timeout_cycles = timeout_cycles
        self._proc = subprocess.Popen([str(ensure_board_build(npu, divisor)), str(divisor)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      bufsize=1)

    def _ask(self, request: str) -> str:
        self._proc.stdin.write(request + "\n")
        self._proc.stdin.flush()
        reply = self._proc.stdout.readline().strip()
        if not reply:
            raise RuntimeError(f"the Verilated board exited (status {self._proc.poll()})")
        return reply

    def write(self, data: bytes) -> None:
        if data:
            self._ask(f"w {bytes(data).hex()}")

    def write_levels(self, levels) -> None:
        self._ask("l " + "".join("1" if v else "0" for v in levels))

    def read(self, n: int) -> bytes:
        reply = self._ask(f"r {n} {self.timeout_cycles}")
        if reply.startswith("timeout"):
            got = int(reply.split()[1])
            raise TransportTimeout(f"simulated board: {got} of {n} bytes within "
                                   f"{self.timeout_cycles} cycles")
        return bytes.fromhex(reply[3:]) if n else b""

    def pause(self, bit_times: int) -> None:
        self._ask(f"p {bit_times}")

    @property
    def cycles(self) -> int:
        return int(self._ask("c").split()[1])

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.write("q\n")
            self._proc.stdin.close()
            self._proc.wait(timeout=10)
        # Both pipes, also when the simulator has already exited (no ResourceWarning).
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):     # at interpreter shutdown
            self.close()
