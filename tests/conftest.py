import zlib

import numpy as np
import pytest

from sim.rtl.verilator import toolchain_problem


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
