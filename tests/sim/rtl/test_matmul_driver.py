"""The matmul unit's pysim driver (sim.rtl.matmul_driver): MatmulJob rejects bad shapes."""

import numpy as np
import pytest

from sim.rtl.matmul_driver import MatmulJob


def test_driver_rejects_bad_shapes():
    with pytest.raises(ValueError, match="do not chain"):
        MatmulJob(np.zeros((2, 3)), np.zeros((4, 2)), 4)
    with pytest.raises(ValueError, match="K must be at least 1"):
        MatmulJob(np.zeros((2, 0)), np.zeros((0, 2)), 4)
