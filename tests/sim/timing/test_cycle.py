"""The ISS's cycle model (sim.timing.cycle): the RTL's cycles, busy counters and traces."""

import dataclasses

import numpy as np
import pytest

import hw.tile.ports as ports
from hw.spec import ModelConfig, model_preset, npu_preset
from hw.spec.collective import CollectiveRequest
from hw.spec.formats import OutMode
from hw.spec.isa import Op, Unit
from sim.compiler import attention_launch as al_
from sim.compiler import collective_launch as cl
from sim.compiler import p2p_launch as pl
from sim.compiler import vector_launch as vl
from sim.compiler.assembler import Assembler
from sim.compiler.descriptors import emit_matmul, matmul_launch
from sim.compiler.quantize import quantize_input, quantize_model
from sim.flows.simulate import read_outputs, simulate
from sim.golden.float_model import random_weights
from sim.golden.layer import model_int
from sim.iss import IssError
from sim.rtl.chip_runner import run_chip_pysim
from sim.rtl.system_runner import run_system_pysim
from sim.rtl.verilator.runner import run_system_verilator
from sim.strategies import compile_program
from sim.timing.cycle import time_programs, trace_depth
from tests.helpers import assert_cycle_model, small_npu
from tests.hw.test_system import build as build_collectives
from tests.sim.compiler import test_hidden as hidden


def test_trace_depth_follows_the_gateware():
    npu = npu_preset("tiny")
    assert trace_depth(npu) == ports.trace_depth(npu)


def compiled(strategy, chips, *, n_layers=1, samples=1, seed=0, golden=False, **model):
    """A small model compiled for the tiny chip: the system program and its images (and,
    ``golden``, each sample's golden output in the merge order the program records)."""
    fields = {"n_layers": n_layers, "d_model": 8, "n_heads": 2, "d_head": 4, "d_ff": 16,
              "seq_len": 4, "name": "small"} | model
    cfg = ModelConfig(**fields)
    npu = npu_preset("tiny")
    x = np.random.default_rng(seed).standard_normal((samples, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, seed), x)
    prog = compile_program(strategy, npu, qm, chips, seq=cfg.seq_len, samples=samples)
    x_ints = [quantize_input(qm, s) for s in x]
    if golden:
        kv_order = prog.meta.get("kv_order")
        return npu, prog, prog.images(x_ints), [model_int(qm, xi, kv_order=kv_order)
                                                for xi in x_ints]
    return npu, prog, prog.images(x_ints)


def assert_rtl_equal(npu, programs, images, *, ring=None, max_cycles=200_000,
                     backend="pysim", reads=None):
    """The cycle model and the RTL agree on cycles, busy counters and every trace entry.

    ``backend="verilator"``: ChipSystem's chips and links under Verilator (whose every integer,
    cycle and trace entry tests/sim/rtl/verilator/test_runner.py holds to pysim's and the cycle
    model's), on the tiny preset's one build that every Verilator test shares; otherwise
    Amaranth's simulator (the lone Chip for one program, ChipSystem for several). ``reads``:
    per chip, the ``(base, words)`` regions to read back; returns the RTL run's regions."""
    reads = reads or [[] for _ in programs]
    if backend == "verilator":
        assert not ring or len(programs) > 1, "ChipSystem(1) has no ring"
        out = run_system_verilator(npu, programs, images, reads, max_cycles=max_cycles)
        rtl = list(zip(out["chip_cycles"], out["busy_cycles"], out["traces"], strict=True))
        cycles = out["cycles"]
    elif len(programs) == 1 and not ring:
        out = run_chip_pysim(npu, programs[0], images[0], reads[0], max_cycles=max_cycles)
        rtl = [(out["cycles"], out["busy_cycles"], out["trace"])]
        out["regions"] = [out["regions"]]
        cycles = out["cycles"]
    else:
        out = run_system_pysim(npu, programs, images, reads, max_cycles=max_cycles)
        rtl = list(zip(out["chip_cycles"], out["busy_cycles"], out["traces"], strict=True))
        cycles = out["cycles"]
    model = assert_cycle_model(npu, programs, rtl, ring=ring)
    assert model.cycles == cycles, (model.cycles, cycles)
    print(f"cycles={cycles}")
    return out["regions"]


@pytest.mark.parametrize("norm, causal, norm_kind", [("pre", True, "layernorm"),
                                                     ("post", False, "layernorm"),
                                                     ("pre", True, "rmsnorm")])
@pytest.mark.verilator
@pytest.mark.usefixtures("verilator_ok")
def test_one_block_on_one_chip(norm, causal, norm_kind):
    """LN (RMS for RMSNorm), matmuls (int8, int16 out), attention (causal, bidirectional), LUT,
    residual adds, post-norm's input requant: every launch of a block."""
    npu, prog, images = compiled("single", 1, norm=norm, causal=causal, d_model=16, d_head=8,
                                 d_ff=32, seq_len=6, norm_kind=norm_kind)
    assert_rtl_equal(npu, [prog.chips[0].program], images, backend="verilator")


@pytest.mark.parametrize("causal", [True, pytest.param(False, marks=pytest.mark.slow)])
@pytest.mark.verilator
@pytest.mark.usefixtures("verilator_ok")
def test_long_passes_on_one_chip(causal):
    """Long context in passes (seq = 2 x attn_window: state launches first and last, the
    merge and the normalisation in the engine): the RTL's cycles, counters and trace are the
    model's, and its output is the golden's exact merge."""
    npu, prog, images, want = compiled("single", 1, causal=causal, d_model=16, d_head=8,
                                       d_ff=16, seq_len=2 * npu_preset("tiny").attn_window,
                                       seed=2, golden=True)
    assert prog.meta["kv_order"], "no long passes"
    regions = assert_rtl_equal(npu, [prog.chips[0].program], images, backend="verilator",
                               reads=prog.reads())
    got = read_outputs(prog, regions)[0]
    bad = np.argwhere(got != want[0])
    assert not len(bad), f"output {bad[0].tolist()}: {got[tuple(bad[0])]}, want " \
        f"{want[0][tuple(bad[0])]}"


@pytest.mark.parametrize("causal", [True, pytest.param(False, marks=pytest.mark.slow)])
@pytest.mark.verilator
@pytest.mark.usefixtures("verilator_ok")
def test_ring_attention_on_four_chips(causal):
    """Ring attention (sequence, seq = 4 x attn_window on 4 chips): K/V chunks around the ring,
    each merged as it arrives (causal: in the zig-zag order, each chip an early and a late
    block); the RTL's cycles, counters and traces are the model's and the output the golden's
    exact merge in the ring's order."""
    npu, prog, images, want = compiled("sequence", 4, causal=causal, d_model=16, d_head=8,
                                       d_ff=16, seq_len=4 * npu_preset("tiny").attn_window,
                                       seed=3, golden=True)
    assert prog.meta["order"] == ("zigzag" if causal else "plain")
    regions = assert_rtl_equal(npu, [c.program for c in prog.chips], images,
                               backend="verilator", reads=prog.reads())
    got = read_outputs(prog, regions)[0]
    bad = np.argwhere(got != want[0])
    assert not len(bad), f"output {bad[0].tolist()}: {got[tuple(bad[0])]}, want " \
        f"{want[0][tuple(bad[0])]}"


@pytest.mark.verilator
@pytest.mark.usefixtures("verilator_ok")
def test_swiglu_block_on_one_chip():
    """A Llama-shaped block (RMSNorm, the gate and up matmuls, the SiLU LUT overlapping the up
    matmul, MUL, no biases): the cycle model equals the RTL on every launch, MUL's included."""
    npu, prog, images = compiled("single", 1, d_model=16, d_head=8, d_ff=32, seq_len=6,
                                 norm_kind="rmsnorm", activation="silu", ffn="gated",
                                 bias=False)
    assert_rtl_equal(npu, [prog.chips[0].program], images, backend="verilator")


@pytest.mark.verilator
@pytest.mark.usefixtures("verilator_ok")
def test_head_parallel_on_four_chips():
    """Partial sums, ring reduce-scatters and all-gathers, per-channel requant, on ChipSystem."""
    npu, prog, images = compiled("head", 4, **HIDDEN16)
    assert_rtl_equal(npu, [c.program for c in prog.chips], images, backend="verilator")


@pytest.mark.verilator
@pytest.mark.usefixtures("verilator_ok")
def test_hidden_split_heads_on_four_chips():
    """Hidden-dimension parallelism, two heads of 8 lanes each split over 2 of 4 chips: both
    split-score passes (the partial pass without V, the reduced pass without K), the scores'
    all-reduce between them, the LayerNorm statistics' all-reduces and the projections'
    pipelined reduce-scatters."""
    npu, prog, images = compiled("hidden", 4, d_model=16, n_heads=2, d_head=8, d_ff=32, seed=3)
    assert prog.meta["split_heads"] == [0, 1]
    assert_rtl_equal(npu, [c.program for c in prog.chips], images, backend="verilator")


# Three ChipSystem chips on pysim, about 40 s: in the slow suite. Sub-ring groups beside other
# chips are held to the cycle model on pysim in tests/hw/test_system.py, this program to the ISS
# (bit-exact) and the cycle model in tests/sim/compiler/test_hidden.py.
@pytest.mark.slow
def test_hidden_uneven_shards_on_three_chips():
    """Columns 4, 6, 6 of four heads of 4: head 2 split over chips 1 and 2 (a group that is
    not the whole ring, beside chips that each hold whole heads), the ordering tokens. On
    pysim: bit-exact with the golden model and the ISS, too."""
    qm, x_ints, prog = hidden.compiled(hidden.FOUR_HEADS, 3, seed=3, widths=[4, 6, 6])
    assert prog.meta["split_heads"] == [2]
    regions = assert_rtl_equal(prog.npu, [c.program for c in prog.chips], prog.images(x_ints),
                               reads=prog.reads(), max_cycles=50_000)
    got = hidden.outputs(prog, regions)
    hidden.assert_golden(qm, x_ints, got, "pysim, widths 4, 6, 6")
    assert np.array_equal(got, hidden.run_iss(prog, x_ints))


@pytest.mark.verilator
@pytest.mark.usefixtures("verilator_ok")
def test_pipeline_on_four_chips():
    """SEND/RECV with clear-to-send tokens while the stages compute (two microbatches)."""
    npu, prog, images = compiled("pipeline", 4, n_layers=4, samples=2)
    assert_rtl_equal(npu, [c.program for c in prog.chips], images, backend="verilator")


# The ChipSystem tests of tests/hw/test_system.py hold the cycle model to their pysim runs of
# these programs (with other data) in make test; these copies run in the slow suite.
@pytest.mark.slow
@pytest.mark.parametrize("case", ["matmul+collectives", "group", "send_recv+barrier"])
def test_collective_programs(case):
    """The ChipSystem test programs: all-gather of matmul results, all-reduce (int32, int64),
    reduce-scatter MAX; a group of two with a chip that only forwards; reduce-scatter AVG,
    a group all-gather, a send over the ring's wrap and a barrier."""
    reqs = {
        "matmul+collectives": (2, [CollectiveRequest("all_gather", "sum", 32, 32, 2),
                                   CollectiveRequest("all_reduce", "sum", 32, 10, 2),
                                   CollectiveRequest("reduce_scatter", "max", 32, 9, 2),
                                   CollectiveRequest("all_reduce", "sum", 64, 5, 2)], True),
        "group": (3, [CollectiveRequest("all_reduce", "sum", 32, 7, 3),
                      CollectiveRequest("all_reduce", "min", 32, 6, 3, first=2, count=2)],
                  False),
        "send_recv+barrier": (4, [
            CollectiveRequest("reduce_scatter", "avg", 64, 7, 4),
            CollectiveRequest("all_gather", "sum", 32, 7, 4, first=1, count=3),
            CollectiveRequest("send_recv", "sum", 32, 5, 4, first=3, count=2),
            CollectiveRequest("barrier", "sum", 32, 1, 4)], False),
    }
    chips, req, matmul = reqs[case]
    npu = small_npu()
    programs, images, _, _, _ = build_collectives(npu, chips, req, np.random.default_rng(1),
                                                  matmul=matmul)
    assert_rtl_equal(npu, programs, images)


@pytest.mark.slow
def test_point_to_point_through_other_chips_beside_collectives():
    """Chip 0 sends to chip 2 and chip 3 to chip 1 (each through a forwarding chip) while the
    groups {0, 1} and {2, 3} all-reduce at the same time."""
    npu = small_npu()
    n = npu.array_size
    rng = np.random.default_rng(1)
    programs, images = [], []
    for c in range(4):
        asm = Assembler()
        if c in (0, 3):
            pl.emit(asm, pl.send_launch(dest=(c + 2) % 4, desc=pl.contiguous(0, 16), size=n,
                                        link_bytes=npu.link_bytes_per_cycle))
        else:
            pl.emit(asm, pl.recv_launch(src=(c + 2) % 4, desc=pl.contiguous(40, 16), size=n,
                                        link_bytes=npu.link_bytes_per_cycle))
        req = CollectiveRequest("all_reduce", "sum", 32, 64, 4, first=0 if c < 2 else 2,
                                count=2)
        cl.emit(asm, cl.coll_launch_natural(req, c, base=100, size=n,
                                            link_bytes=npu.link_bytes_per_cycle))
        asm.wait(Unit.ALL)
        asm.halt()
        programs.append(asm.words())
        images.append({0: rng.integers(0, 256, (16, n), dtype=np.uint8)})
    assert_rtl_equal(npu, programs, images)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, chips, samples", [("single", 1, 1), ("head", 2, 1),
                                                      ("head", 4, 1), ("pipeline", 4, 4)])
def test_tiny_model_every_strategy(strategy, chips, samples):
    """The tiny preset model (4 layers, d_model 32) as `npu sim` runs it."""
    cfg = model_preset("tiny")
    npu = npu_preset("tiny")
    x = np.random.default_rng(0).standard_normal((samples, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 0), x)
    prog = compile_program(strategy, npu, qm, chips, seq=cfg.seq_len, samples=samples)
    images = prog.images([quantize_input(qm, s) for s in x])
    assert_rtl_equal(npu, [c.program for c in prog.chips], images, max_cycles=1_000_000)


#: Hidden parallelism on 2..4 chips: 16 columns, heads of 4 split on 3 chips.
HIDDEN16 = {"d_model": 16, "n_heads": 4, "d_head": 4, "d_ff": 32}


@pytest.mark.parametrize("strategy, chips, samples, model", [
    ("single", 1, 1, {}), ("head", 2, 1, {}), ("pipeline", 2, 2, {}),
    ("hidden", 2, 1, {"n_heads": 1, "d_head": 8}), ("hidden", 3, 1, HIDDEN16),
    ("hidden", 4, 2, HIDDEN16)])
def test_cycles_do_not_depend_on_the_data(strategy, chips, samples, model):
    """Different weights and inputs (so different scales) give the same program shape and the
    same cycles: the compiler drops a SET only when its value and its source repeat."""
    runs = []
    for seed in (0, 2, 5):
        npu, prog, _ = compiled(strategy, chips, n_layers=2, samples=samples, seed=seed,
                                **model)
        programs = [c.program for c in prog.chips]
        runs.append(([len(p) for p in programs], time_programs(npu, programs).cycles))
        print(f"seed={seed}: instructions {runs[-1][0]}, cycles {runs[-1][1]}")
    assert runs[0] == runs[1] == runs[2], runs


def test_a_chip_that_never_halts_is_reported():
    npu = small_npu()
    req = CollectiveRequest("all_reduce", "sum", 32, 4, 2)
    launch = cl.coll_launch(req, 0, in_base=0, out_base=64, size=npu.array_size,
                            link_bytes=npu.link_bytes_per_cycle)
    asm = Assembler()
    cl.emit(asm, launch)
    asm.halt()
    other = Assembler()
    other.halt()
    with pytest.raises(IssError, match="did not all halt within 500 cycles .*chip 0 at pc"):
        time_programs(npu, [asm.words(), other.words()], max_cycles=500)


def test_lone_chip_and_matmul_chain():
    """Two matmuls, the second reading what the first wrote (WAIT between), one chip."""
    npu = dataclasses.replace(small_npu(), sram_bytes=4096)
    asm = Assembler()
    emit_matmul(asm, matmul_launch(size=4, m=8, k=8, n=12, a_base=0, a_row_words=2,
                                   b_base=16, p_base=64, c_base=200, c_row_words=3,
                                   mode=OutMode.INT8))
    asm.wait(Unit.MATMUL)
    emit_matmul(asm, matmul_launch(size=4, m=8, k=12, n=4, a_base=200, a_row_words=3,
                                   b_base=100, p_base=150, c_base=300, c_row_words=2,
                                   mode=OutMode.INT16))
    asm.launch(Op.NOP)
    asm.halt()
    assert_rtl_equal(npu, [asm.words()], [{}])


def test_packed_launches_on_one_chip():
    """Launches of packed operands: matmuls whose B is stored unpadded (zero rows past
    MM_B_ROWS, the last column block packed; its words in the A bank too), attention heads at
    lane offsets (rows of 1 to 3 words, Q, K and V from different lanes; one whole, one
    interleaved) and a REQUANT with ``keep``: the cycle model equals the RTL."""
    npu = dataclasses.replace(small_npu(), sram_bytes=4096)
    asm = Assembler()
    emit_matmul(asm, matmul_launch(size=4, m=8, k=12, n=11, a_base=0, a_row_words=3,
                                   b_base=40, p_base=80, c_base=200, c_row_words=3,
                                   mode=OutMode.INT8, b_rows=10, packed=True))
    emit_matmul(asm, matmul_launch(size=4, m=4, k=8, n=6, a_base=300, a_row_words=2,
                                   b_base=310, p_base=330, c_base=360, c_row_words=4,
                                   mode=OutMode.INT16, b_rows=7, packed=True))
    asm.wait(Unit.MATMUL)
    common = {"size": 4, "queries": 5, "keys": 5, "q_base": 200, "k_base": 200,
              "v_base": 200, "o_base": 400, "q_row_words": 3, "k_row_words": 3,
              "v_row_words": 3, "o_row_words": 2, "score_mult": 1, "score_shift": 8,
              "out_mult": 1, "out_shift": 8}
    for kw in ({"d_head": 3, "col": 1, "k_col": 4, "v_col": 9},
               {"d_head": 6, "col": 2, "k_col": 3, "v_col": 5, "o_col": 1,
                "interleaved": True, "window": 2},
               {"d_head": 4, "col": 4}):
        al_.emit(asm, al_.attention_launch(**common, **kw))
    asm.wait(Unit.ATTN)
    vl.emit(asm, vl.requant_launch(size=4, length=7, a=vl.Rows(400, 5, 2, 1),
                                   out=vl.Rows(420, 5, 2, 1), mult=3, shift=2, keep=True))
    asm.halt()
    assert_rtl_equal(npu, [asm.words()], [{}])


@pytest.mark.parametrize("strategy, chips, d_model, heads, backend", [
    pytest.param("head", 4, 16, 4, "verilator", marks=pytest.mark.verilator),
    pytest.param("hidden", 4, 16, 2, "verilator", marks=pytest.mark.verilator),
    pytest.param("head", 2, 8, 2, "pysim", marks=pytest.mark.slow),
    pytest.param("hidden", 2, 8, 1, "pysim", marks=pytest.mark.slow)])
def test_iss_reports_what_the_rtl_reports(strategy, chips, d_model, heads, backend, request):
    """`npu sim --backend iss`: the same cycles, per-chip busy and idle counts and collective
    cycles as `--backend verilator` (4 chips of the shared build) or `--backend pysim` on the same
    model (head-parallel; hidden, chips sharing heads). The pysim report is held to the ISS's
    in make test by tests/sim/flows/test_simulate.py's head on 3 chips."""
    if backend == "verilator":
        request.getfixturevalue("verilator_ok")
    cfg = ModelConfig(n_layers=1, d_model=d_model, n_heads=heads, d_head=d_model // heads,
                      d_ff=2 * d_model, seq_len=4, name="small")
    npu = npu_preset("tiny")
    iss = simulate(npu, cfg, strategy=strategy, chips=chips, backend="iss").to_json()
    rtl = simulate(npu, cfg, strategy=strategy, chips=chips, backend=backend).to_json()
    assert iss["cycles"] == rtl["cycles"] and iss["golden_match"] and rtl["golden_match"]
    assert [c["busy"] for c in iss["per_chip"]] == [c["busy"] for c in rtl["per_chip"]]
    assert iss["collectives"] == rtl["collectives"]
    assert iss.get("hidden") == rtl.get("hidden")
    if strategy == "hidden":
        assert rtl["hidden"]["split_heads"], rtl["hidden"]
