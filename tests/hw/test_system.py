"""ChipSystem (hw.system): chips on a ring running COLL launches, RTL == IssSystem == golden,
and the ISS's cycle model gives the RTL's cycles, busy counters and traces."""

import numpy as np
import pytest

from hw.spec.collective import CollectiveRequest, Kind
from hw.spec.formats import OutMode
from hw.spec.isa import Unit
from hw.spec.memory import pack_params, pack_rows, pack_weight_blocks
from hw.spec.topology import Topology
from hw.system import ChipSystem
from sim.compiler.assembler import Assembler
from sim.compiler.collective_launch import coll_launch, emit
from sim.compiler.descriptors import emit_matmul, matmul_launch
from sim.golden.collectives import collective
from sim.golden.matmul import matmul_unit
from sim.iss import IssSystem
from sim.rtl.system_runner import run_system_pysim
from tests.helpers import (
    assert_cycle_model,
    emit_transfers,
    input_length,
    seeded,
    small_npu,
    torus_programs,
)


def random_input(rng, req, chip):
    """A chip's local vector: its block for all-gather, else the whole per-chip vector."""
    hi = 1 << (req.width - 1)
    return rng.integers(-hi, hi, input_length(req, chip), dtype=np.int64)


def build(npu, chips, reqs, rng, *, matmul=False):
    """Programs, images, reads and golden results for `reqs` run back to back on every chip.

    With ``matmul``, the first request is an all-gather of 2 x 16 int32 whose input is each
    chip's raw 4 x 4 matmul result (the MATMUL writes the COLL's input buffer).
    """
    n = npu.array_size
    programs, images, reads = [], [{} for _ in range(chips)], [[] for _ in range(chips)]
    inputs = [[None] * chips for _ in reqs]
    asms = [Assembler() for _ in range(chips)]
    if matmul:
        for c in range(chips):
            a, b = rng.integers(-128, 128, (4, 4)), rng.integers(-128, 128, (4, 4))
            p = (rng.integers(-5000, 5000, 4), rng.integers(1, 2**16, 4), rng.integers(1, 4, 4))
            images[c].update({0: pack_rows(a, 1, n), 8: pack_weight_blocks(b, n),
                              16: pack_params(*p, n)})
            emit_matmul(asms[c], matmul_launch(size=n, m=4, k=4, n=4, a_base=0, a_row_words=1,
                                               b_base=8, p_base=16, c_base=32, c_row_words=4,
                                               mode=OutMode.RAW))
            asms[c].wait(Unit.MATMUL)
            inputs[0][c] = matmul_unit(a, b, *p, OutMode.RAW).reshape(-1).astype(np.int64)
    launches = []
    base = 64
    for r, req in enumerate(reqs):
        row = []
        for c in range(chips):
            in_base = 32 if (matmul and r == 0) else base
            probe = coll_launch(req, c, in_base=in_base, out_base=0, size=n,
                                link_bytes=npu.link_bytes_per_cycle)
            out_base = base + probe.in_words
            launch = coll_launch(req, c, in_base=in_base, out_base=out_base, size=n,
                                 link_bytes=npu.link_bytes_per_cycle)
            if inputs[r][c] is None:
                inputs[r][c] = random_input(rng, req, c)
            if launch.rd6 is not None and not (matmul and r == 0):
                images[c][in_base] = launch.pack_input(inputs[r][c])
            if launch.wr3 is not None:
                reads[c].append((out_base, launch.out_words))
            emit(asms[c], launch)
            row.append(launch)
        base += 64
        launches.append(row)
    for asm in asms:
        asm.halt()
        programs.append(asm.words())
    want = [[np.zeros(0)] * chips if req.kind == Kind.BARRIER else collective(req, inputs[r])
            for r, req in enumerate(reqs)]
    return programs, images, reads, launches, want


def assert_timed(npu, programs, rtl, topology=None):
    """The cycle model (sim.timing.cycle) agrees with the pysim run ``rtl`` of ``programs``."""
    model = assert_cycle_model(npu, programs, list(zip(
        rtl["chip_cycles"], rtl["busy_cycles"], rtl["traces"], strict=True)),
        topology=topology)
    assert model.cycles == rtl["cycles"], (model.cycles, rtl["cycles"])


def run_case(chips, reqs, seed, *, matmul=False, max_cycles=3000):
    npu = small_npu()
    rng = seeded(seed)
    programs, images, reads, launches, want = build(npu, chips, reqs, rng, matmul=matmul)

    system = IssSystem(npu, chips)
    for c, iss in enumerate(system.chip):
        for b, words in images[c].items():
            iss.write_words(b, words)
    system.run(programs)
    assert system.collectives == len(reqs)
    for r, req in enumerate(reqs):
        for c in range(chips):
            launch = launches[r][c]
            if launch.wr3 is None:
                assert want[r][c].size == 0
                continue
            got = launch.unpack_output(system.chip[c].read_words(launch.wr3.base,
                                                                 launch.out_words))
            bad = np.flatnonzero(got != want[r][c])
            assert not len(bad), (f"ISS {req} chip {c}: element {bad[0]} is {got[bad[0]]}, "
                                  f"golden {want[r][c][bad[0]]}")

    rtl = run_system_pysim(npu, programs, images, reads, max_cycles=max_cycles)
    assert not any(rtl["errors"]), rtl["errors"]
    for c in range(chips):
        for (b, count), words in zip(reads[c], rtl["regions"][c], strict=True):
            bad = np.argwhere(words != system.chip[c].read_words(b, count))
            assert not len(bad), (f"chip {c}: RTL word {b + bad[0][0]} byte {bad[0][1]} "
                                  "differs from the ISS")
    assert rtl["cycles"] >= max(rtl["chip_cycles"])
    for c in range(chips):
        assert rtl["busy_cycles"][c][3] > 0, f"chip {c}'s collective unit never busy"
    assert_timed(npu, programs, rtl)
    print(f"cycles={rtl['cycles']} chip_cycles={rtl['chip_cycles']} "
          f"busy={rtl['busy_cycles']} wall={rtl['wall_s']:.1f}s")


def test_two_chips_matmul_then_collectives():
    """MATMUL -> all-gather of its results, then all-reduce SUM int32, reduce-scatter MAX
    int32 and all-reduce SUM int64 (wrapping), one program per chip."""
    reqs = [CollectiveRequest("all_gather", "sum", 32, 32, 2),
            CollectiveRequest("all_reduce", "sum", 32, 10, 2),
            CollectiveRequest("reduce_scatter", "max", 32, 9, 2),
            CollectiveRequest("all_reduce", "sum", 64, 5, 2)]
    run_case(2, reqs, seed=11, matmul=True)


def test_three_chips_all_reduce_and_a_group_of_two():
    """All-reduce SUM over 3 chips, then all-reduce MIN over the group {2, 0}: chip 1 only
    forwards (no RD6, no WR3)."""
    reqs = [CollectiveRequest("all_reduce", "sum", 32, 7, 3),
            CollectiveRequest("all_reduce", "min", 32, 6, 3, first=2, count=2)]
    run_case(3, reqs, seed=12)


def test_rejections():
    npu = small_npu()
    with pytest.raises(TypeError, match="npu must be an NpuConfig"):
        ChipSystem(npu="tiny", chips=2)
    with pytest.raises(ValueError, match="1025 chips: a system holds at most 1024"):
        ChipSystem(npu=npu, chips=1025)
    with pytest.raises(ValueError, match="chips=4 is not the 6 chips of the 2x3"):
        ChipSystem(npu=npu, chips=4, topology=Topology((2, 3)))


def test_four_chips_reduce_scatter_gather_send_recv_barrier():
    """4 chips: reduce-scatter AVG int64, all-gather over the group {1, 2, 3}, a send from
    chip 3 to chip 0 (the ring wraps; chips 1 and 2 forward), a barrier."""
    reqs = [CollectiveRequest("reduce_scatter", "avg", 64, 7, 4),
            CollectiveRequest("all_gather", "sum", 32, 7, 4, first=1, count=3),
            CollectiveRequest("send_recv", "sum", 32, 5, 4, first=3, count=2),
            CollectiveRequest("barrier", "sum", 32, 1, 4)]
    run_case(4, reqs, seed=13)


# --- point-to-point transfers and routing ---------------------------------------------------

def p2p_programs(npu, chips, transfers, groups, rng, *, length=60):
    """Programs where each ``(src, dest)`` of ``transfers`` sends 16 words from word 0 to word
    40 of ``dest``, and each group ``(first, count)`` all-reduces ``length`` int32 at word 100
    in natural order (``length`` a multiple of the group size times 2 elements per engine
    word), all at the same time."""
    from sim.compiler import collective_launch as cl

    n, link = npu.array_size, npu.link_bytes_per_cycle
    programs, images = [], []
    for c in range(chips):
        asm = Assembler()
        images.append({0: rng.integers(0, 256, (16, n), dtype=np.uint8),
                       100: rng.integers(0, 256, (length, n), dtype=np.uint8)})
        emit_transfers(asm, c, transfers, npu)
        for first, count in groups:
            req = CollectiveRequest("all_reduce", "sum", 32, length, chips, first=first,
                                    count=count)
            cl.emit(asm, cl.coll_launch_natural(req, c, base=100, size=n, link_bytes=link))
        asm.wait(Unit.ALL)
        asm.halt()
        programs.append(asm.words())
    return programs, images


@pytest.mark.parametrize("chips, transfers, groups", [
    # Each send crosses a chip that takes no part; two groups all-reduce at the same time,
    # each group's last member reaching its first through the other group's chips (four
    # chips on pysim: about a minute, in the slow suite).
    pytest.param(4, [(0, 2), (3, 1)], [(0, 2), (2, 2)], marks=pytest.mark.slow),
    # A chip sends to itself (round the ring) while a wrapping group of 3 all-reduces.
    (3, [(1, 1)], [(2, 3)]),
])
def test_routed_transfers_and_concurrent_groups(chips, transfers, groups):
    npu = small_npu()
    programs, images = p2p_programs(npu, chips, transfers, groups, seeded(21))
    system = IssSystem(npu, chips)
    for iss, img in zip(system.chip, images, strict=True):
        for base, words in img.items():
            iss.write_words(base, words)
    system.run(programs)
    rtl = run_system_pysim(npu, programs, images, [[(0, 200)]] * chips, max_cycles=20_000)
    for c in range(chips):
        got, want = rtl["regions"][c][0], system.chip[c].read_words(0, 200)
        bad = np.argwhere(got != want)
        assert not len(bad), f"chip {c}: RTL differs from the ISS at word {bad[0][0]}"
    for src, dest in transfers:
        assert (system.chip[dest].read_words(40, 16) == images[src][0]).all()
    # Every chip sees its own busy intervals: a send, a receive and the collective.
    for c, trace in enumerate(rtl["traces"]):
        assert trace["entries"] and not trace["overflow"], c
        assert trace["entries"][-1][1] == 0, f"chip {c} ends busy"
    assert_timed(npu, programs, rtl)


def test_a_send_nobody_receives_hits_the_watchdog_naming_the_chip():
    from sim.rtl.pysim import SimulationTimeout

    npu = small_npu()
    programs, images = p2p_programs(npu, 2, [(0, 1)], [], seeded(3))
    programs[1] = programs[1][-1:]          # chip 1 only halts
    with pytest.raises(SimulationTimeout, match=r"chip 0 at pc \d+ busy with send"):
        run_system_pysim(npu, programs, images, [[], []], max_cycles=200)


# --- a torus: a router with a port per dimension, two collective engines per chip ----------

def run_torus_case(topo, transfers, seed, *, max_cycles=20_000):
    npu = small_npu()
    programs, images = torus_programs(npu, topo, transfers, seeded(seed))
    system = IssSystem(npu, topo.chips, topo)
    for iss, img in zip(system.chip, images, strict=True):
        for base, words in img.items():
            iss.write_words(base, words)
    system.run(programs)
    rtl = run_system_pysim(npu, programs, images, [[(0, 300)]] * topo.chips,
                           max_cycles=max_cycles, topology=topo)
    assert not any(rtl["errors"]), rtl["errors"]
    for c in range(topo.chips):
        got, want = rtl["regions"][c][0], system.chip[c].read_words(0, 300)
        bad = np.argwhere(got != want)
        assert not len(bad), f"chip {c}: RTL differs from the ISS at word {bad[0][0]}"
    for src, dest in transfers:
        assert (system.chip[dest].read_words(40, 16) == images[src][0]).all(), (src, dest)
    assert_timed(npu, programs, rtl, topology=topo)
    return rtl


# About 100 s of pysim on the shared cores: the suite runs the same on Verilator
# (tests/sim/rtl/verilator/test_runner.py); this one holds the torus to Amaranth's simulator.
@pytest.mark.slow
def test_torus_rows_and_columns_at_once_and_routed_sends():
    """A 2 x 2 torus: every row all-reduces on engine 0 while every column all-reduces on
    engine 1, and two messages cross both dimensions (0 -> 3 and 1 -> 2: along the column,
    then the row) while chip 2 sends to chip 0 along the column: RTL == ISS, the cycle model
    gives the RTL's cycles, busy counters and traces."""
    rtl = run_torus_case(Topology((2, 2)), [(0, 3), (1, 2), (2, 0)], seed=31)
    print(f"cycles={rtl['cycles']} busy={rtl['busy_cycles']} wall={rtl['wall_s']:.1f}s")
