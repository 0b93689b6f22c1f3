"""Systems beyond 8 chips: 16 chips on a ring and a 4 x 4 torus, bit-exact on the ISS against
the single-chip golden; the launch-level model charges each torus dimension's links."""

import dataclasses

import numpy as np
import pytest

from hw.spec import ModelConfig, npu_preset
from hw.spec.topology import DimLink, Topology
from sim import strategies
from sim.compiler.quantize import quantize_input, quantize_model
from sim.flows.simulate import read_outputs, simulate
from sim.golden.float_model import random_weights
from sim.golden.layer import model_int
from sim.iss import IssSystem
from sim.timing.cycle import time_programs
from sim.timing.launch import time_programs_fast
from tests.helpers import TINY_MODEL, TINY_NPU, assert_one_line_error, check_report, run

TINY = npu_preset("tiny")


def _model(name, layers, d_model, heads, d_head, d_ff):
    return ModelConfig(n_layers=layers, d_model=d_model, n_heads=heads, d_head=d_head,
                       d_ff=d_ff, seq_len=4, name=name)


#: Sixteen heads for head parallelism on 16 chips (d_head 2: the tiny chip's scratchpad).
HEADS16 = _model("heads16", 1, 32, 16, 2, 32)
#: Sixteen layers for a 16-stage pipeline.
LAYERS16 = _model("layers16", 16, 16, 2, 8, 16)
#: Four heads and four layers: head+pipeline 4x4 (and the other grids) on 16 chips.
SMALL = _model("small4", 4, 16, 4, 4, 32)


def iss_run(npu, cfg, strategy, chips, *, grid=None, batch=1, seed=0):
    """The compiled programs on the ISS alone (no timing): outputs, the golden's, programs."""
    rng = np.random.default_rng(seed)
    weights = random_weights(cfg, seed)
    x = rng.standard_normal((batch, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, weights, x)
    prog = strategies.get(strategy).compile(npu, qm, chips, seq=cfg.seq_len, samples=batch,
                                            grid=grid)
    x_ints = [quantize_input(qm, s) for s in x]
    system = IssSystem(npu, chips)
    for iss, img in zip(system.chip, prog.images(x_ints), strict=True):
        for base, words in img.items():
            iss.write_words(base, words)
    system.run([c.program for c in prog.chips])
    reads = prog.reads()
    regions = [[system.chip[c].read_words(b, w) for b, w in reads[c]] for c in range(chips)]
    got = read_outputs(prog, regions)
    want = [model_int(qm, xi) for xi in x_ints]
    return np.stack(got), np.stack(want), prog


def assert_exact(got, want, what):
    assert got.shape == want.shape, what
    bad = np.argwhere(got != want)
    assert not len(bad), (f"{what}: first mismatch at {tuple(int(v) for v in bad[0])}: "
                          f"{int(got[tuple(bad[0])])} != golden {int(want[tuple(bad[0])])}")


@pytest.mark.parametrize("strategy, cfg, grid, batch", [
    ("head", HEADS16, None, 1),
    ("pipeline", LAYERS16, None, 2),
    ("data", SMALL, None, 16),
    ("head+pipeline", SMALL, "4x4", 2),
    ("data+head", SMALL, "4x4", 4),
    ("data+pipeline", SMALL, "4x4", 4),
    ("data+pipeline+head", SMALL, "2x2x4", 4),
])
def test_sixteen_chips_on_a_ring_are_bit_exact_on_the_iss(strategy, cfg, grid, batch):
    seed = 5
    print(f"seed={seed}")
    got, want, prog = iss_run(TINY, cfg, strategy, 16, grid=grid, batch=batch, seed=seed)
    assert len(prog.chips) == 16
    assert_exact(got, want, f"{strategy} {grid or ''} on 16 chips, seed {seed}")


def test_head_on_sixteen_chips_through_the_flow():
    """The whole flow on 16 chips: ISS, cycle model, report."""
    r = simulate(TINY, HEADS16, strategy="head", chips=16, backend="iss", seed=2,
                 reference="none")
    check_report(r, "head on 16 chips")
    assert sorted(sum((c.role["heads"] for c in r.per_chip), [])) == list(range(16))
    assert r.cycles > 0


def _torus(links=()):
    return dataclasses.replace(TINY, topology=Topology((4, 4), links))


def test_head_pipeline_on_a_4x4_torus_is_bit_exact_and_placed_on_rows_and_columns():
    """head+pipeline 4x4 on a 4 x 4 torus: stage s is row s (its head group's collectives on
    the row's ring), shard h is column h (each stage-to-stage send one hop along it)."""
    seed = 11
    print(f"seed={seed}")
    npu = _torus()
    r = simulate(npu, SMALL, strategy="head+pipeline", grid="4x4", backend="iss", seed=seed,
                 batch=2, reference="none")
    check_report(r, "head+pipeline 4x4 on the 4x4 torus")
    topo = npu.topology
    colls = [c for c in r.collectives if c["kind"] != "send"]
    sends = [c for c in r.collectives if c["kind"] == "send"]
    assert colls and sends
    for c in colls:
        first, count = c["group"]
        members = [(first + j) % 16 for j in range(count)]
        assert topo.ring_of(members) == 0, f"collective {c} is not on one row"
    for c in sends:
        assert topo.hops(c["from"], c["to"]) == (0, 1), f"send {c} is not one hop along y"


def test_the_torus_charges_each_dimension_its_links():
    """The same programs timed on the 4 x 4 torus: a slower cabled dimension (y, the sends)
    costs more, a slower row dimension (x, the collectives) too, each against the other's
    default; the row's ring beats the 16-chip ring's wrap through every other chip."""
    seed = 4
    print(f"seed={seed}")
    _, _, prog = iss_run(TINY, SMALL, "head+pipeline", 16, grid="4x4", batch=2, seed=seed)
    programs = [c.program for c in prog.chips]
    base = DimLink(TINY.link_bytes_per_cycle, TINY.link_latency_cycles)
    slow = DimLink(TINY.link_bytes_per_cycle // 2, 40)
    ring = time_programs_fast(TINY, programs).cycles
    even = time_programs_fast(TINY, programs, topology=Topology((4, 4))).cycles
    y_slow = time_programs_fast(TINY, programs, topology=Topology((4, 4), (base, slow))).cycles
    x_slow = time_programs_fast(TINY, programs, topology=Topology((4, 4), (slow, base))).cycles
    assert even == time_programs_fast(_torus((base, base)), programs).cycles
    assert even < ring, (even, ring)
    assert y_slow > even, (y_slow, even)
    assert x_slow > even, (x_slow, even)


def test_the_cli_runs_a_torus_and_refuses_an_inconsistent_one(capsys):
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", TINY_MODEL,
                           "--strategy", "head", "--topology", "2x2", "--backend", "iss")
    assert status == 0, err
    assert "speed-up" in out or "one chip" in out, out
    assert "4 chip(s) on the 2x2 torus" in out and "golden match: yes" in out, out
    assert_one_line_error(*run(capsys, "sim", "--npu", TINY_NPU, "--model", TINY_MODEL,
                               "--chips", "3", "--topology", "2x2", "--backend", "iss"),
                          "--chips 3 is not the 4 chips of --topology 2x2")
    assert_one_line_error(*run(capsys, "collective", "--npu", TINY_NPU, "--kind", "all_reduce",
                               "--chips", "1025"),
                          "chips must be 1..1024, not 1025")


def test_a_ring_with_links_of_its_own_is_timed_on_them():
    """A ring's [topology] links replace the NPU's in both timing models: the same width
    and latency give the same cycles, deeper links more."""
    seed = 6
    print(f"seed={seed}")
    _, _, prog = iss_run(TINY, HEADS16, "head", 16, seed=seed)
    programs = [c.program for c in prog.chips]
    own = DimLink(TINY.link_bytes_per_cycle, TINY.link_latency_cycles)
    deep = DimLink(TINY.link_bytes_per_cycle, TINY.link_latency_cycles + 30)
    plain = time_programs_fast(TINY, programs).cycles
    assert time_programs_fast(TINY, programs, topology=Topology((16,), (own,))).cycles == plain
    assert time_programs_fast(TINY, programs, topology=Topology((16,), (deep,))).cycles > plain
    assert time_programs(TINY, programs, link=own).cycles == time_programs(TINY, programs).cycles


def test_the_three_part_grid_on_its_torus_reports_its_links():
    """data+pipeline+head 2x2x2 on a 2 x 4 torus (C x AB: a head group per row, each replica's
    stages on consecutive rows): bit-exact, every head group's collectives on its row's ring,
    every stage-to-stage send one hop along a column, and the report says so."""
    seed = 9
    print(f"seed={seed}")
    npu = dataclasses.replace(TINY, topology=Topology((2, 4)))
    r = simulate(npu, SMALL, strategy="data+pipeline+head", grid="2x2x2", backend="iss",
                 seed=seed, batch=4, reference="none")
    check_report(r, "data+pipeline+head 2x2x2 on the 2x4 torus")
    assert r.grid == {"replicas": 2, "stages": 2, "shards": 2}
    colls = [c for c in r.collectives if c["kind"] != "send"]
    sends = [c for c in r.collectives if c["kind"] == "send"]
    assert colls and sends
    for c in colls:
        assert c["links"] == f"row {c['group'][0] // 2}", c
    for c in sends:
        assert c["links"] == f"column {c['from'] % 2} (1 hop)", c
    assert "on row 0, row 1, row 2, row 3" in r.summary()


@pytest.mark.slow
@pytest.mark.parametrize("strategy, cfg, grid, batch", [
    ("head", _model("heads64", 1, 64, 64, 1, 64), None, 1),
    ("pipeline", _model("layers64", 64, 16, 2, 8, 16), None, 2),
    ("data", SMALL, None, 64),
    ("head+pipeline", _model("h8l8", 8, 32, 8, 4, 64), "8x8", 2),
    ("data+head", _model("h8", 2, 32, 8, 4, 64), "8x8", 8),
    ("data+pipeline", _model("l8", 8, 16, 2, 8, 16), "8x8", 8),
    ("data+pipeline+head", _model("h4l4", 4, 16, 4, 4, 32), "4x4x4", 4),
])
def test_sixty_four_chips_are_bit_exact_on_the_iss(strategy, cfg, grid, batch):
    """64 chips (an 8 x 8 torus's, the same programs): every strategy and grid on the ISS."""
    got, want, prog = iss_run(TINY, cfg, strategy, 64, grid=grid, batch=batch, seed=7)
    assert len(prog.chips) == 64
    assert_exact(got, want, f"{strategy} {grid or ''} on 64 chips")
