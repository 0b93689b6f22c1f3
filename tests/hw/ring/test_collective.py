"""CollectiveEngine (hw.ring.collective) on the ring (RingTestbed in pysim) vs golden collectives.

The default set covers every kind and op, N in {1, 2, 3, 4} plus N = 8, both widths, lengths 1,
N-1, N+1 and an odd larger one, and sub-groups at the start, middle and wrap-around of the ring;
the full N x width x length matrix is ``@pytest.mark.slow``. Random stalls on every link
register and every DMA change only the cycle count; without stalls the cycle count equals
:func:`hw.spec.collective.predicted_cycles` exactly.
"""

import dataclasses
import itertools

import numpy as np
import pytest

from hw.ring.collective import CollectiveEngine
from hw.ring.testbed import RingTestbed
from hw.spec import npu_preset
from hw.spec.collective import CollectiveRequest, ReduceOp
from hw.spec.timing.collective import predicted_cycles, system_cycles
from sim.golden import collectives as golden
from sim.rtl.ring_runner import simulate_collective
from tests.helpers import exported_verilog, input_length

TINY = npu_preset("tiny")
FPGA_LINK = dataclasses.replace(TINY, link_bytes_per_cycle=8, link_latency_cycles=4)


def _inputs(rng, req):
    dtype = np.int32 if req.width == 32 else np.int64
    info = np.iinfo(dtype)
    extremes = np.array([info.min, info.max, -1, 0, 1], dtype=dtype)
    out = []
    for chip in range(req.chips):
        size = input_length(req, chip)
        x = rng.integers(info.min, info.max, size=size, dtype=dtype, endpoint=True)
        pick = rng.random(size) < 0.3          # extremes: SUM wraps, MAX/MIN at the rails
        x[pick] = rng.choice(extremes, size=int(pick.sum()))
        out.append(x)
    return out


def _run_and_check(req, rng, *, npu=TINY, stall=0.0, avg=True):
    """Run ``req`` on random inputs; every chip's output equals the golden one (with
    ``avg=False``, an engine without AVG's divider, AVG's is the golden SUM's)."""
    inputs = _inputs(rng, req)
    run = simulate_collective(npu, req, inputs, stall=stall, seed=int(rng.integers(1 << 31)),
                              avg=avg)
    want = golden.collective(req if avg or req.op != ReduceOp.AVG else
                             dataclasses.replace(req, op=ReduceOp.SUM), inputs)
    what = (f"{req.kind.name} {req.op.name} int{req.width} N={req.chips} length={req.length} "
            f"group {req.first}:{req.count}")
    for chip, (got, exp) in enumerate(zip(run["outputs"], want, strict=True)):
        assert got.shape == exp.shape, f"{what}: chip {chip} has {got.shape}, expected {exp.shape}"
        bad = np.flatnonzero(got != exp)
        assert bad.size == 0, (f"{what}: chip {chip} element {bad[:1]}: {got[bad[:1]]} != "
                               f"golden {exp[bad[:1]]}")
    return run


# (kind, op, width, chips, length, first, count)
REPRESENTATIVE = [
    ("all_reduce", "sum", 32, 1, 1, 0, None),
    ("all_reduce", "sum", 32, 2, 1, 0, None),
    ("all_reduce", "max", 32, 2, 3, 0, None),
    ("all_reduce", "avg", 32, 3, 2, 0, None),
    ("all_reduce", "min", 32, 3, 4, 0, None),
    ("all_reduce", "sum", 64, 4, 5, 0, None),
    ("all_reduce", "avg", 64, 4, 37, 0, None),
    ("all_reduce", "sum", 32, 8, 9, 0, None),
    ("reduce_scatter", "sum", 32, 3, 7, 0, None),
    ("reduce_scatter", "max", 64, 2, 3, 0, None),
    ("reduce_scatter", "avg", 32, 4, 3, 0, None),
    ("reduce_scatter", "min", 32, 4, 37, 0, None),
    ("all_gather", "sum", 32, 4, 5, 0, None),
    ("all_gather", "sum", 64, 3, 4, 0, None),
    ("all_gather", "sum", 32, 2, 1, 0, None),
    # sub-groups: start, middle, wrap-around (chips outside forward)
    ("all_reduce", "sum", 32, 4, 5, 0, 2),
    ("reduce_scatter", "max", 32, 5, 7, 1, 3),
    ("all_reduce", "avg", 32, 5, 4, 3, 3),
    ("all_gather", "sum", 32, 4, 3, 3, 3),
    ("send_recv", "sum", 32, 4, 6, 3, 2),
    ("send_recv", "sum", 64, 3, 5, 1, 2),
]


@pytest.mark.parametrize("kind, op, width, chips, length, first, count", REPRESENTATIVE)
def test_collective_matches_golden(kind, op, width, chips, length, first, count, rng):
    req = CollectiveRequest(kind=kind, op=op, width=width, length=length, chips=chips,
                            first=first, count=count)
    run = _run_and_check(req, rng)
    assert run["cycles"] == predicted_cycles(req, 4, 2), \
        f"cycles {run['cycles']} != model {predicted_cycles(req, 4, 2)}"


@pytest.mark.parametrize("kind, chips, length, first, count", [
    ("all_reduce", 4, 13, 0, None),
    ("reduce_scatter", 3, 8, 0, None),
    ("all_gather", 4, 9, 0, None),
    ("all_reduce", 5, 7, 3, 3),
])
def test_stalls_change_cycles_not_data(kind, chips, length, first, count, rng):
    req = CollectiveRequest(kind=kind, op="sum", width=32, length=length, chips=chips,
                            first=first, count=count)
    clean = _run_and_check(req, rng)
    stalled = [_run_and_check(req, rng, stall=p)["cycles"] for p in (0.2, 0.5)]
    assert all(c > clean["cycles"] for c in stalled), \
        f"stalls did not slow the ring: {stalled} vs {clean['cycles']}"


@pytest.mark.parametrize("kind, op, width, chips, length, first, count", [
    ("all_reduce", "avg", 32, 3, 7, 0, None),
    ("all_reduce", "avg", 64, 4, 9, 1, 3),
    ("reduce_scatter", "avg", 32, 4, 5, 0, None),
    ("all_reduce", "max", 64, 3, 4, 0, None),
    ("reduce_scatter", "min", 32, 2, 3, 0, None),
    ("all_gather", "sum", 64, 3, 4, 0, None),
])
def test_without_the_avg_divider(kind, op, width, chips, length, first, count, rng):
    """``avg=False`` (the FPGA build): SUM, MAX, MIN and the cycle counts are unchanged, and an
    AVG gives the wrapped sum."""
    req = CollectiveRequest(kind=kind, op=op, width=width, length=length, chips=chips,
                            first=first, count=count)
    run = _run_and_check(req, rng, avg=False)
    assert run["cycles"] == predicted_cycles(req, 4, 2), \
        f"cycles {run['cycles']} != model {predicted_cycles(req, 4, 2)}"


def test_wide_link_word_16_bytes(rng):
    """8-byte links (the fpga preset): 16-byte words, 4 lanes of 32 or 2 of 64 bits."""
    for width, length in ((32, 11), (64, 6)):
        req = CollectiveRequest(kind="all_reduce", op="max", width=width, length=length,
                                chips=3)
        run = _run_and_check(req, rng, npu=FPGA_LINK, stall=0.3)
        assert run["cycles"] > 0


# 64-bit elements as two 32-bit lanes: (chip 0, chip 1) pairs whose high halves are equal (the
# low halves' unsigned compare decides, against their signed one), whose low halves carry into
# the high half, and that wrap at the rails.
_WIDE_PAIRS = [
    ((5 << 32) + 0x80000000, (5 << 32) + 1),
    ((5 << 32) + 1, (5 << 32) + 0x80000000),
    (-(1 << 32) + 0x7FFFFFFF, -1),
    (0xFFFFFFFF, 1),
    (0x80000000, 0x80000000),
    ((1 << 63) - 1, 1),
    (-(1 << 63), -1),
    (-1, -1),
]


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_wide_elements_across_the_lanes(op):
    req = CollectiveRequest(kind="all_reduce", op=op, width=64, length=len(_WIDE_PAIRS),
                            chips=2)
    inputs = [np.array([pair[chip] for pair in _WIDE_PAIRS], dtype=np.int64)
              for chip in range(2)]
    run = simulate_collective(TINY, req, inputs, seed=7)
    want = golden.collective(req, inputs)
    for chip, (got, exp) in enumerate(zip(run["outputs"], want, strict=True)):
        bad = np.flatnonzero(got != exp)
        assert bad.size == 0, (f"{op} int64: chip {chip} element {bad[:1]} (pair "
                               f"{_WIDE_PAIRS[bad[0]] if bad.size else None}): {got[bad[:1]]} "
                               f"!= golden {exp[bad[:1]]}")


@pytest.mark.parametrize("chips, first, count", [(4, 1, 3), (3, 0, 3), (5, 4, 2), (3, 1, 1)])
def test_barrier_completes_in_model_cycles(chips, first, count):
    req = CollectiveRequest(kind="barrier", op="sum", width=32, length=1, chips=chips,
                            first=first, count=count)
    run = simulate_collective(TINY, req, [np.zeros(1, np.int32)] * chips)
    assert run["cycles"] == predicted_cycles(req, 4, 2)
    assert all(o.size == 0 for o in run["outputs"])


def test_cycle_model_exact_on_other_links(rng):
    for npu, (kind, chips, length) in itertools.product(
            (FPGA_LINK, dataclasses.replace(TINY, link_bytes_per_cycle=2,
                                            link_latency_cycles=1)),
            (("all_reduce", 4, 40), ("reduce_scatter", 3, 9))):
        req = CollectiveRequest(kind=kind, op="sum", width=32, length=length, chips=chips)
        run = _run_and_check(req, rng, npu=npu)
        model = predicted_cycles(req, npu.link_bytes_per_cycle, npu.link_latency_cycles)
        assert run["cycles"] == model, f"{npu.link_bytes_per_cycle} B links: {run['cycles']} " \
                                       f"!= model {model}"


def test_block_larger_than_buffers_rejected():
    req = CollectiveRequest(kind="all_reduce", op="sum", width=32, length=200, chips=2)
    with pytest.raises(ValueError, match=r"block of 50 words .* exceeds .* fifo_words=16"):
        simulate_collective(TINY, req, [np.zeros(200, np.int32)] * 2, fifo_words=16)


@pytest.mark.parametrize("build, error, match", [
    (lambda: CollectiveEngine(link_bytes=3), ValueError,
     r"link_bytes_per_cycle must be a power of two, not 3"),
    (lambda: CollectiveEngine(link_bytes="4"), TypeError, r"link_bytes must be an integer"),
    (lambda: CollectiveEngine(link_bytes=4, fifo_words=1), ValueError,
     r"fifo_words must be an integer >= 2, not 1"),
])
def test_bad_parameters_rejected(build, error, match):
    with pytest.raises(error, match=match):
        build()


def _matrix():
    ops = itertools.cycle(["sum", "max", "min", "avg"])
    for kind, chips, width in itertools.product(("all_reduce", "reduce_scatter", "all_gather"),
                                                range(1, 9), (32, 64)):
        for length in sorted({1, max(1, chips - 1), chips + 1, 4 * chips + 3}):
            yield kind, next(ops), width, chips, length


@pytest.mark.slow
@pytest.mark.parametrize("kind, op, width, chips, length", list(_matrix()))
def test_collective_full_matrix(kind, op, width, chips, length, rng):
    req = CollectiveRequest(kind=kind, op=op, width=width, length=length, chips=chips)
    run = _run_and_check(req, rng, stall=0.2)
    assert run["cycles"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("chips", range(2, 9))
def test_subgroups_every_position_slow(chips, rng):
    for first, count in itertools.product(range(chips), range(1, chips + 1)):
        req = CollectiveRequest(kind="all_reduce", op="sum", width=32, length=count + 2,
                                chips=chips, first=first, count=count)
        _run_and_check(req, rng)


# The ring's RTL runs under Verilator in make test inside ChipSystem's nodes (the Verilator
# backend's rings of tests/sim/rtl/verilator, their collectives held to the cycle model); this
# cocotb build of the exported 4-chip ring top alone (about 45 s cold) is in the slow suite.
@pytest.mark.slow
@pytest.mark.verilator
def test_verilator_ring_matches_pysim(verilator_ok, tmp_path, rng):
    """`npu export --top ring` (4 chips, tiny preset) under cocotb + Verilator: an all-reduce
    gives the golden results in exactly the cycles Amaranth's simulator counts."""
    from hw.ring.testbed import testbed_command_layout
    from hw.spec.collective import local_blocks, output_blocks, pack_blocks, unpack_blocks
    from sim.rtl.cocotb_tb import run_cocotb
    from sim.rtl.ring_runner import command_value

    text = exported_verilog(tmp_path, "ring", TINY)
    req = CollectiveRequest(kind="all_reduce", op="sum", width=32, length=203, chips=4)
    inputs = _inputs(rng, req)
    wbytes = 8
    data = {"chips": np.array(4), "max_cycles": np.array(100_000),
            "cmd": np.array(testbed_command_layout(4).const(command_value(req)).as_bits(),
                            dtype=np.uint64),
            "out_counts": np.array([sum(-(-req.blocks()[b] // 2) for b in output_blocks(req, c))
                                    for c in range(4)])}
    for chip in range(4):
        words = pack_blocks(inputs[chip], req, local_blocks(req, chip), wbytes)
        data[f"in{chip}"] = np.array([list(w.to_bytes(wbytes, "little")) for w in words],
                                     dtype=np.uint8)
    out = run_cocotb(text, top="npu_ring", test_module="tb_ring", data=data)
    pysim = simulate_collective(TINY, req, inputs, fifo_words=256)
    want = golden.collective(req, inputs)
    for chip in range(4):
        blocks = output_blocks(req, chip)
        parts = unpack_blocks([int(w, 16) for w in out["words"][chip]], req, blocks, wbytes)
        got = np.concatenate([parts[b] for b in sorted(parts)])
        bad = np.flatnonzero(got != want[chip])
        assert bad.size == 0, f"verilator chip {chip} element {bad[:1]}: {got[bad[:1]]} != " \
                              f"golden {want[chip][bad[:1]]}"
    assert out["cycles"] == pysim["cycles"], \
        f"verilator {out['cycles']} cycles, pysim {pysim['cycles']}"
    print(f"verilator: {out['cycles']} cycles in {out['wall_s']:.3f} s; pysim "
          f"{pysim['sim']['wall_s']:.2f} s")


@pytest.mark.parametrize("chips, first, count, late", [(4, 0, 4, 2), (5, 3, 3, 0), (3, 0, 2, 1)])
def test_barrier_waits_for_the_last_member(chips, first, count, late):
    """Members start together except chip ``late``, 60 cycles later: no member may leave the
    barrier before the late one has issued it; everyone leaves soon after."""
    from sim.rtl.pysim import run_sim
    from sim.rtl.ring_runner import command_value

    req = CollectiveRequest(kind="barrier", op="sum", width=32, length=1, chips=chips,
                            first=first, count=count)
    system = RingTestbed(npu=TINY, chips=chips, buffer_words=4, fifo_words=4)
    delay = 60
    left = {}

    async def bench(ctx):
        ctx.set(system.cmd, command_value(req))
        ctx.set(system.start_chip, ((1 << chips) - 1) & ~(1 << late))
        await ctx.tick()
        ctx.set(system.start_chip, 0)
        for cycle in range(1, 400):
            if cycle == delay:
                ctx.set(system.start_chip, 1 << late)
            elif cycle == delay + 1:
                ctx.set(system.start_chip, 0)
            for chip, engine in enumerate(system.engines):
                if chip not in left and cycle > 1 and not ctx.get(engine.busy) and \
                        (chip != late or cycle > delay + 1):
                    left[chip] = cycle
            if len(left) == chips:
                return
            await ctx.tick()
        raise AssertionError(f"barrier not left by every chip: {left}")

    run_sim(system, [bench], max_cycles=2_000)
    for p, chip in enumerate(req.members):
        assert delay < left[chip] < delay + 80, \
            f"member {chip} (rank {p}) left the barrier at cycle {left[chip]}, late chip " \
            f"{late} started at cycle {delay}"


BIDIR = dataclasses.replace(TINY, link_bidirectional=True)


@pytest.mark.parametrize("kind, op, chips, length, first, count, stall", [
    ("all_reduce", "sum", 4, 13, 0, None, 0.0),
    ("all_reduce", "avg", 3, 1, 0, None, 0.0),        # one element: the reverse ring idles
    ("all_reduce", "max", 5, 9, 3, 3, 0.0),           # group wrapping around the ring
    ("all_reduce", "min", 2, 6, 1, 2, 0.0),
    ("all_reduce", "sum", 4, 21, 1, 2, 0.3),          # stalls on both rings
    ("reduce_scatter", "sum", 3, 7, 0, None, 0.0),    # other kinds: forward ring only
    ("all_gather", "sum", 4, 8, 2, 3, 0.0),
])
def test_bidirectional_ring(kind, op, chips, length, first, count, stall, rng):
    """`link_bidirectional`: an all-reduce split over both rings; same results, model exact."""
    req = CollectiveRequest(kind=kind, op=op, width=32, length=length, chips=chips,
                            first=first, count=count)
    run = _run_and_check(req, rng, npu=BIDIR, stall=stall)
    if stall == 0:
        model = system_cycles(req, 4, 2, bidirectional=True)
        assert run["cycles"] == model, f"cycles {run['cycles']} != model {model}"


def test_minimal_buffers_survive_stalls(rng):
    """Buffers of exactly one block are enough, whatever the stalls."""
    from hw.spec.collective import max_block_words

    for kind, chips, length in (("all_reduce", 4, 120), ("all_gather", 3, 61)):
        req = CollectiveRequest(kind=kind, op="sum", width=32, length=length, chips=chips)
        inputs = _inputs(rng, req)
        words = max_block_words(req, 8)
        run = simulate_collective(TINY, req, inputs, fifo_words=words, stall=0.5,
                                  seed=int(rng.integers(1 << 31)))
        for chip, (got, exp) in enumerate(zip(run["outputs"], golden.collective(req, inputs),
                                              strict=True)):
            assert np.array_equal(got, exp), f"{kind} chip {chip} with fifo_words={words}"


def test_buffers_smaller_than_a_block_deadlock(monkeypatch):
    """Why check_fits exists: with less than a block of buffering every chip waits forever."""
    import sim.rtl.ring_runner
    from sim.rtl.pysim import SimulationTimeout

    monkeypatch.setattr(sim.rtl.ring_runner, "check_fits", lambda *args: None)
    req = CollectiveRequest(kind="all_reduce", op="sum", width=32, length=256, chips=2)
    with pytest.raises(SimulationTimeout):
        simulate_collective(TINY, req, [np.zeros(256, np.int32)] * 2, fifo_words=8,
                            max_cycles=3_000)


@pytest.mark.parametrize("kind, op, chips, length, chunks, in_place, divisor, merged", [
    ("all_reduce", "sum", 4, 16, 3, False, None, True),       # chunk boundaries merged
    ("all_gather", "sum", 3, 12, 4, True, None, True),        # in place: merged too
    ("reduce_scatter", "max", 3, 9, 2, False, None, False),   # its last step reads locally
    ("all_reduce", "avg", 3, 7, 2, False, 6, False),          # unequal blocks; AVG by 6
])
def test_chunks_in_one_command(kind, op, chips, length, chunks, in_place, divisor, merged,
                               rng):
    """One command runs ``chunks`` collectives back to back on the next parts of the streams,
    each chunk's last step merged with the next one's first where the schedule allows
    (``hw.spec.collective.merges``): every chunk's result is the golden one, and the cycles
    are the engine's model's."""
    from hw.spec.collective import chunk_of, merges

    req = CollectiveRequest(kind=kind, op=op, width=32, length=length, chips=chips,
                            chunks=chunks, in_place=in_place, divisor=divisor)
    assert merges(req, 0) == merged
    one = chunk_of(req)
    parts = [_inputs(rng, one) for _ in range(chunks)]
    inputs = [np.concatenate([p[c] for p in parts]) for c in range(chips)]
    run = simulate_collective(TINY, req, inputs)
    want = [np.concatenate([golden.collective(one, p)[c] for p in parts]) for c in range(chips)]
    for chip, (got, exp) in enumerate(zip(run["outputs"], want, strict=True)):
        bad = np.flatnonzero(got != exp)
        assert got.shape == exp.shape and not bad.size, \
            f"chip {chip}: element {bad[:1]} {got[bad[:1]]} != golden {exp[bad[:1]]}"
    model = predicted_cycles(req, TINY.link_bytes_per_cycle, TINY.link_latency_cycles)
    assert run["cycles"] == model, f"{run['cycles']} cycles, model {model}"
    alone = predicted_cycles(one, TINY.link_bytes_per_cycle, TINY.link_latency_cycles)
    assert run["cycles"] < chunks * alone, "no faster than one command per chunk"
