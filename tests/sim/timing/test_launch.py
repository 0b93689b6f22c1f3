"""The launch-level timing model (sim.timing.launch) against the cycle model."""

import dataclasses

import numpy as np
import pytest

from hw.spec import ModelConfig, npu_preset
from hw.spec.collective import CollectiveRequest
from hw.spec.isa import Unit
from hw.spec.topology import Topology
from sim.compiler import collective_launch as cl
from sim.compiler.assembler import Assembler
from sim.compiler.hidden import compile_hidden
from sim.compiler.quantize import quantize_model
from sim.compiler.torus_collective import torus_collective
from sim.golden.float_model import random_weights
from sim.iss import IssError
from sim.strategies import compile_program
from sim.timing.cycle import time_programs
from sim.timing.launch import LaunchTimer, time_programs_fast


def programs(npu, cfg, strategy, chips, samples=1):
    x = np.random.default_rng(0).standard_normal((samples, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 0), x)
    prog = compile_program(strategy, npu, qm, chips, seq=cfg.seq_len, samples=samples)
    return [c.program for c in prog.chips]


TINY = npu_preset("tiny")
SMALL = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_ff=32, seq_len=6,
                    name="small")
POST = dataclasses.replace(SMALL, norm="post", causal=False, name="post")


@pytest.mark.parametrize("cfg", [SMALL, POST], ids=["pre", "post"])
@pytest.mark.parametrize("strategy, chips", [("single", 1), ("head", 2)])
def test_equals_the_cycle_model_without_overlaps(cfg, strategy, chips):
    """Single and head-parallel programs: every launch alone on its unit (a collective timed
    from each member's own launch): the same cycles, busy counters and trace."""
    ps = programs(TINY, cfg, strategy, chips)
    exact, fast = time_programs(TINY, ps), time_programs_fast(TINY, ps)
    assert fast.cycles == exact.cycles
    for c, (a, b) in enumerate(zip(exact.chips, fast.chips, strict=True)):
        assert a.busy == b.busy, (c, a.busy, b.busy)
        assert a.trace == b.trace, c


def test_pipeline_within_one_percent():
    """A SEND competes with the next microbatch's compute for the transfer bank: the one
    overlap the launch-level model leaves out."""
    ps = programs(TINY, SMALL, "pipeline", 2, samples=2)
    exact, fast = time_programs(TINY, ps).cycles, time_programs_fast(TINY, ps).cycles
    assert abs(fast - exact) <= 0.01 * exact, (fast, exact)


@pytest.mark.parametrize("cfg, chips, widths", [
    (ModelConfig(n_layers=1, d_model=8, n_heads=1, d_head=8, d_ff=16, seq_len=4, name="h1x8"),
     2, None),
    (ModelConfig(n_layers=1, d_model=16, n_heads=4, d_head=4, d_ff=32, seq_len=4, name="h4x4"),
     3, [4, 6, 6]),
    (SMALL, 2, None), (SMALL, 4, None)])
def test_hidden_equals_the_cycle_model(cfg, chips, widths):
    """Hidden-dimension programs: the split-score passes (2 chips sharing a head; 3 uneven
    chips, a head split over two beside chips with whole heads; 4 chips, two split heads),
    the projections' reduce-scatters beside the next row block's matmul, members launching
    their COLLs at different cycles (each timed from its own launch): equal to the cycle
    model (the launch-level model's bound elsewhere is 1%)."""
    x = np.random.default_rng(0).standard_normal((1, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 0), x)
    ps = [c.program for c in compile_hidden(TINY, qm, chips, widths=widths).chips]
    exact, fast = time_programs(TINY, ps).cycles, time_programs_fast(TINY, ps).cycles
    print(f"cycle model {exact}, launch-level {fast}")
    assert fast == exact


def test_long_launches():
    """A wider model on an 8-wide chip: launches long enough to be timed by the closed forms
    or cut down and extended (a causal window: interleaved attention); still equal."""
    npu = dataclasses.replace(npu_preset("fpga"), sram_bytes=1 << 21, imem_words=8192)
    cfg = ModelConfig(n_layers=1, d_model=64, n_heads=2, d_head=32, d_ff=128, seq_len=80,
                      window=16, name="wide")
    ps = programs(npu, cfg, "single", 1)
    timer = LaunchTimer(npu)
    assert time_programs_fast(npu, ps, timer=timer).cycles == time_programs(npu, ps).cycles


def test_memoises_launches_by_shape():
    ps = programs(TINY, dataclasses.replace(SMALL, n_layers=4), "single", 1)
    timer = LaunchTimer(TINY)
    calls = []
    original = timer.simulate

    def counted(op, regs):
        calls.append(op)
        return original(op, regs)

    timer.simulate = counted
    time_programs_fast(TINY, ps, timer=timer)
    first = len(calls)
    time_programs_fast(TINY, ps, timer=timer)
    assert len(calls) == first


def test_a_program_that_cannot_go_on():
    req = CollectiveRequest("all_reduce", "sum", 32, 4, 2)
    asm = Assembler()
    cl.emit(asm, cl.coll_launch(req, 0, in_base=0, out_base=64, size=4, link_bytes=4))
    asm.halt()
    lone = Assembler()
    lone.halt()
    with pytest.raises(IssError, match="cannot go on .*chip 0"):
        time_programs_fast(TINY, [asm.words(), lone.words()])


@pytest.mark.parametrize("nbytes, algorithm", [(4096, "halves"), (64, "rows_columns")])
def test_two_engines_on_a_torus_are_timed_as_the_cycle_model_times_them(nbytes, algorithm):
    """The 2-D all-reduce's programs on a 4 x 4 torus (both engines of every chip at once, on
    rows' and columns' rings): the launch-level model gives the cycle model's cycles."""
    npu, topo = npu_preset("tiny"), Topology((4, 4))
    plan = torus_collective("all_reduce", "sum", 32, nbytes // 4, topo, base=0, size=4,
                            link_bytes=4, algorithm=algorithm, half_base=8192)
    programs = []
    for c in range(16):
        asm = Assembler()
        plan.emit(asm, c, 4)
        asm.wait(Unit.ALL)
        asm.halt()
        programs.append(asm.words())
    exact = time_programs(npu, programs, topology=topo)
    fast = time_programs_fast(npu, programs, topology=topo)
    assert fast.cycles == exact.cycles, (fast.cycles, exact.cycles)
    assert [c.busy for c in fast.chips] == [c.busy for c in exact.chips]
