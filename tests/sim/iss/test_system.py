"""IssSystem (sim.iss.system): deadlocks, disagreeing chips and bad chip counts are refused."""

import pytest

from hw.spec.collective import CollectiveRequest
from sim.iss import IssError, IssSystem
from tests.helpers import single_chip_program, small_npu


def test_iss_system_detects_deadlock_and_disagreement():
    npu = small_npu()
    req = CollectiveRequest("all_reduce", "sum", 32, 4, 2)
    progs = [single_chip_program(req, c)[2] for c in range(2)]
    halt_only = progs[1][-1:]
    with pytest.raises(IssError, match=r"deadlock: chips \[0\] can never go on: chip 0 \(pc "
                       r"\d+\) waits at HALT for COLL ALL_REDUCE SUM int32 x4 \(group 0\.\.1\) "
                       r"\[chip 1 halted\]"):
        IssSystem(npu, 2).run([progs[0], halt_only])
    other = CollectiveRequest("all_reduce", "sum", 32, 6, 2)
    with pytest.raises(IssError, match=r"deadlock: .*chip 0 .* waits at HALT for COLL .* x4 .*"
                                       r"chip 1 posted COLL ALL_REDUCE SUM int32 x6"):
        IssSystem(npu, 2).run([progs[0], single_chip_program(other, 1)[2]])
    with pytest.raises(IssError, match="CO_RANK=0: it must be its ring position 1"):
        IssSystem(npu, 2).run([progs[0], progs[0]])
    with pytest.raises(IssError, match="CO_CHIPS=2 on a ring of 3 chips"):
        IssSystem(npu, 3).run([progs[0], progs[1], progs[1]])


def test_rejections():
    npu = small_npu()
    with pytest.raises(ValueError, match="chips must be 1..1024, not 0"):
        IssSystem(npu, 0)
    with pytest.raises(ValueError, match="chips must be 1..1024, not 1025"):
        IssSystem(npu, 1025)
