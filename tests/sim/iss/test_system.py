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
                       r"\d+\) waits at HALT for COLL ALL_REDUCE SUM int32 x4 \(rank 0 of 2, next "
                       r"chip 1\) \[chip 1 halted\]"):
        IssSystem(npu, 2).run([progs[0], halt_only])
    other = CollectiveRequest("all_reduce", "sum", 32, 6, 2)
    with pytest.raises(IssError, match=r"deadlock: .*chip 0 .* waits at HALT for COLL .* x4 .*"
                                       r"chip 1 posted COLL ALL_REDUCE SUM int32 x6"):
        IssSystem(npu, 2).run([progs[0], single_chip_program(other, 1)[2]])
    with pytest.raises(IssError, match="chip 1's COLL has CO_NEXT=1, its own id"):
        IssSystem(npu, 2).run([progs[0], progs[0]])
    with pytest.raises(IssError, match="CO_CHIPS=2 on a system of 3 chips"):
        IssSystem(npu, 3).run([progs[0], progs[1], progs[1]])


def test_rejections():
    npu = small_npu()
    with pytest.raises(ValueError, match="chips must be 1..1024, not 0"):
        IssSystem(npu, 0)
    with pytest.raises(ValueError, match="chips must be 1..1024, not 1025"):
        IssSystem(npu, 1025)


def test_coll_block_fields_must_be_the_division():
    """The engine has no divider: a COLL whose CO_LEN and CO_COUNT do not carry
    ``length // count`` and ``length % count`` is refused, naming the values they need."""
    from hw.spec.isa import Insn, Op, encode, reg

    npu = small_npu()
    req = CollectiveRequest("all_reduce", "sum", 32, 7, 2)
    progs = [single_chip_program(req, c)[2] for c in range(2)]
    coll = progs[1].index(encode(Insn(Op.COLL)))
    # Chip 1 writes the bare length into CO_LEN just before its COLL.
    bare = progs[1][:coll] + [encode(Insn(Op.SET, reg("CO_LEN"), 7))] + progs[1][coll:]
    with pytest.raises(IssError, match=r"chip 1 pc \d+: COLL with CO_LEN=0x7, CO_COUNT=0x10002: "
                                       r"7 elements over 2 chips need CO_LEN=0x3000007 "
                                       r"\(block length 3 in bits \[47:24\]\) and "
                                       r"CO_COUNT=0x10002"):
        IssSystem(npu, 2).run([progs[0], bare])


def test_a_second_engine_is_a_torus_chips():
    """COLL 1 (collective engine 1) on a ring's chip, which has one engine, is refused naming
    the engines; on a torus's chip it runs."""
    from hw.spec.topology import Topology
    from sim.compiler import collective_launch as cl
    from sim.compiler.assembler import Assembler

    npu = small_npu()
    req = CollectiveRequest("all_reduce", "sum", 32, 8, 4, first=0, count=2)
    programs = []
    for c in range(4):
        asm = Assembler()
        if c < 2:
            cl.emit(asm, cl.coll_launch_natural(req, c, base=0, size=npu.array_size,
                                                link_bytes=npu.link_bytes_per_cycle, engine=1))
        asm.halt()
        programs.append(asm.words())
    with pytest.raises(IssError, match="COLL on engine 1: a chip of this system has 1 "
                                       "collective engine"):
        IssSystem(npu, 4).run(programs)
    IssSystem(npu, 4, Topology((2, 2))).run(programs)
