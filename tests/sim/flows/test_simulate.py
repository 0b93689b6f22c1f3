"""sim.flows.simulate: every strategy on N chips equals the single-chip golden model bit for bit.

The broad matrix (strategies x chip counts x seeds x microbatches) runs on the ISS; the RTL runs
cover each multi-chip strategy against the ISS (head on 3 chips on pysim; head, pipeline, data
and the grids on 4 chips and head on 8 on Verilator, whose one build runs every chip count; the
longer pysim runs in the slow suite), and pysim's link stalls.
"""

import dataclasses
import json

import numpy as np
import pytest
from PIL import Image

from hw.spec import ConfigError, ModelConfig, model_preset, npu_preset
from hw.spec.isa import UNIT_NAMES
from sim.errors import BadInput
from sim.flows.simulate import simulate
from sim.report.chrome_trace import trace_events
from sim.report.plot import plot_timeline
from tests.helpers import PACKED, check_report

TINY = npu_preset("tiny")
#: Eight heads and eight layers: head and pipeline parallelism on up to 8 chips.
WIDE = ModelConfig(n_layers=8, d_model=32, n_heads=8, d_head=4, d_ff=32, seq_len=4,
                   name="wide8")
#: Small enough for pysim on 4 chips in about a minute.
SMALL = ModelConfig(n_layers=4, d_model=16, n_heads=4, d_head=4, d_ff=32, seq_len=4,
                    name="small4")
#: The tiny model with Llama's normalisation, RMSNorm.
TINY_RMS = dataclasses.replace(model_preset("tiny"), norm_kind="rmsnorm", name="tiny-rms")
#: The tiny model shaped like Llama: RMSNorm, SwiGLU (a SiLU-gated FFN), no biases.
TINY_LLAMA = dataclasses.replace(model_preset("tiny"), norm_kind="rmsnorm", activation="silu",
                                 ffn="gated", bias=False, name="tiny-llama-mha")
#: The Llama-shaped preset: also RoPE and 4 query heads on 2 K/V heads.
LLAMA = model_preset("tiny-llama")
#: Its grouped-query attention without RoPE, and its RoPE without grouped-query attention
#: (two layers: under sequence parallelism every chip holds every layer, and four layers of
#: full-width K, V and K' exceed the tiny chip's scratchpad).
LLAMA_GQA = dataclasses.replace(LLAMA, rope_theta=0.0, name="tiny-llama-gqa")
LLAMA_ROPE = dataclasses.replace(LLAMA, n_kv_heads=4, n_layers=2, name="tiny-llama-rope")


# Every chip count with seed 0; seed 7 on 3 and 8 chips (the rest in the slow suite).
@pytest.mark.parametrize("chips, seed", [
    pytest.param(chips, seed, marks=[pytest.mark.slow] if seed and chips not in (3, 8) else [])
    for seed in (0, 7) for chips in range(1, 9)])
def test_head_on_the_iss(chips, seed):
    r = simulate(TINY, WIDE, strategy="head", chips=chips, backend="iss", seed=seed)
    check_report(r, f"head on {chips} chips, seed {seed}")
    heads = [c.role["heads"] for c in r.per_chip]
    assert sum(heads, []) == list(range(8))
    kinds = [c["kind"] for c in r.collectives]
    L = WIDE.n_layers
    if chips > 1 and WIDE.seq_len % chips == 0:
        # Rows split over the group: per layer two reduce-scatters, the LayerNorm outputs
        # gathered (all but the first LN1), and the residual gathered at the end.
        assert kinds.count("reduce_scatter") == 2 * L and kinds.count("all_gather") == 2 * L
        assert "all_reduce" not in kinds
    else:
        assert kinds == ["all_reduce"] * 2 * L * (chips > 1)


# make test runs one chip, one microbatch on 2 chips, two on 3 and on 8 (every stage of one
# layer), four on 4 and 6 (a batch split evenly and unevenly over the stages); every other
# point of chips 1..8 x microbatches 1, 2, 4 is in the slow suite.
_PIPELINE_DEFAULT = {(1, 4), (2, 1), (3, 2), (8, 2), (4, 4), (6, 4)}


def _pipeline_slow(chips, microbatches):
    return (chips, microbatches) not in _PIPELINE_DEFAULT


@pytest.mark.parametrize("chips, microbatches", [
    pytest.param(chips, microbatches,
                 marks=[pytest.mark.slow] if _pipeline_slow(chips, microbatches) else [])
    for microbatches in (1, 2, 4) for chips in range(1, 9)])
def test_pipeline_on_the_iss(chips, microbatches):
    """WIDE's 64,000 bytes of weights do not fit one 64 KiB chip with a batch of 4: on one
    chip the same check runs on SMALL."""
    cfg = WIDE if chips > 1 else SMALL
    r = simulate(TINY, cfg, strategy="pipeline", chips=chips, backend="iss", batch=4,
                 microbatches=microbatches, seed=chips)
    check_report(r, f"pipeline on {chips} chips, {microbatches} microbatches")
    layers = [c.role["layers"] for c in r.per_chip]
    assert sum(layers, []) == list(range(cfg.n_layers))
    assert r.pipeline["microbatches"] == microbatches
    assert sum(1 for c in r.collectives if c["kind"] == "send") == (chips - 1) * microbatches


def test_uneven_splits_on_the_iss():
    """4 heads on 3 chips = 2, 1, 1; 4 layers on 3 chips = 2, 1, 1; 5 samples in 3
    microbatches = 2, 2, 1."""
    r = simulate(TINY, SMALL, strategy="head", chips=3, backend="iss", seed=3)
    check_report(r, "head 4 heads on 3 chips")
    assert [c.role["heads"] for c in r.per_chip] == [[0, 1], [2], [3]]
    assert [c.role["ffn_columns"] for c in r.per_chip] == [11, 11, 10]
    r = simulate(TINY, SMALL, strategy="pipeline", chips=3, backend="iss", batch=5,
                 microbatches=3, seed=4)
    check_report(r, "pipeline 4 layers on 3 chips")
    assert r.pipeline["layers_per_stage"] == [2, 1, 1]
    assert r.pipeline["microbatch_samples"] == [2, 2, 1]


@pytest.mark.parametrize("norm, causal, window", [("post", False, 0), ("pre", True, 3)])
def test_post_norm_and_windows_on_the_iss(norm, causal, window):
    cfg = ModelConfig(n_layers=4, d_model=16, n_heads=4, d_head=4, d_ff=32, seq_len=6,
                      norm=norm, causal=causal, window=window, name="variant")
    for strategy, chips in (("head", 4), ("pipeline", 4), ("pipeline", 2)):
        r = simulate(TINY, cfg, strategy=strategy, chips=chips, backend="iss", batch=2)
        check_report(r, f"{strategy} on {chips} chips, {norm}-norm, window {window}")


@pytest.mark.parametrize("strategy, chips", [("single", 1), ("head", 2), ("pipeline", 2),
                                             ("hidden", 2), ("sequence", 2)])
def test_rmsnorm_on_the_iss(strategy, chips):
    """norm_kind = "rmsnorm" end to end (RMS launches; hidden: LN_STATS, the all-reduce and
    RMS_APPLY): the golden integer model bit for bit, the float64 RMSNorm model within the
    usual quantisation error (cosine > 0.99; measured 0.9997)."""
    r = simulate(TINY, TINY_RMS, strategy=strategy, chips=chips, backend="iss", seed=1)
    check_report(r, f"rmsnorm, {strategy} on {chips} chips")
    print(f"{strategy} on {chips}: cosine {r.cosine:.5f}, {r.cycles} cycles")


@pytest.mark.parametrize("strategy, chips", [("single", 1), ("head", 2), ("pipeline", 2),
                                             ("sequence", 2), ("data", 2), ("hidden", 2),
                                             ("hidden", 3)])
def test_swiglu_on_the_iss(strategy, chips):
    """A Llama-shaped model (RMSNorm, SiLU-gated FFN, no biases) end to end (the gate matmul,
    the SiLU table, MUL; hidden: the gate's projection reduce-scattered like FFN1's, MUL on
    each chip's columns): the golden integer model bit for bit, the float64 model within the
    usual quantisation error (cosine > 0.99)."""
    r = simulate(TINY, TINY_LLAMA, strategy=strategy, chips=chips, backend="iss", seed=1,
                 batch=2 if strategy == "data" else 1)
    check_report(r, f"swiglu, {strategy} on {chips} chips")
    print(f"{strategy} on {chips}: cosine {r.cosine:.5f}, {r.cycles} cycles")


@pytest.mark.parametrize("strategy, chips, grid, batch", [
    ("single", 1, None, 1), ("head", 2, None, 1), ("head", 3, None, 1), ("head", 4, None, 1),
    ("pipeline", 2, None, 2), pytest.param("pipeline", 4, None, 4, marks=pytest.mark.slow),
    ("data", 2, None, 2),
    ("data+head", 4, "2x2", 2), ("head+pipeline", 4, "2x2", 2)])
def test_llama_on_the_iss(strategy, chips, grid, batch):
    """RoPE (the rotated projections beside QKV, MUL by the tables, ADD, per-lane REQUANT) and
    grouped-query attention (each query head on its K/V head; head on 4 chips holds each K/V
    head twice) end to end: the golden integer model bit for bit, near float64."""
    kw = {"grid": grid} if grid else {}
    r = simulate(TINY, LLAMA, strategy=strategy, chips=chips, backend="iss", seed=1,
                 batch=batch, **kw)
    check_report(r, f"llama, {strategy} on {chips} chips")
    print(f"{strategy} on {chips}: cosine {r.cosine:.5f}, {r.cycles} cycles")
    # Each chip holds the K/V heads of its query heads (2 query heads per K/V head).
    for c in r.per_chip:
        assert c.role["kv_heads"] == sorted({h // 2 for h in c.role["heads"]}), c.role
    if strategy == "head" and chips == 4:
        assert [c.role["kv_heads"] for c in r.per_chip] == [[0], [0], [1], [1]]


@pytest.mark.parametrize("cfg", [LLAMA, LLAMA_GQA, LLAMA_ROPE], ids=["llama", "gqa", "rope"])
@pytest.mark.parametrize("strategy, chips", [("sequence", 2), ("sequence", 4), ("hidden", 2),
                                             ("hidden", 3)])
def test_llama_tokens_and_columns_split_on_the_iss(strategy, chips, cfg):
    """RoPE and grouped-query attention under sequence parallelism (each chip rotates its
    chunk's Q and K at the chunk's own positions before the K/V rows go round the ring; the
    rows carry the K/V heads only) and hidden parallelism (the rotated projections' columns
    reduced onto the chips of the Q and K lanes they rotate; on 3 chips head 1 is split, its
    lanes 0..3 and their rotate-half partners 4..7 on different chips): bit for bit the
    golden, near float64."""
    r = simulate(TINY, cfg, strategy=strategy, chips=chips, backend="iss", seed=1)
    check_report(r, f"{cfg.name}, {strategy} on {chips} chips")
    if strategy == "hidden":
        assert bool(r.hidden["split_heads"]) == (chips == 3)
    print(f"{cfg.name} {strategy} on {chips}: cosine {r.cosine:.5f}, {r.cycles} cycles")


@pytest.mark.parametrize("model, strategy, chips, grid, batch", [
    pytest.param(model, strategy, chips, grid, batch, marks=[] if default else
                 [pytest.mark.slow])
    for model, runs in {
        "packed6-llama": ["single", "head2", "head3", "pipeline", "sequence", "data+head",
                          "head+pipeline", "data", "data+pipeline", "hidden"],
        "packed4": ["single", "head2", "pipeline", "data", "hidden", "sequence", "head3",
                    "data+head", "head+pipeline", "data+pipeline"],
        "packed6": ["hidden", "hidden3", "data+pipeline", "single", "head2", "head3", "pipeline",
                    "sequence", "data", "data+head", "head+pipeline"],
        "packed4-llama": ["head2", "sequence", "single", "head3", "pipeline", "data",
                          "hidden", "data+head", "head+pipeline", "data+pipeline"]}.items()
    for k, run in enumerate(runs)
    for default in [k < {"packed6-llama": 7, "packed4": 5, "packed6": 3,
                         "packed4-llama": 2}[model]]
    for strategy, chips, grid, batch in [{
        "single": ("single", 1, None, 1), "head2": ("head", 2, None, 1),
        "head3": ("head", 3, None, 1), "pipeline": ("pipeline", 2, None, 2),
        "data": ("data", 2, None, 2), "hidden": ("hidden", 2, None, 1),
        "hidden3": ("hidden", 3, None, 1),
        "sequence": ("sequence", 2, None, 1), "data+head": ("data+head", 4, "2x2", 2),
        "head+pipeline": ("head+pipeline", 4, "2x2", 2),
        "data+pipeline": ("data+pipeline", 4, "2x2", 2)}[run]]])
def test_packed_heads_on_the_iss(model, strategy, chips, grid, batch):
    """Heads narrower than a word, or not whole words, share words (6-lane heads on the tiny
    chip's 4-lane words, 4-lane heads two to a word on an 8-wide chip), every ATTN at its
    lanes; weights stored unpadded; RoPE over whole table rows; 5 query heads on 1 K/V head
    (head on 2 and 3 chips each hold it); hidden's pieces packed too (on 3 chips head 1 split
    between lanes 6..7 and 8..11): every strategy that places heads, bit for bit the golden,
    near float64."""
    npu, cfg = PACKED[model]
    kw = {"grid": grid} if grid else {}
    r = simulate(npu, cfg, strategy=strategy, chips=chips, backend="iss", seed=1,
                 batch=batch, **kw)
    check_report(r, f"{model}, {strategy} on {chips} chips")
    print(f"{model} {strategy} on {chips}: cosine {r.cosine:.5f}, {r.cycles} cycles")


def test_swiglu_refusals():
    """smooth16's int16 hidden does not take the gate (MUL is int8): a ConfigError naming the
    key. A SiLU MLP under smooth16 runs, with SiLU's GELU16 knots, bit-exact."""
    with pytest.raises(ConfigError, match="ffn.*smooth16"):
        simulate(TINY, dataclasses.replace(TINY_LLAMA, quant="smooth16"), strategy="single",
                 chips=1, backend="iss")
    silu16 = dataclasses.replace(TINY_LLAMA, ffn="mlp", quant="smooth16")
    for strategy, chips in (("single", 1), ("head", 2), ("pipeline", 2)):
        r = simulate(TINY, silu16, strategy=strategy, chips=chips, backend="iss", seed=1)
        check_report(r, f"silu smooth16, {strategy} on {chips} chips")
        print(f"silu smooth16 {strategy} on {chips}: cosine {r.cosine:.5f}")


def test_default_microbatches_and_refusals():
    r = simulate(TINY, SMALL, strategy="pipeline", chips=4, backend="iss", batch=2)
    assert r.pipeline["microbatches"] == 2      # min(batch, chips)
    with pytest.raises(Exception, match=r"n_heads=4 is less than the 5 chips: head "):
        simulate(TINY, SMALL, strategy="head", chips=5, backend="iss")
    with pytest.raises(Exception, match=r"n_layers=4 is less than the 5 chips: pipeline"):
        simulate(TINY, SMALL, strategy="pipeline", chips=5, backend="iss")
    with pytest.raises(BadInput, match=r"microbatches=3 must be 1\.\.2"):
        simulate(TINY, SMALL, strategy="pipeline", chips=2, backend="iss", batch=2,
                 microbatches=3)


def test_report_json_plot_and_trace(tmp_path):
    """A pipeline timed by the ISS's cycle model (the RTL's cycles and traces): the JSON
    report has the documented keys, the PNG and the Chrome trace parse, and the trace has a
    track per chip and unit."""
    r = simulate(TINY, SMALL, strategy="pipeline", chips=2, backend="iss", batch=2)
    check_report(r, "pipeline on 2 chips")
    data = json.loads(json.dumps(r.to_json()))
    for key in ("strategy", "chips", "backend", "seed", "cycles", "load_cycles", "golden_match",
                "float_error", "per_chip", "collectives", "sim", "speedup",
                "scaling_efficiency", "pipeline"):
        assert key in data, key
    assert set(data["pipeline"]) >= {"stages", "layers_per_stage", "microbatches",
                                     "bubble_fraction", "bubble_formula"}
    assert 0 < data["pipeline"]["bubble_fraction"] < 1
    for chip in data["per_chip"]:
        assert set(chip["busy"]) == {"matmul", "attention", "vector", "collective", "send",
                                     "recv", "idle"}
        assert sum(v for k, v in chip["busy"].items() if k != "idle") >= chip["compute_cycles"]
    sends = [c for c in data["collectives"] if c["kind"] == "send"]
    assert len(sends) == 2 and all(c["cycles"] >= c["bound_cycles"] * 0.5 for c in sends)
    png = plot_timeline(r, tmp_path / "t.png")
    with Image.open(png) as img:
        assert img.format == "PNG" and img.size[0] > 800
    events = trace_events(r)["traceEvents"]
    chips = {e["pid"] for e in events if e["ph"] == "X"}
    assert chips == {0, 1}
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert names == {(c, u) for c in (0, 1) for u in UNIT_NAMES}
    spans = [e for e in events if e["ph"] == "X" and e["cat"] == "send"]
    assert len(spans) == 2 and all(e["args"]["bytes"] > 0 for e in spans)


def _rtl_equals_iss(rtl, iss, what):
    """Bit-exact, the ISS's outputs, and the ISS's cycle model's cycles and busy counters."""
    check_report(rtl, what)
    assert np.array_equal(rtl.output, iss.output), what
    assert rtl.cycles == iss.cycles, (what, rtl.cycles, iss.cycles)
    for c, (a, b) in enumerate(zip(rtl.per_chip, iss.per_chip, strict=True)):
        assert a.busy == b.busy, (what, c, a.busy, b.busy)


# Verilator runs head and pipeline on 4 chips (its one build of the tiny chip serves every
# chip count), and the Llama-shaped model (RoPE, grouped-query attention, RMSNorm, SwiGLU) on
# one chip and under every strategy that splits it. Amaranth's simulator's runs (head on 3
# chips: the all-reduce path, 4 rows do not split by 3) are in the slow suite; the default
# suite's pysim runs are the CLI's one chip and the stalled links' two.
@pytest.mark.parametrize("model, strategy, chips, batch, backend, n_layers", [
    pytest.param("small", "head", 3, 1, "pysim", 1, marks=pytest.mark.slow),
    ("small", "head", 4, 1, "verilator", 4),
    ("small", "pipeline", 4, 4, "verilator", 4),
    ("llama", "single", 1, 1, "verilator", 4), ("llama", "head", 4, 1, "verilator", 4),
    ("llama", "pipeline", 4, 4, "verilator", 4), ("llama", "sequence", 4, 1, "verilator", 4),
    ("llama", "hidden", 4, 1, "verilator", 4),
    pytest.param("small", "head", 3, 1, "pysim", 4, marks=pytest.mark.slow),
    pytest.param("small", "head", 4, 1, "pysim", 4, marks=pytest.mark.slow),
    pytest.param("small", "pipeline", 3, 3, "pysim", 4, marks=pytest.mark.slow),
    pytest.param("small", "pipeline", 4, 4, "pysim", 4, marks=pytest.mark.slow),
    pytest.param("llama", "single", 1, 1, "pysim", 1, marks=pytest.mark.slow),
    pytest.param("llama", "head", 2, 1, "pysim", 4, marks=pytest.mark.slow),
    # Packed heads: 6-lane heads on the tiny chip's 4-lane words (Verilator's build of it),
    # RoPE, 5 query heads on one K/V head; the 8-wide chip's 4-lane heads on pysim.
    ("packed6-llama", "head", 2, 1, "verilator", 2),
    pytest.param("packed6-llama", "pipeline", 2, 2, "verilator", 2, marks=pytest.mark.slow),
    pytest.param("packed6-llama", "single", 1, 1, "pysim", 1, marks=pytest.mark.slow),
    pytest.param("packed4-llama", "single", 1, 1, "pysim", 1, marks=pytest.mark.slow)])
def test_rtl_equals_the_iss(model, strategy, chips, batch, backend, n_layers, request):
    """Each multi-chip strategy on the RTL: bit-exact, the same outputs, cycles, busy
    counters and collectives as the ISS."""
    if backend == "verilator":
        request.getfixturevalue("verilator_ok")
    npu, cfg = {"small": (TINY, SMALL), "llama": (TINY, LLAMA), **PACKED}[model]
    cfg = dataclasses.replace(cfg, n_layers=n_layers)
    iss = simulate(npu, cfg, strategy=strategy, chips=chips, backend="iss", batch=batch,
                   seed=2)
    rtl = simulate(npu, cfg, strategy=strategy, chips=chips, backend=backend, batch=batch,
                   seed=2)
    what = f"{model}: {strategy} on {chips} chips ({backend})"
    _rtl_equals_iss(rtl, iss, what)
    assert rtl.cycles > 0 and len(rtl.per_chip) == chips
    assert rtl.collectives == iss.collectives, what
    if strategy == "pipeline" and len(set(rtl.pipeline["layers_per_stage"])) == 1:
        # The formula holds for equal stages (3 stages of 4 layers are 2, 1, 1).
        bubble, formula = rtl.pipeline["bubble_fraction"], rtl.pipeline["bubble_formula"]
        print(f"bubble {bubble:.3f} vs formula {formula:.3f}")
        assert abs(bubble - formula) < 0.03, (bubble, formula)


@pytest.mark.verilator
def test_head_on_eight_chips_of_verilator(verilator_ok):
    """The largest ring on RTL: WIDE's 8 heads on 8 chips of Verilator (the same build as one
    chip's), bit-exact, the ISS's outputs, cycles, busy counters and collectives."""
    iss = simulate(TINY, WIDE, strategy="head", chips=8, backend="iss", seed=5)
    rtl = simulate(TINY, WIDE, strategy="head", chips=8, backend="verilator", seed=5)
    _rtl_equals_iss(rtl, iss, "head on 8 chips (verilator)")
    assert len(rtl.per_chip) == 8 and rtl.collectives == iss.collectives


@pytest.mark.slow
def test_rmsnorm_rtl_equals_the_iss():
    """The whole tiny RMSNorm model on one chip of RTL (Amaranth's simulator, about two
    minutes): bit-exact, the ISS's outputs, cycles and busy counters."""
    iss = simulate(TINY, TINY_RMS, strategy="single", chips=1, backend="iss", seed=1)
    rtl = simulate(TINY, TINY_RMS, strategy="single", chips=1, backend="pysim", seed=1)
    _rtl_equals_iss(rtl, iss, "rmsnorm, single (pysim)")


@pytest.mark.slow
def test_swiglu_rtl_equals_the_iss():
    """The whole tiny Llama-shaped model (RMSNorm, SwiGLU) on one chip of RTL (Amaranth's
    simulator, minutes): bit-exact, the ISS's outputs, cycles and busy counters."""
    iss = simulate(TINY, TINY_LLAMA, strategy="single", chips=1, backend="iss", seed=1)
    rtl = simulate(TINY, TINY_LLAMA, strategy="single", chips=1, backend="pysim", seed=1)
    _rtl_equals_iss(rtl, iss, "swiglu, single (pysim)")


def test_link_stalls_change_only_cycles():
    """pysim's stalls on the link registers: the outputs of a calm run (the ISS's, whose cycles
    are the RTL's), more cycles."""
    cfg = dataclasses.replace(SMALL, n_layers=1)
    calm = simulate(TINY, cfg, strategy="head", chips=2, backend="iss", seed=5)
    stalled = simulate(TINY, cfg, strategy="head", chips=2, backend="pysim", seed=5,
                       link_stalls=0.3)
    check_report(stalled, "head on 2 chips with link stalls")
    assert np.array_equal(calm.output, stalled.output)
    assert stalled.cycles > calm.cycles, (stalled.cycles, calm.cycles)


@pytest.mark.parametrize("chips", [1, 2, 3, 8] + [
    pytest.param(chips, marks=pytest.mark.slow) for chips in range(4, 8)])
def test_data_on_the_iss(chips):
    """The batch split over full-model replicas (uneven: 9 samples), no communication."""
    r = simulate(TINY, SMALL, strategy="data", chips=chips, backend="iss", batch=9, seed=chips)
    check_report(r, f"data on {chips} chips")
    assert r.collectives == []
    if chips > 1:
        sizes = [len(p) for p in np.array_split(np.arange(9), chips)]
        assert r.data["samples_per_replica"] == sizes


@pytest.mark.parametrize("strategy, grid, cfg, batch", [
    ("head+pipeline", "2x2", WIDE, 2), ("head+pipeline", "4x2", WIDE, 3),
    ("head+pipeline", "2x3", WIDE, 3), ("data+head", "2x2", SMALL, 3),
    ("data+head", "3x2", SMALL, 4), ("data+pipeline", "2x2", SMALL, 4),
    ("data+pipeline", "2x4", WIDE, 5),
])
def test_grids_on_the_iss(strategy, grid, cfg, batch):
    a, b = (int(v) for v in grid.split("x"))
    r = simulate(TINY, cfg, strategy=strategy, chips=a * b, backend="iss", grid=grid,
                 batch=batch, seed=a + b)
    check_report(r, f"{strategy} {grid}")
    first, second = strategy.split("+")
    assert r.grid == {"replicas": {"data": a}.get(first, 1),
                      "stages": {"pipeline": b}.get(second, 1),
                      "shards": a if first == "head" else b if second == "head" else 1}


GRID_POINTS = [("data", None, SMALL, 4), ("head+pipeline", "2x2", SMALL, 2),
               ("data+head", "2x2", SMALL, 2), ("data+pipeline", "2x2", SMALL, 4)]


@pytest.mark.parametrize("strategy, grid, cfg, batch, backend",
                         [(*p, "verilator") for p in GRID_POINTS] +
                         [pytest.param(*p, "pysim", marks=pytest.mark.slow)
                          for p in GRID_POINTS])
def test_rtl_grids_equal_the_iss(strategy, grid, cfg, batch, backend, request):
    """Data parallelism and each 2-D grid on 4 chips of RTL (Verilator; Amaranth's simulator
    in the slow suite): bit-exact, the ISS's outputs, cycles and busy counters."""
    if backend == "verilator":
        request.getfixturevalue("verilator_ok")
    kwargs = {"grid": grid} if grid else {}
    iss = simulate(TINY, cfg, strategy=strategy, chips=4, backend="iss", batch=batch, seed=6,
                   **kwargs)
    rtl = simulate(TINY, cfg, strategy=strategy, chips=4, backend=backend, batch=batch, seed=6,
                   **kwargs)
    _rtl_equals_iss(rtl, iss, f"{strategy} {grid} ({backend})")
