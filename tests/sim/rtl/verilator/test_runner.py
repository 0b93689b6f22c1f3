"""sim.rtl.verilator.runner: ChipSystem's chips and links as Verilated nodes under the C++ harness
give what Amaranth's simulator gives (output integers, cycles, busy counters, traces) and name
hung chips.

One chip is compared with pysim directly; four chips with the ISS and its cycle model, which the
pysim tests hold to Amaranth's simulator. Every chip count runs on the one build of the tiny
preset's node."""

import dataclasses

import numpy as np
import pytest

from hw.spec import ModelConfig, npu_preset
from hw.spec.collective import CollectiveRequest
from hw.spec.topology import Topology
from sim.compiler.assembler import Assembler
from sim.compiler.collective_launch import coll_launch
from sim.compiler.collective_launch import emit as emit_collective
from sim.compiler.quantize import quantize_input, quantize_model
from sim.errors import Watchdog
from sim.flows.simulate import simulate
from sim.golden.float_model import random_weights
from sim.golden.layer import model_int
from sim.iss import IssSystem
from sim.rtl.chip_runner import run_chip_pysim
from sim.rtl.pysim import SimulationTimeout
from sim.rtl.system_runner import run_system_pysim
from sim.rtl.verilator.runner import run_bare_loop, run_system_verilator
from sim.strategies import compile_program
from sim.timing.cycle import time_programs, trace_entries
from tests.helpers import seeded, torus_programs

pytestmark = [pytest.mark.verilator, pytest.mark.usefixtures("verilator_ok")]

#: One pre-norm block of d_model 16 over 4 tokens.
SMALL = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_ff=32, seq_len=4,
                    name="small")
#: Four heads and four layers, for head and pipeline parallelism on 4 chips.
FOUR = ModelConfig(n_layers=4, d_model=16, n_heads=4, d_head=4, d_ff=32, seq_len=4,
                   name="small4")


def compiled(rng, strategy, chips, *, cfg=SMALL, samples=1, npu=None):
    """``(npu, program, input images per chip, golden outputs)`` for ``strategy`` (on the
    tiny preset's chip unless ``npu`` is given)."""
    npu = npu or npu_preset("tiny")
    x = rng.standard_normal((samples, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, int(rng.integers(1 << 30))), x)
    prog = compile_program(strategy, npu, qm, chips, seq=cfg.seq_len, samples=samples)
    x_ints = [quantize_input(qm, s) for s in x]
    return npu, prog, prog.images(x_ints), [model_int(qm, xi) for xi in x_ints]


def outputs(prog, regions):
    taken = [0] * len(prog.chips)
    out = []
    for place in prog.outputs:
        out.append(place.read(regions[place.chip][taken[place.chip]], prog.seq,
                              prog.cfg.d_model))
        taken[place.chip] += 1
    return out


def iss_reference(npu, programs, images, reads, topology=None):
    """What run_system_pysim returns (regions, cycles, counters, traces), from the ISS and its
    cycle model (on ``topology``: a ring or a torus)."""
    system = IssSystem(npu, len(programs), topology)
    for iss, image in zip(system.chip, images, strict=True):
        for base, words in image.items():
            iss.write_words(base, words)
    system.run(programs)
    timed = time_programs(npu, programs, ring=True, topology=topology)
    return {"regions": [[iss.read_words(b, w) for b, w in chip_reads]
                        for iss, chip_reads in zip(system.chip, reads, strict=True)],
            "cycles": timed.cycles, "chip_cycles": [c.cycles for c in timed.chips],
            "busy_cycles": [c.busy for c in timed.chips], "errors": [False] * len(programs),
            "traces": [trace_entries(npu, c.trace) for c in timed.chips]}


def assert_same(fast, ref, chips, what="pysim"):
    """Every integer, cycle count, counter and trace entry of ``fast`` equals ``ref``'s."""
    for c in range(chips):
        for r, (a, b) in enumerate(zip(fast["regions"][c], ref["regions"][c], strict=True)):
            bad = np.argwhere(a != b)
            assert not len(bad), f"chip {c} region {r}: word {bad[0][0]} byte {bad[0][1]} " \
                f"{a[tuple(bad[0])]} != {what} {b[tuple(bad[0])]}"
    for key in ("cycles", "chip_cycles", "busy_cycles", "errors"):
        assert fast[key] == ref[key], f"{key}: verilator {fast[key]} != {what} {ref[key]}"
    for c in range(chips):
        got, want = fast["traces"][c], ref["traces"][c]
        assert got["overflow"] == want["overflow"], f"chip {c} trace overflow"
        assert len(got["entries"]) == len(want["entries"]), f"chip {c}: trace lengths " \
            f"{len(got['entries'])} != {len(want['entries'])}"
        for k, (a, b) in enumerate(zip(got["entries"], want["entries"], strict=True)):
            assert a == b, f"chip {c} trace entry {k}: {a} != {what} {b}"


def check_types(out, chips, word_bytes):
    """The keys and types of run_system_pysim's contract, plus this runner's own."""
    assert isinstance(out["cycles"], int) and len(out["chip_cycles"]) == chips
    for regions in out["regions"]:
        for words in regions:
            assert words.dtype == np.uint8 and words.ndim == 2 and words.shape[1] == word_bytes
    for trace in out["traces"]:
        assert isinstance(trace["overflow"], bool)
        assert all(isinstance(e, tuple) and len(e) == 2 and all(isinstance(v, int) for v in e)
                   for e in trace["entries"])
    assert all(isinstance(e, bool) for e in out["errors"])
    for key in ("load_cycles", "wall_s", "cycles_per_s", "build_s", "build_cached",
                "run_wall_s", "run_cycles_per_s"):
        assert key in out, key


@pytest.mark.slow
def test_single_chip_equals_pysim(rng):
    """--strategy single: ChipSystem(1) under Verilator == Chip in pysim (the path simulate()
    takes for pysim on one chip), traces included. Slow: make test compares each with the ISS
    (tests/hw/test_chip.py)."""
    npu, prog, images, want = compiled(rng, "single", 1, cfg=ModelConfig(
        n_layers=2, d_model=16, n_heads=2, d_head=8, d_ff=32, seq_len=6, norm="post",
        name="small2"))
    program, reads = prog.chips[0].program, prog.reads()
    fast = run_system_verilator(npu, [program], images, reads, max_cycles=200_000)
    ref = run_chip_pysim(npu, program, images[0], reads[0], max_cycles=200_000)
    check_types(fast, 1, npu.word_bytes)
    ref = {"regions": [ref["regions"]], "cycles": ref["cycles"], "chip_cycles": [ref["cycles"]],
           "busy_cycles": [ref["busy_cycles"]], "errors": [ref["error"]],
           "traces": [ref["trace"]]}
    assert_same(fast, ref, 1)
    assert all((g == w).all() for g, w in zip(outputs(prog, fast["regions"]), want,
                                              strict=True))
    print(f"{fast['cycles']} cycles: verilator {fast['run_cycles_per_s']:.0f} cycles/s")


@pytest.mark.parametrize("strategy", ["head", "pipeline"])
def test_four_chips_equal_the_iss(rng, strategy):
    """--strategy head (one layer) / pipeline on 4 chips (the pipeline with 2 samples in 2
    microbatches): the ISS's integers, its cycle model's cycles, busy counters and traces."""
    samples = 2 if strategy == "pipeline" else 1
    cfg = FOUR if strategy == "pipeline" else dataclasses.replace(FOUR, n_layers=1)
    npu, prog, images, want = compiled(rng, strategy, 4, cfg=cfg, samples=samples)
    programs, reads = [c.program for c in prog.chips], prog.reads()
    fast = run_system_verilator(npu, programs, images, reads, max_cycles=200_000)
    check_types(fast, 4, npu.word_bytes)
    assert_same(fast, iss_reference(npu, programs, images, reads), 4, "the ISS")
    assert max(fast["busy_cycles"][c][4] + fast["busy_cycles"][c][3] for c in range(4)) > 0, \
        "no chip ever sent or joined a collective"
    assert all((g == w).all() for g, w in zip(outputs(prog, fast["regions"]), want,
                                              strict=True))
    print(f"{fast['cycles']} cycles: verilator {fast['run_cycles_per_s']:.0f} cycles/s")


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_the_deep_vector_pipeline_chip_equals_the_iss(rng, norm):
    """The ulx3s preset's chip, whose vector unit has the deep pipeline (13 stages, a 21-cycle
    rsqrt: ``vector_pipeline = "deep"``) and its attention engine the deep one (3 output
    registers: ``attention_pipeline = "deep"``), runs a one-layer model (LayerNorm, attention,
    GELU, residual adds, requantisations) with the ISS's integers and its cycle model's cycles,
    busy counters and traces."""
    npu = npu_preset("ulx3s")
    assert npu.vector_pipeline == npu.attention_pipeline == "deep"
    npu, prog, images, want = compiled(rng, "single", 1, npu=npu,
                                       cfg=dataclasses.replace(SMALL, norm=norm))
    programs, reads = [c.program for c in prog.chips], prog.reads()
    fast = run_system_verilator(npu, programs, images, reads, max_cycles=200_000)
    check_types(fast, 1, npu.word_bytes)
    assert_same(fast, iss_reference(npu, programs, images, reads), 1, "the ISS")
    assert all((g == w).all() for g, w in zip(outputs(prog, fast["regions"]), want,
                                              strict=True))
    print(f"{fast['cycles']} cycles, build {fast['build_s']:.0f} s "
          f"(cached {fast['build_cached']})")


def test_the_ring_needs_one_pass_a_cycle(rng):
    """The harness settles the ring's signals between the models in one pass a cycle
    (hw.system.ChipNode: cut at the link's registers). ``check_cut`` tests at every settle that a
    second pass would change nothing, under link stalls too; the results are the same."""
    npu, prog, images, want = compiled(rng, "pipeline", 4, cfg=FOUR, samples=2)
    programs, reads = [c.program for c in prog.chips], prog.reads()
    for stalls in (0.0, 0.3):
        fast = run_system_verilator(npu, programs, images, reads, link_stalls=stalls, seed=4)
        checked = run_system_verilator(npu, programs, images, reads, link_stalls=stalls, seed=4,
                                       check_cut=True)
        for key in ("cycles", "chip_cycles", "busy_cycles", "traces"):
            assert checked[key] == fast[key], key
        assert all((g == w).all() for g, w in zip(outputs(prog, checked["regions"]), want,
                                                  strict=True))


def test_link_stalls_change_cycles_not_integers(rng):
    """Stalls from the harness's generator: the same outputs, more cycles, one seed one
    pattern. A pipeline: its sends sit on the critical path (a head group's short
    reduce-scatters and all-gathers can absorb a stall pattern)."""
    npu, prog, images, want = compiled(rng, "pipeline", 4, cfg=FOUR, samples=2)
    programs, reads = [c.program for c in prog.chips], prog.reads()
    calm = run_system_verilator(npu, programs, images, reads)
    runs = [run_system_verilator(npu, programs, images, reads, link_stalls=0.3, seed=s)
            for s in (1, 1, 2, 3)]
    for out in runs:
        assert all((g == w).all() for g, w in zip(outputs(prog, out["regions"]), want,
                                                  strict=True))
        assert out["cycles"] > calm["cycles"]
    assert runs[0]["cycles"] == runs[1]["cycles"] and runs[0]["traces"] == runs[1]["traces"]
    # Other seeds, other patterns (two seeds' totals can coincide; their traces rarely do).
    assert any((r["cycles"], r["traces"]) != (runs[0]["cycles"], runs[0]["traces"])
               for r in runs[2:]), [r["cycles"] for r in runs]


def test_watchdog_names_the_hung_chip():
    """Chip 0 joins an all-reduce that chip 1 never starts: SimulationTimeout names chip 0's pc
    and busy unit (and not the halted chip), in the words of pysim's 2-chip system."""
    npu = npu_preset("tiny")
    req = CollectiveRequest("all_reduce", "sum", 32, 8, 2)
    launch = coll_launch(req, 0, in_base=0, out_base=64, size=npu.array_size,
                         link_bytes=npu.link_bytes_per_cycle)
    asm, halt = Assembler(), Assembler()
    emit_collective(asm, launch)
    asm.halt()
    halt.halt()
    programs = [asm.words(), halt.words()]
    images = [{0: launch.pack_input(np.arange(8))}, {}]
    messages = []
    for run in (run_system_verilator, run_system_pysim):
        with pytest.raises(SimulationTimeout, match="max_cycles=500: chip 0 at pc") as info:
            run(npu, programs, images, [[], []], max_cycles=500)
        messages.append(str(info.value))
    assert "busy with collective" in messages[0] and "chip 1" not in messages[0]
    assert messages[0] == messages[1]


def test_bare_loop_is_the_same_model():
    """The bare loop clocks the runner's own build: after the runner has run (and built, in a
    fresh cache) one chip, the loop finds that build cached, for a ring of one and of 16."""
    npu = npu_preset("tiny")
    halt = Assembler()
    halt.halt()
    run_system_verilator(npu, [halt.words()], [{}], [[]], max_cycles=100)
    for chips, cycles in ((1, 20_000), (16, 2_000)):
        out = run_bare_loop(npu, chips, cycles)
        assert out["cycles"] == cycles and out["build_cached"] and out["cycles_per_s"] > 0
    with pytest.raises(ValueError, match="chips must be a positive integer, not 0"):
        run_bare_loop(npu, 0, 10)


def test_rejections():
    npu = npu_preset("tiny")
    with pytest.raises(ValueError, match="2 programs but 1 images and 2 reads"):
        run_system_verilator(npu, [[], []], [{}], [[], []])
    with pytest.raises(ValueError, match="chip 0's program of 4097 instructions exceeds"):
        run_system_verilator(npu, [[0] * 4097], [{}], [[]])
    with pytest.raises(ValueError, match=r"link_stalls 1.0 is outside \[0, 1\)"):
        run_system_verilator(npu, [[]], [{}], [[]], link_stalls=1.0)
    with pytest.raises(ValueError, match="chips must be 1..1024, not 1025"):
        run_system_verilator(npu, [[]] * 1025, [{}] * 1025, [[]] * 1025)
    with pytest.raises(ValueError, match="4 programs for the 8 chips of the 2x4"):
        run_system_verilator(npu, [[]] * 4, [{}] * 4, [[]] * 4, topology=Topology((2, 4)))


@pytest.mark.parametrize("strategy, chips", [("single", 1), ("head", 4), ("pipeline", 4)])
def test_simulate_runs_every_chip_count_on_verilator(strategy, chips):
    """sim.flows.simulate dispatches --backend verilator to this runner for any chip count (link
    stalls too, on several chips): bit-exact with the golden model, cycles and traces there."""
    stalls = 0.2 if chips > 1 else 0.0
    report = simulate(npu_preset("tiny"), FOUR, strategy=strategy, chips=chips, batch=2,
                      backend="verilator", link_stalls=stalls)
    assert report.golden_match and report.cycles > 0
    assert all(span is not None for span in report.spans)


def test_simulate_watchdog_on_verilator():
    with pytest.raises(Watchdog, match=r"within max_cycles=50: chip 0 at pc \d+ busy with"):
        simulate(npu_preset("tiny"), SMALL, backend="verilator", max_cycles=50)



# --- a torus: the torus's node (a link per dimension), joined along rows and columns ---------

def test_torus_collectives_and_sends_equal_the_iss():
    """A 2 x 2 torus: every row all-reduces on collective engine 0 while every column
    all-reduces on engine 1, and messages cross both dimensions: the ISS's integers and its
    cycle model's cycles, busy counters and traces; the harness's one pass a cycle holds on
    both dimensions' links (``check_cut``), under link stalls on both too."""
    npu, topo = npu_preset("tiny"), Topology((2, 2))
    programs, images = torus_programs(npu, topo, [(0, 3), (1, 2), (2, 0)], seeded(41))
    reads = [[(0, 300)]] * 4
    fast = run_system_verilator(npu, programs, images, reads, topology=topo, check_cut=True)
    check_types(fast, 4, npu.word_bytes)
    assert_same(fast, iss_reference(npu, programs, images, reads, topo), 4, "the ISS")
    stalled = run_system_verilator(npu, programs, images, reads, topology=topo,
                                   link_stalls=0.3, seed=3, check_cut=True)
    assert all((a == b).all() for c in range(4)
               for a, b in zip(stalled["regions"][c], fast["regions"][c], strict=True))
    assert stalled["cycles"] > fast["cycles"]
    print(f"{fast['cycles']} cycles, {stalled['cycles']} with stalls")


def test_a_deadlock_on_the_torus_ends_at_the_watchdog_naming_the_waiting_chips():
    """Chip 2 never joins its column's all-reduce: chip 0 waits for it, the watchdog names
    chip 0 (busy with its collective) and not the halted chips."""
    npu, topo = npu_preset("tiny"), Topology((2, 2))
    programs, images = torus_programs(npu, topo, [], seeded(42))
    programs[2] = programs[2][-1:]                   # chip 2 only halts
    with pytest.raises(SimulationTimeout, match=r"max_cycles=3000: chip 0 at pc \d+ busy with "
                                                r"collective") as info:
        run_system_verilator(npu, programs, images, [[]] * 4, topology=topo, max_cycles=3000)
    assert "chip 2" not in str(info.value)


@pytest.mark.parametrize("strategy, grid, dims, batch", [
    ("head+pipeline", "2x2", (2, 2), 2),
    pytest.param("data+head", "2x2", (2, 2), 2, marks=pytest.mark.slow),
    pytest.param("head+pipeline", "2x4", (2, 4), 2, marks=pytest.mark.slow),
    ("data+head", "2x4", (4, 2), 2),
    ("head+pipeline", "4x4", (4, 4), 2),
    pytest.param("data+head", "4x4", (4, 4), 4, marks=pytest.mark.slow),
])
def test_grids_on_the_torus_of_their_shape_equal_the_iss(strategy, grid, dims, batch):
    """A grid on the torus of its shape (head+pipeline AxB on an A x B torus, data+head on a
    B x A one) through the flow on Verilator, from the one build of the torus's node: bit-exact
    with the golden model, and the cycles and every chip's busy counters of the ISS's cycle
    model."""
    npu = dataclasses.replace(npu_preset("tiny"), topology=Topology(dims))
    kw = {"strategy": strategy, "grid": grid, "batch": batch, "seed": 3, "reference": "none"}
    fast = simulate(npu, FOUR, backend="verilator", **kw)
    iss = simulate(npu, FOUR, backend="iss", **kw)
    assert fast.golden_match and iss.golden_match
    assert fast.cycles == iss.cycles, (fast.cycles, iss.cycles)
    for a, b in zip(fast.per_chip, iss.per_chip, strict=True):
        assert a.busy == b.busy, (a.chip, a.busy, b.busy)
    print(f"{strategy} {grid} on {dims}: {fast.cycles} cycles")
