"""sim.iss.scheduler: posted COLL/SEND/RECV meet their partners; deadlocks and races are named."""

import numpy as np
import pytest

from hw.spec.isa import Unit
from sim.compiler import p2p_launch as pl
from sim.compiler.assembler import Assembler
from sim.compiler.descriptors import Desc
from sim.iss import IssError, IssSystem
from tests.helpers import small_npu

NPU = small_npu()
N = NPU.array_size


def program(*steps):
    asm = Assembler()
    for step in steps:
        step(asm)
    asm.wait(Unit.ALL)
    asm.halt()
    return asm.words()


def send(dest, base=0, words=16):
    return lambda asm: pl.emit(asm, pl.send_launch(dest=dest, desc=pl.contiguous(base, words),
                                                   size=N, link_bytes=4))


def recv(src, base=40, words=16):
    return lambda asm: pl.emit(asm, pl.recv_launch(src=src, desc=pl.contiguous(base, words),
                                                   size=N, link_bytes=4))


def test_sends_and_receives_cross_without_deadlock():
    """Both chips send first and receive second: the units run concurrently, as on the RTL."""
    system = IssSystem(NPU, 2)
    for c, iss in enumerate(system.chip):
        iss.write_words(0, np.full((16, N), c + 1, np.uint8))
    system.run([program(send(1), recv(1)), program(send(0), recv(0))])
    assert (system.chip[0].read_words(40, 16) == 2).all()
    assert (system.chip[1].read_words(40, 16) == 1).all()


def test_a_send_nobody_receives_is_a_named_deadlock():
    with pytest.raises(IssError, match=r"deadlock: chips \[0\] can never go on: chip 0 \(pc \d+\) "
                                       r"waits at WAIT for SEND of 16 words to chip 1 \[chip 1 "
                                       r"never posts a RECV from chip 0 \(halted\)\]"):
        IssSystem(NPU, 2).run([program(send(1)), program()])


def test_receives_from_each_other_only_is_a_deadlock():
    with pytest.raises(IssError, match=r"chip 0 .* RECV .* from chip 1 .*chip 1 never posts a "
                                       r"SEND to chip 0"):
        IssSystem(NPU, 2).run([program(recv(1)), program(recv(0))])


def test_mismatched_lengths_are_refused():
    with pytest.raises(IssError, match=r"mismatched lengths: chip 0 \(pc \d+\) sends 16 words "
                                       r"to chip 1, whose RECV \(pc \d+\) takes 8"):
        IssSystem(NPU, 2).run([program(send(1)), program(recv(0, words=8))])


def test_a_message_is_whole_ring_words():
    with pytest.raises(ValueError, match=r"a SEND of 15 scratchpad words is not whole ring "
                                         r"words of 2"):
        pl.send_launch(dest=1, desc=Desc(0, (15, 1, 1, 1), (1, 0, 0, 0)), size=N, link_bytes=4)
    with pytest.raises(IssError, match=r"SR_DEST=5 is not a chip of the ring of 2"):
        IssSystem(NPU, 2).run([program(send(5)), program()])


def test_overwriting_an_in_flight_send_is_a_race():
    """A vector launch that rewrites a SEND's words before WAIT SEND: the RTL could send
    either version, so the ISS refuses the program."""
    from sim.compiler import vector_launch as vl

    overwrite = vl.requant_launch(size=N, length=N, a=vl.Rows(100, 4, 1, 1),
                                  out=vl.Rows(0, 4, 1, 1), mult=1, shift=1)
    with pytest.raises(IssError, match=r"race: VEC \(pc \d+\) accesses word 0 that SEND \(pc "
                                       r"\d+\) \(unit SEND, still running\) reads; WAIT for SEND"):
        IssSystem(NPU, 2).run([program(send(1), lambda asm: vl.emit(asm, overwrite)),
                               program(recv(0))])
