"""The word-level recurrence of one ring collective (sim.timing.ring_collective) against the
cycle model (time_programs): every member's busy cycles equal, cycle for cycle."""

import random

import pytest

from hw.spec import npu_preset
from hw.spec.collective import (
    CollectiveRequest,
    Kind,
    ReduceOp,
    check_fits,
    registers,
    step_words,
    steps,
)
from hw.spec.isa import COLL_FIFO_WORDS, Op, Unit
from hw.spec.topology import DimLink, Topology
from sim.timing.cycle import time_programs
from sim.timing.launch import _REGS_OF, LaunchTimer, _busy_span, _Comm, _set
from sim.timing.ring_collective import member_busy, ring_constants

TINY = npu_preset("tiny")              # 8-byte ring words of 2 scratchpad words, 2 flits
LPU = npu_preset("lpu-like")           # 320-byte words of 1 scratchpad word, 5 flits


def _regs(npu, req, chip, link):
    """A member's COLL registers with RD6 and WR3 covering the words its schedule reads and
    writes; None when a member reads or writes none (no descriptor can say so)."""
    r = ring_constants(npu, link)[0]
    wbytes = npu.ring_word_bytes
    group = CollectiveRequest(kind=req.kind, op=req.op, width=req.width, length=req.length,
                              chips=req.count, chunks=req.chunks, in_place=req.in_place)
    sched = steps(group, req.position(chip))
    local = sum(step_words(group, s, wbytes) for s in sched if s.local)
    out = sum(step_words(group, s, wbytes) for s in sched if s.out)
    if not local or not out:
        return None
    regs = registers(req, chip)
    regs.update({"RD6.base": 0, "RD6.n0": local * r, "RD6.s0": 1,
                 "WR3.base": npu.sram_words // 2, "WR3.n0": out * r, "WR3.s0": 1})
    return regs


def _compare(npu, req, offsets, link=None, where=""):
    """Runs ``req`` on the cycle model, member ``m`` launching after ``offsets[m]`` NOPs, and
    returns ``(cycle model, recurrence)`` busy cycles by member (None: not a case)."""
    check_fits(req, npu.ring_word_bytes, COLL_FIFO_WORDS)
    regs = {m: _regs(npu, req, m, link) for m in req.members}
    if None in regs.values():
        return None
    programs = []
    for chip in range(req.chips):
        if chip not in regs:
            programs.append([int(Op.HALT)])
            continue
        words = [int(Op.NOP)] * offsets[chip]
        words += [_set(name, regs[chip].get(name, 0)) for name in _REGS_OF[Op.COLL]]
        words += [int(Op.COLL), int(Op.WAIT) | int(Unit.ALL) << 6, int(Op.HALT)]
        programs.append(words)
    t = time_programs(npu, programs, ring=req.chips > 1, link=link)
    want = {m: _busy_span(t.chips[m].trace, 3, t.chips[m].cycles) for m in req.members}
    launches = {m: next(x[2] for x in t.chips[m].launches if x[1] == "COLL")
                for m in req.members}
    got = member_busy(npu, req.chips, {m: m for m in req.members}, regs, launches, link)
    return want, got


def _check(npu, req, offsets, link=None, case=""):
    pair = _compare(npu, req, offsets, link)
    assert pair is not None, f"{case}: not a case ({req})"
    want, got = pair
    assert got is not None, f"{case}: the recurrence declined {req} offsets {offsets}"
    for m in req.members:
        assert got[m] == want[m], (f"{case}: {req}, link {link}, offsets {offsets}: member "
                                   f"{m} busy {got[m]} cycles, the cycle model {want[m]}")


# Ring sizes 2..16, every kind, lengths of one word, of blocks not dividing it, and of
# several KiB (a block of 64 words, the engine's buffer); skewed starts.
MATRIX = [
    # npu, chips, first, count, stride, kind, op, width, length, chunks, in_place, skew
    (TINY, 2, 0, 2, 1, Kind.ALL_REDUCE, ReduceOp.SUM, 32, 2, 1, False, 0),
    (TINY, 3, 0, 3, 1, Kind.REDUCE_SCATTER, ReduceOp.MAX, 32, 7, 1, False, 5),
    (TINY, 4, 0, 4, 1, Kind.ALL_GATHER, ReduceOp.SUM, 64, 9, 1, True, 40),
    (TINY, 5, 0, 5, 1, Kind.ALL_REDUCE, ReduceOp.AVG, 32, 101, 2, False, 0),
    (TINY, 6, 2, 3, 1, Kind.ALL_REDUCE, ReduceOp.MIN, 64, 33, 1, False, 17),
    (TINY, 7, 0, 7, 1, Kind.ALL_GATHER, ReduceOp.SUM, 32, 70, 3, False, 3),
    (TINY, 8, 6, 4, 1, Kind.REDUCE_SCATTER, ReduceOp.SUM, 32, 64, 1, False, 0),
    (TINY, 8, 1, 4, 2, Kind.ALL_REDUCE, ReduceOp.SUM, 32, 31, 1, False, 9),
    (TINY, 9, 0, 9, 1, Kind.REDUCE_SCATTER, ReduceOp.AVG, 64, 40, 2, False, 60),
    (TINY, 10, 3, 10, 1, Kind.ALL_REDUCE, ReduceOp.SUM, 32, 1280, 1, False, 0),
    (TINY, 12, 0, 12, 1, Kind.ALL_GATHER, ReduceOp.SUM, 32, 25, 1, False, 200),
    (TINY, 16, 0, 16, 1, Kind.ALL_REDUCE, ReduceOp.SUM, 32, 2048, 1, False, 0),
    (TINY, 16, 5, 8, 1, Kind.ALL_REDUCE, ReduceOp.MAX, 32, 83, 2, False, 25),
    (LPU, 2, 0, 2, 1, Kind.ALL_REDUCE, ReduceOp.SUM, 32, 1, 1, False, 0),
    (LPU, 4, 0, 4, 1, Kind.ALL_REDUCE, ReduceOp.SUM, 32, 8192, 1, False, 7),
    (LPU, 8, 0, 8, 1, Kind.ALL_GATHER, ReduceOp.SUM, 32, 2003, 2, True, 150),
]


@pytest.mark.parametrize("index", range(len(MATRIX)))
def test_equals_the_cycle_model(index):
    npu, chips, first, count, stride, kind, op, width, length, chunks, in_place, skew = \
        MATRIX[index]
    seed = 1000 + index
    rng = random.Random(seed)
    print(f"case {index} seed {seed}")
    offsets = [rng.randint(0, skew) for _ in range(chips)]
    req = CollectiveRequest(kind=kind, op=op, width=width, length=length, chips=chips,
                            first=first, count=count, stride=stride, chunks=chunks,
                            in_place=in_place)
    _check(npu, req, offsets, case=f"case {index}")


@pytest.mark.parametrize("link", [DimLink(2, 5), DimLink(8, 1), DimLink(4, 13)],
                         ids=["narrow", "wide", "deep"])
def test_equals_the_cycle_model_on_other_links(link):
    """A torus dimension's own links: flits of 1 to 4 a word, 1 to 13 registers."""
    rng = random.Random(7)
    print("seed 7")
    for index, (kind, count) in enumerate([(Kind.ALL_REDUCE, 5), (Kind.ALL_GATHER, 3),
                                           (Kind.REDUCE_SCATTER, 6)]):
        req = CollectiveRequest(kind=kind, op=ReduceOp.SUM, width=32, length=45 + index,
                                chips=6, first=index, count=count)
        _check(TINY, req, [rng.randint(0, 30) for _ in range(6)], link, case=f"{link} {index}")


@pytest.mark.parametrize("npu", [TINY, LPU], ids=["tiny", "lpu-like"])
def test_a_full_receive_buffer_stalls_the_links(npu):
    """A member launching long after the others: its upstream neighbour streams more than its
    receive buffer holds, the link stalls, its registers fill, the neighbour's transmit buffer
    fills and its engine waits, and so on up the ring."""
    req = CollectiveRequest(kind=Kind.ALL_GATHER, op=ReduceOp.SUM, width=32,
                            length=8 * (120 if npu is TINY else 64 * 80), chips=8)
    late = 3000 if npu is TINY else 4000
    want, got = _compare(npu, req, [0] * 7 + [late])
    assert want[6] > late, f"member 6 busy {want[6]}: it did not wait for member 7"
    assert got == want, f"recurrence {got}, cycle model {want}"


def _torus_cluster(npu, topo, groups):
    """``_Comm``'s cluster for ``groups`` (``(req, {member: launch})``) on ``topo``."""
    cluster = []
    for req, launches in groups:
        posts = []
        for m in req.members:
            regs = _regs(npu, req, m, None)
            regs.update({"CO_CHIPS": topo.chips})
            posts.append(("coll", None, launches[m], regs))
        cluster.append((req, posts, min(launches.values()), None, 3))
    return cluster


@pytest.mark.parametrize("closed", [True, False], ids=["recurrence", "cycle-model"])
def test_torus_groups_through_the_launch_model(closed):
    """The launch-level model's collectives on a 4 x 3 torus with links of their own per
    dimension (a row, a column, a run of a row), skewed: the recurrence's busy cycles are the
    cycle model's (``closed_form`` off) ones."""
    topo = Topology((4, 3), (DimLink(4, 3), DimLink(2, 6)))
    rng = random.Random(11)
    print("seed 11")
    row = CollectiveRequest(kind=Kind.ALL_REDUCE, op=ReduceOp.SUM, width=32, length=37,
                            chips=12, first=4, count=4)
    col = CollectiveRequest(kind=Kind.REDUCE_SCATTER, op=ReduceOp.SUM, width=32, length=50,
                            chips=12, first=1, count=3, stride=4)
    run = CollectiveRequest(kind=Kind.ALL_GATHER, op=ReduceOp.SUM, width=64, length=21,
                            chips=12, first=9, count=2)
    groups = [(req, {m: rng.randint(0, 25) for m in req.members}) for req in (row, col, run)]
    cluster = _torus_cluster(TINY, topo, groups)

    def times(closed_form):
        comm = _Comm(TINY, LaunchTimer(TINY), topo.chips, topo)
        comm.closed_form = closed_form
        return comm._colls(cluster)

    got, want = times(True), times(False)
    assert got == want, f"recurrence {got}, cycle model {want}"
    assert all(v > 0 for g in got for v in g.values())
    if closed:
        assert _Comm(TINY, LaunchTimer(TINY), topo.chips, topo)._closed(
            row, [p[3] for p in cluster[0][1]], [0] * 4) is not None


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3])
def test_random_matrix(seed):
    """150 random cases a seed: presets, rings of 2..16, sub-groups and strided groups,
    every kind, op and width, chunks, links of their own, skews up to 3,000 cycles."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    npus = [npu_preset(p) for p in ("tiny", "fpga", "ulx3s", "lpu-like")]
    checked = 0
    for index in range(150):
        npu = rng.choice(npus)
        chips = rng.randint(2, 16)
        count = rng.randint(2, chips) if rng.random() < 0.5 else chips
        stride = 2 if rng.random() < 0.2 and chips % 2 == 0 and count <= chips // 2 else 1
        kind = rng.choice([Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER])
        link = None
        if rng.random() < 0.3:
            link = DimLink(rng.choice([b for b in (1, 2, 4, 8, 16, 32, 64)
                                       if npu.ring_word_bytes % b == 0]), rng.randint(1, 12))
        skew = rng.choice([0, 3, 20, 200, 3000])
        req = CollectiveRequest(kind=kind, op=rng.choice(list(ReduceOp)),
                                width=rng.choice([32, 64]),
                                length=rng.choice([1, 2, 3, rng.randint(1, 40),
                                                   rng.randint(40, 400)]),
                                chips=chips, first=rng.randrange(chips), count=count,
                                stride=stride, chunks=rng.choice([1, 1, 2, 3]),
                                in_place=kind == Kind.ALL_GATHER and rng.random() < 0.5)
        offsets = [rng.randint(0, skew) for _ in range(chips)]
        try:
            pair = _compare(npu, req, offsets, link)
        except ValueError:          # a block over the engine's buffer
            continue
        if pair is None or pair[1] is None:
            continue
        want, got = pair
        for m in req.members:
            assert got[m] == want[m], (f"seed {seed} case {index}: {npu.name} {req}, link "
                                       f"{link}, offsets {offsets}: member {m} busy {got[m]}, "
                                       f"the cycle model {want[m]}")
        checked += 1
    assert checked >= 80, f"seed {seed}: only {checked} cases compared"
