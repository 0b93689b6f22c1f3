"""2-D collectives on a torus (sim.compiler.torus_collective) on the ISS: every member's result
equals a NumPy reduction of the members' vectors in MPI rank order (row-major chip ids)."""

import numpy as np
import pytest

from hw.spec.collective import CollectiveRequest
from hw.spec.isa import Unit
from hw.spec.topology import Topology
from sim.compiler.assembler import Assembler
from sim.compiler.torus_collective import Rect, torus_collective
from sim.golden.collectives import collective
from sim.iss import IssSystem
from tests.helpers import seeded, tiny_variant

NPU = tiny_variant(sram_bytes=32768, imem_words=512)
BASE = 64


def programs_of(plan, topo):
    """One program per chip of ``topo``: the members' launches, every chip's HALT."""
    programs = []
    for c in range(topo.chips):
        asm = Assembler()
        if plan.rank(c) is not None:
            plan.emit(asm, c, NPU.link_bytes_per_cycle)
            asm.wait(Unit.ALL)
        asm.halt()
        programs.append(asm.words())
    return programs


def inputs_of(plan, rng):
    """Each member's vector, in rank order (an all-gather's: its array_split block)."""
    n, dtype = plan.rect.count, np.int32 if plan.width == 32 else np.int64
    info = np.iinfo(dtype)
    sizes = [len(b) for b in np.array_split(np.zeros(plan.length), n)]
    lens = sizes if plan.kind.name == "ALL_GATHER" else [plan.length] * n
    return [rng.integers(info.min, info.max, k, dtype=dtype, endpoint=True) for k in lens]


def run_iss(plan, topo, vectors):
    system = IssSystem(NPU, topo.chips, topo)
    for rank, c in enumerate(plan.members):
        system.chip[c].write_words(BASE, plan.pack_input(c, vectors[rank]))
    programs = programs_of(plan, topo)
    system.run(programs)
    return [plan.unpack_output(c, system.chip[c].read_words(BASE, plan.buffer_words))
            for c in plan.members], programs


def reference(plan, vectors):
    """MPI's result per rank: the golden collective over a group of the ranks, in order."""
    n = plan.rect.count
    req = CollectiveRequest(kind=plan.kind, op=plan.op, width=plan.width, length=plan.length,
                            chips=n)
    return collective(req, vectors)


def check(kind, op, width, length, dims, rect=None, algorithm="auto", seed=0):
    topo = Topology(dims)
    plan = torus_collective(kind, op, width, length, topo, rect=rect, base=BASE,
                            size=NPU.array_size, link_bytes=NPU.link_bytes_per_cycle,
                            algorithm=algorithm)
    vectors = inputs_of(plan, seeded(seed))
    got, programs = run_iss(plan, topo, vectors)
    want = reference(plan, vectors)
    for rank, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, f"rank {rank}: {g.shape} != {w.shape}"
        bad = np.flatnonzero(g != w)
        assert not bad.size, (f"{kind} {op} int{width} x{length} on {dims} {plan.algorithm}: "
                              f"rank {rank} (chip {plan.members[rank]}) element {bad[0]}: "
                              f"{g[bad[0]]} != {w[bad[0]]}")
    return plan, programs


@pytest.mark.parametrize("dims", [(3, 3), (3, 4), (4, 3), (4, 4)])
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather"])
def test_every_torus_size(dims, kind):
    """9, 12 and 16 chips, both orientations of 12; an uneven length (blocks of
    array_split's unequal sizes)."""
    check(kind, "sum", 32, 101, dims, seed=dims[0] * 10 + dims[1])


@pytest.mark.parametrize("op", ["sum", "max", "min", "avg"])
@pytest.mark.parametrize("width", [32, 64])
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather"])
def test_every_op_and_width(kind, op, width):
    """SUM wraps, MAX and MIN are signed, AVG is the floor of the wrapped sum over every chip
    of the rectangle (the 2-D algorithms divide once, by all 12)."""
    check(kind, op, width, 77, (4, 3), seed=len(op) + width)


@pytest.mark.parametrize("algorithm, length", [("halves", 5), ("halves", 200),
                                               ("rows_columns", 1), ("rows_columns", 64)])
def test_all_reduce_algorithms(algorithm, length):
    check("all_reduce", "avg", 32, length, (4, 4), algorithm=algorithm, seed=length)


@pytest.mark.parametrize("rect", [Rect(0, 1, 4, 1), Rect(2, 0, 1, 4), Rect(1, 1, 2, 3),
                                  Rect(0, 2, 3, 2)])
@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather"])
def test_rows_columns_and_sub_rectangles(rect, kind):
    """A row (engine 0 alone), a column (engine 1 alone) and sub-rectangles of a 4 x 4 torus:
    the chips outside take no part."""
    plan, programs = check(kind, "min", 64, 45, (4, 4), rect=rect, seed=rect.x0 + 4 * rect.y0)
    outside = [c for c in range(16) if plan.rank(c) is None]
    assert all(len(programs[c]) == 1 for c in outside)


def test_the_halves_keep_both_engines_busy_in_every_phase():
    """The large all-reduce's phases each launch collectives on each engine (rows on engine 0,
    columns on engine 1, then the other way round): both dimensions' links work. Its blocks
    exceed the engines' buffers: each collective runs in chunks, one launch."""
    plan, _ = check("all_reduce", "sum", 32, 4096, (4, 4), seed=5)
    first = plan.launches(0, NPU.link_bytes_per_cycle)[0]
    assert [(x.engine, x.req.chunks) for x in first] == [(0, 4), (1, 4)], \
        "each engine's collective in 4 chunks, one launch"
    assert plan.algorithm == "halves"
    for phase in plan.phases[0]:
        assert sorted(p.engine for p in phase) == [0, 1]
        assert {p.req.stride for p in phase} == {1, 4}, "a row and a column in every phase"


@pytest.mark.parametrize("make, match", [
    (lambda t: torus_collective("all_reduce", "sum", 32, 8, t, rect=Rect(3, 0, 2, 2), base=0,
                                size=4, link_bytes=4), r"leaves the 4x4 \(x0 \+ w <= 4"),
    (lambda t: torus_collective("send_recv", "sum", 32, 8, t, base=0, size=4, link_bytes=4),
     "not send_recv"),
    (lambda t: torus_collective("all_reduce", "sum", 32, 8, t, base=0, size=4, link_bytes=4,
                                algorithm="ring"), "algorithm 'ring' is not one of"),
])
def test_rejections(make, match):
    with pytest.raises(ValueError, match=match):
        make(Topology((4, 4)))


def test_a_ring_is_one_row():
    """On a ring the plan is the 1-D collective over every chip (in chunks when its blocks
    exceed the engines' buffers), bit-exact too."""
    topo = Topology.ring(6)
    plan = torus_collective("all_reduce", "max", 32, 1000, topo, base=BASE,
                            size=NPU.array_size, link_bytes=NPU.link_bytes_per_cycle)
    assert plan.algorithm == "ring" and plan.members == tuple(range(6))
    assert plan.launches(0, NPU.link_bytes_per_cycle)[0][0].req.chunks == 2
    vectors = inputs_of(plan, seeded(8))
    got, _ = run_iss(plan, topo, vectors)
    for rank, (g, w) in enumerate(zip(got, reference(plan, vectors), strict=True)):
        assert (g == w).all(), f"rank {rank}"
