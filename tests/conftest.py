import zlib

import numpy as np
import pytest

from sim.rtl.verilator import toolchain_problem


@pytest.fixture
def rng(request):
    """A seeded generator; the seed is printed so a failure can be replayed."""
    seed = getattr(request, "param", None)
    if seed is None:
        seed = zlib.crc32(request.node.nodeid.encode()) % 100_000
    print(f"seed={seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def verilator_ok():
    problem = toolchain_problem()
    if problem:
        pytest.fail(f"Verilator toolchain unavailable: {problem}")
