"""The planner (sim.planner.plan): verdicts at each limit, bytes, programs and cycles."""

import dataclasses
import time

import numpy as np
import pytest

from hw.spec import ModelConfig, model_preset, npu_preset
from hw.spec.isa import REGS, Op, decode
from sim.compiler.attention_launch import DATA_REGS as ATTN_DATA
from sim.compiler.quantize import quantize_model
from sim.compiler.vector_launch import DATA_REGS as VEC_DATA
from sim.errors import BadInput
from sim.flows.simulate import simulate
from sim.golden.float_model import random_weights
from sim.planner.plan import (
    COMPILED,
    ChipBytes,
    compile_shapes,
    limits,
    per_chip_bytes,
    plan,
    ring_buildable,
)
from sim.planner.plan import _roles as roles_of
from sim.planner.plan import _table_bytes as table_bytes
from sim.strategies import compile_program
from sim.timing.cycle import time_programs
from tests.helpers import one_each

TINY = npu_preset("tiny")


def small(**changes):
    fields = {"n_layers": 2, "d_model": 16, "n_heads": 2, "d_head": 8, "d_ff": 32,
              "seq_len": 8, "name": "small"}
    return ModelConfig(**(fields | changes))


def keys(reasons):
    return [r.key for r in reasons]


def one(reasons, key):
    hits = [r for r in reasons if r.key == key]
    assert len(hits) == 1, reasons
    return str(hits[0])


# --- limits, at and just past each edge -------------------------------------------------------
def test_sram_one_byte_under_and_over():
    cfg = small()
    need = per_chip_bytes(TINY, cfg, "single", 1)[0]
    at = [ChipBytes(0, need.weights, need.kv_cache, TINY.sram_bytes - need.weights
                    - need.kv_cache)]
    over = [dataclasses.replace(at[0], activations=at[0].activations + 1)]
    under = [dataclasses.replace(at[0], activations=at[0].activations - 1)]
    assert "sram_bytes" not in keys(limits(TINY, cfg, "single", 1, per_chip=under))
    assert "sram_bytes" not in keys(limits(TINY, cfg, "single", 1, per_chip=at))
    msg = one(limits(TINY, cfg, "single", 1, per_chip=over), "sram_bytes")
    assert f"chip 0 needs {TINY.sram_bytes + 1:,} bytes" in msg
    assert f"of sram_bytes={TINY.sram_bytes:,}" in msg and "kv_cache" in msg


def test_sram_at_the_real_boundary():
    """A scratchpad of the fewest banks that hold the model's bytes fits; one bank less (the
    smallest step a configuration can take: a bank's depth is a power of two) does not, and
    the message gives every category."""
    cfg = small(vocab_size=0)
    need = per_chip_bytes(TINY, cfg, "single", 1)[0].total
    bank = 64 * TINY.array_size                 # 64 words a bank
    banks = -(-need // bank)
    fits = dataclasses.replace(TINY, sram_bytes=banks * bank, sram_banks=banks)
    short = dataclasses.replace(TINY, sram_bytes=(banks - 1) * bank, sram_banks=banks - 1)
    assert plan(fits, cfg, chips=1, strategy="single").strategies[0].fits
    p = plan(short, cfg, chips=1, strategy="single").strategies[0]
    assert not p.fits and keys(p.reasons) == ["sram_bytes"]
    assert "weights" in str(p.reasons[0]) and "activations" in str(p.reasons[0])


@pytest.mark.parametrize("strategy, chips", [("single", 1), ("head", 2), ("pipeline", 2)])
def test_d_head_at_and_above_the_datapath(strategy, chips):
    at = small(d_model=32, d_head=16)                   # d_head_max 16
    assert "d_head" not in keys(limits(TINY, at, strategy, chips))
    above = small(d_model=40, d_head=20)
    msg = one(limits(TINY, above, strategy, chips), "d_head")
    assert "d_head=20 exceeds datapath width d_head_max=16 (" in msg


def test_hidden_relieves_d_head():
    wide = small(d_model=40, d_head=20, n_heads=2)
    assert "d_head" in keys(limits(TINY, wide, "single", 1))
    # The compiler splits d_model's words evenly: on 2 chips head 0's 20 lanes all land on
    # chip 0 (5 words of 4 each); on 4 (3, 3, 2, 2 words) no chip holds more than 12.
    assert "on chip 0 of 2: it holds 20 lanes of head 0" in one(
        limits(TINY, wide, "hidden", 2), "d_head")
    assert "d_head" not in keys(limits(TINY, wide, "hidden", 4))


def test_seq_at_and_above_max_seq_len():
    at = small(seq_len=TINY.max_seq_len, window=8)
    assert "seq_len" not in keys(limits(TINY, at, "single", 1))
    above = small(seq_len=TINY.max_seq_len + 1, window=8)
    msg = one(limits(TINY, above, "single", 1), "seq_len")
    assert f"seq_len={TINY.max_seq_len + 1} exceeds max_seq_len={TINY.max_seq_len}" in msg
    # Sequence parallelism relieves it: half the tokens per chip.
    assert "seq_len" not in keys(limits(TINY, above, "sequence", 2))


def test_attention_window():
    ring = TINY.attn_window
    full = small(seq_len=ring)
    assert not {"seq_len", "window"} & set(keys(limits(TINY, full, "single", 1)))
    # Full attention beyond the ring: passes over key chunks (the grid strategies), else
    # refused (hidden parallelism's split-score attention has no state rows).
    assert not {"seq_len", "window"} & set(keys(limits(TINY, small(seq_len=ring + 1), "single",
                                                       1)))
    msg = one(limits(TINY, small(seq_len=ring + 1), "hidden", 2), "seq_len")
    assert "does not fit one chip's K/V ring" in msg and f"attn_window={ring}" in msg
    causal = small(seq_len=40, window=ring + 1)
    assert "window" in keys(limits(TINY, causal, "single", 1))
    narrow = dataclasses.replace(TINY, attn_window=8, softmax_len=8)
    assert not {"seq_len", "window"} & set(keys(limits(narrow, small(seq_len=8), "single", 1)))
    bidir = small(seq_len=20, window=5, causal=False)      # sees 2w - 1 = 9 keys > 8
    msg = one(limits(narrow, bidir, "single", 1), "window")
    assert "window=5 does not fit attn_window=8" in msg


def test_divisibility():
    cfg = small(batch=2)
    assert "n_heads" not in keys(limits(TINY, cfg, "head", 2))
    assert "n_heads=2 is less than the 3 chips" in one(limits(TINY, cfg, "head", 3), "n_heads")
    assert "n_layers=2 is less than the 3 chips: pipeline parallelism" in one(
        limits(TINY, cfg, "pipeline", 3), "n_layers")
    assert "batch" not in keys(limits(TINY, cfg, "data", 2))
    assert "batch=2 is less than the 3 data-parallel" in one(limits(TINY, cfg, "data", 3),
                                                              "batch")
    assert "4 words of 4: fewer than 5 chips" in one(limits(TINY, cfg, "hidden", 5), "d_model")


def test_ring_and_program_limits():
    cfg = small()
    assert "chips" not in keys(limits(TINY, cfg, "pipeline", 2))
    assert "chips" not in keys(limits(TINY, small(n_layers=9), "pipeline", 9))
    msg = one(limits(TINY, small(n_layers=1025), "pipeline", 1025), "chips")
    assert "chips=1025 exceeds the 1024 chips a system holds" in msg
    tight = dataclasses.replace(TINY, imem_words=64)
    p = plan(tight, cfg, chips=1, strategy="single").strategies[0]
    assert "imem_words" in keys(p.reasons)
    assert "exceed imem_words=64" in str(p.reasons[keys(p.reasons).index("imem_words")])


def test_unsupported_features_are_planned_with_notes():
    """SiLU, RMSNorm and a gated FFN are built by every strategy: planned as compiled, with no
    note (the gate a tensor of the layout, its matmul and MUL in the programs)."""
    cfg = small(norm_kind="rmsnorm", activation="silu", ffn="gated")
    p = plan(TINY, cfg, chips=1, strategy="single").strategies[0]
    assert p.fits and p.predicted_cycles
    text = " ".join(p.notes)
    assert "silu" not in text and "gated" not in text and "rmsnorm" not in text
    plain = plan(TINY, small(), chips=1, strategy="single").strategies[0]
    assert p.predicted_cycles > plain.predicted_cycles      # the gate's matmul and MUL
    assert p.per_chip[0].weights > plain.per_chip[0].weights
    # The gate is a tensor of the layout the planner reads (the shapes-only compile).
    shapes = compile_shapes("single", TINY, cfg, 1, samples=cfg.batch)
    assert any(".gate.w" in name for name in shapes.chips[0].alloc.tensors)
    for strategy in ("head", "pipeline", "sequence", "hidden"):
        q = plan(TINY, cfg, chips=2, strategy=strategy).strategies[0]
        assert q.fits and not any("gated" in n or "silu" in n for n in q.notes), q.notes
    hidden = plan(TINY, cfg, chips=2, strategy="hidden").strategies[0]
    mlp = plan(TINY, dataclasses.replace(cfg, ffn="mlp"), chips=2, strategy="hidden")
    assert hidden.per_chip[0].weights > mlp.strategies[0].per_chip[0].weights
    assert hidden.collectives_per_layer == mlp.strategies[0].collectives_per_layer + 1
    # The predicted cycles are the cycle model's on the compiler's own SwiGLU program.
    x = np.random.default_rng(3).standard_normal((cfg.batch, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 3), x)
    prog = compile_program("single", TINY, qm, 1, seq=cfg.seq_len, samples=cfg.batch)
    assert p.timing == "cycle model"
    assert p.predicted_cycles == time_programs(TINY, [c.program for c in prog.chips]).cycles
    rms = plan(TINY, small(norm_kind="rmsnorm"), chips=1, strategy="single").strategies[0]
    assert rms.fits and rms.notes == plain.notes and "rmsnorm" not in " ".join(rms.notes)
    assert rms.predicted_cycles == plain.predicted_cycles
    assert plain.per_chip[0].weights == rms.per_chip[0].weights
    # A RoPE model has no learned positions (seq_len x d_model): its cos/sin tables are the
    # compiler's (rope.cos, rope.sin: seq_pad x d_head int8 each, with the weights).
    role = roles_of(TINY, small(), "single", 1, None)[0]
    rope = small(rope_theta=10000.0)
    assert table_bytes(TINY, small(), role) - table_bytes(TINY, rope, role) == 8 * 16
    rp = plan(TINY, rope, chips=1, strategy="single").strategies[0]
    assert rp.fits and rp.per_chip[0].weights > plain.per_chip[0].weights


@pytest.mark.parametrize("strategy, chips", [
    ("sequence", 2), pytest.param("sequence", 4, marks=pytest.mark.slow),
    pytest.param("hidden", 2, marks=pytest.mark.slow), ("hidden", 3)])
def test_rope_and_gqa_are_planned_as_compiled(strategy, chips):
    """tiny-llama (RoPE, 4 query heads on 2 K/V heads) under sequence and hidden: neither key
    refused; each chip's bytes are its compile's (the tables and rotated projections with the
    weights, K/V rows of the K/V heads); hidden's predicted cycles are the cycle model's on
    the compiled programs (a split head on 3 chips)."""
    cfg = model_preset("tiny-llama")
    p = plan(TINY, cfg, chips=chips, strategy=strategy).strategies[0]
    assert not {"rope_theta", "n_kv_heads"} & set(keys(p.reasons)), p.reasons
    x = np.random.default_rng(3).standard_normal((cfg.batch, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 3), x)
    prog = compile_program(strategy, TINY, qm, chips, seq=cfg.seq_len, samples=cfg.batch)
    roles = roles_of(TINY, cfg, strategy, chips, None)
    assert [(c.weights - table_bytes(TINY, cfg, r), c.kv_cache, c.activations)
            for c, r in zip(p.per_chip, roles, strict=True)] == \
        [(c.alloc.used["weights"], c.alloc.used["kv_cache"], c.alloc.used["activations"])
         for c in prog.chips]
    if strategy == "hidden":
        assert p.fits and p.timing == "cycle model"
        assert p.predicted_cycles == time_programs(TINY, [c.program for c in prog.chips]).cycles
        return
    # Every chip holds every layer and (the planner counts) the embeddings and LM head: four
    # layers exceed the tiny chip, as on one chip; two fit.
    assert keys(p.reasons) == ["sram_bytes"] * chips
    two = plan(TINY, dataclasses.replace(cfg, n_layers=2), chips=chips, strategy=strategy)
    assert two.strategies[0].fits and two.strategies[0].predicted_cycles > 0


def test_grids_need_two_sides():
    p = plan(TINY, small(), chips=2, strategy="head+pipeline").strategies[0]
    assert not p.fits and "makes no A x B grid" in str(p.reasons[0])
    p = plan(TINY, small(n_layers=2, n_heads=2), chips=4, strategy="head+pipeline")
    assert p.strategies[0].grid == "2x2"


# --- bytes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy, chips", [("single", 1), ("pipeline", 2), ("head", 2),
                                             ("sequence", 2), ("hidden", 2)])
def test_deep_models_are_laid_out_on_two_layers_and_extended(strategy, chips, monkeypatch):
    """7 layers (4 and 3 a stage): the bytes from layouts of 1 and 2 layers a stage, extended,
    equal the layout of every layer."""
    cfg = small(n_layers=7, vocab_size=50)
    extended = per_chip_bytes(TINY, cfg, strategy, chips)
    monkeypatch.setattr("sim.planner.plan.LAID_OUT_LAYERS", 7)
    assert extended == per_chip_bytes(TINY, cfg, strategy, chips)


def test_capacity_beyond_the_ring_and_without_a_ring_port():
    """The layout needs no instruction: 16 head shards (the gateware's ring holds 8), and
    chips whose ring port cannot be built (lpu-like), still get the allocator's bytes."""
    cfg = small(n_heads=16, d_model=64, d_head=4, d_ff=64)
    got = per_chip_bytes(TINY, cfg, "head", 16)
    assert len(got) == 16 and all(c.total > 0 for c in got)
    assert got[0].weights < per_chip_bytes(TINY, cfg, "head", 8)[0].weights
    assert "chips" not in keys(limits(TINY, cfg, "head", 16))
    lpu = npu_preset("lpu-like")
    assert not lpu.ring_port_buildable
    two = per_chip_bytes(lpu, model_preset("llama2-7b"), "head", 2)
    one_chip = per_chip_bytes(lpu, model_preset("llama2-7b"), "single", 1)
    assert two[0].weights < one_chip[0].weights < 2 * two[0].weights + two[0].weights // 10


@pytest.mark.parametrize("name, published", [("gpt2-small", 124_439_808),
                                             ("minilm-l6", 22_700_000),
                                             pytest.param("llama2-7b", 6_738_415_616,
                                                          marks=pytest.mark.slow)])
def test_weights_equal_published_parameter_counts(name, published):
    """int8 weights (one byte a parameter) plus per-column requantisation and LayerNorm
    parameters, embeddings, positions and LM head, on a chip whose words divide the model
    (the fpga preset: no padding). A RoPE model also holds the rotated copies of Wq and Wk
    (``sim.golden.rope``: d_model x (d_model + d_kv) int8 a layer, +16% for Llama-2-7B)."""
    cfg = model_preset(name)
    p = plan(npu_preset("fpga"), cfg, chips=1, strategy="single").strategies[0]
    weights = sum(c.weights for c in p.per_chip)
    rotated = cfg.n_layers * cfg.d_model * (cfg.d_model + cfg.d_kv) if cfg.rope else 0
    assert abs(weights - published - rotated) / published < 0.01, (weights, published, rotated)


@pytest.mark.parametrize("name, published, chips", [("gpt2-small", 124_439_808, 4),
                                                    ("llama2-7b", 6_738_415_616, 32)])
def test_weights_on_a_wide_array_are_its_parameters(name, published, chips):
    """On lpu-like (320-lane words, which no d_head of these models fills) heads share words
    and weight matrices are stored unpadded (zero B rows, the last column block packed), so
    the pipeline's chips hold the published parameter count, plus (gpt2-small) the tied table
    once more for the LM head on the last stage, (llama2-7b) RoPE's rotated copies of Wq and
    Wk and each chip's two tables of lcm(d_head, 320) lanes per position. Measured:
    gpt2-small 163,650,944 bytes against 163,037,184 (+0.38%); before packing 330,137,984."""
    lpu = npu_preset("lpu-like")
    cfg = model_preset(name)
    n = lpu.array_size
    weights = sum(c.weights for c in per_chip_bytes(lpu, cfg, "pipeline", chips))
    want = published + (cfg.vocab_size * cfg.d_model if cfg.tie_embeddings else 0)
    if cfg.rope:
        want += cfg.n_layers * cfg.d_model * (cfg.d_model + cfg.d_kv)
        want += chips * 2 * (-(-cfg.seq_len // n) * n) * np.lcm(cfg.d_head, n)
    print(f"{name}: {weights:,} bytes of weights, {want:,} expected "
          f"({(weights - want) / want:+.2%})")
    assert abs(weights - want) / want < 0.01, (weights, want)


def strip(program):
    """Instructions with the data-derived SET values blanked (they depend on the scales)."""
    data = set(ATTN_DATA) | set(VEC_DATA)
    out = []
    for word in program:
        i = decode(word)
        out.append((i.op, i.reg, None if i.op is Op.SET and REGS[i.reg] in data else i.value))
    return out


# Each strategy with one of the models in turn; the whole product in the slow suite.
@pytest.mark.parametrize("strategy, chips, cfg", one_each(
    [("single", 1), ("head", 2), ("head", 3), ("pipeline", 2), ("hidden", 2), ("hidden", 3)],
    [model_preset("tiny"),
     small(n_layers=3, d_model=24, n_heads=3, d_ff=40, seq_len=6, norm="post", causal=False,
           name="post"),
     small(d_model=12, n_heads=3, d_head=4, d_ff=20, seq_len=5, batch=3, name="batch3"),
     small(activation="silu", ffn="gated", name="swiglu")]))
def test_shapes_only_compile_is_the_compiler(cfg, strategy, chips):
    """Same instructions (but the scales' values), same tensors at the same addresses, and
    the planner's bytes per category are the allocator's (hidden: its plan's, which come from
    the shapes-only compile of one layer)."""
    if chips > cfg.n_heads and strategy != "hidden":
        pytest.skip("fewer heads than chips")
    x = np.random.default_rng(0).standard_normal((cfg.batch, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 0), x)
    real = compile_program(strategy, TINY, qm, chips, seq=cfg.seq_len, samples=cfg.batch)
    shapes = compile_shapes(strategy, TINY, cfg, chips, samples=cfg.batch)
    for a, b in zip(real.chips, shapes.chips, strict=True):
        assert strip(a.program) == strip(b.program)
        assert a.alloc.tensors == b.alloc.tensors
    # The planner's bytes are the allocator's, plus the tables the compiler does not place
    # (the embeddings and positions on the first chips, the final norm on the last).
    got = plan(TINY, cfg, chips=chips, strategy=strategy).strategies[0].per_chip
    tables = [c.weights - chip.alloc.used["weights"] for c, chip in zip(got, real.chips,
                                                                        strict=True)]
    roles = roles_of(TINY, cfg, strategy, chips, None)
    assert tables == [table_bytes(TINY, cfg, r) for r in roles]
    # Every element of the embeddings and positions is on some chip, once.
    emb = cfg.vocab_size * cfg.d_model + cfg.seq_len * cfg.d_model
    assert sum(r.embeddings for r in roles) == pytest.approx(1.0) and sum(tables) >= emb
    assert [(c.kv_cache, c.activations) for c in got] == \
        [(c.alloc.used["kv_cache"], c.alloc.used["activations"]) for c in real.chips]


# --- cycles and the report ----------------------------------------------------------------------
@pytest.mark.parametrize("strategy, chips", [("single", 1), ("head", 2), ("pipeline", 2),
                                             ("hidden", 2), ("hidden", 3)])
def test_predicted_cycles_are_the_cycle_models(strategy, chips):
    """On small programs the planner's engine is the cycle model, equal to the RTL."""
    cfg = dataclasses.replace(model_preset("tiny"), batch=chips if strategy == "pipeline"
                              else 1)
    p = plan(TINY, cfg, chips=chips, strategy=strategy).strategies[0]
    assert p.timing == "cycle model"
    x = np.random.default_rng(3).standard_normal((cfg.batch, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 3), x)
    prog = compile_program(strategy, TINY, qm, chips, seq=cfg.seq_len, samples=cfg.batch)
    assert p.predicted_cycles == time_programs(TINY, [c.program for c in prog.chips]).cycles
    assert p.latency_ms == pytest.approx(p.predicted_cycles / (TINY.clock_mhz * 1e3))
    assert p.tokens_per_s == pytest.approx(cfg.batch * cfg.seq_len / (p.latency_ms / 1e3))


def test_min_chips_and_the_json_shape():
    cfg = dataclasses.replace(model_preset("tiny"), n_layers=8)
    report = plan(TINY, cfg, min_chips=True, strategy="all", exact_chip_cycles=0)
    data = report.to_json()
    assert set(data) == {"npu", "model", "strategies"}
    entry = {"strategy", "grid", "chips", "fits", "reasons", "per_chip",
             "comm_bytes_per_layer", "collectives_per_layer", "predicted_cycles",
             "latency_ms", "tokens_per_s", "min_chips", "notes", "timing", "topology"}
    for s in data["strategies"]:
        assert set(s) == entry
        assert all(set(c) == {"chip", "weights", "kv_cache", "activations"}
                   for c in s["per_chip"])
    by = {s.strategy: s for s in report.strategies}
    assert not by["single"].fits and by["single"].min_chips is None
    assert by["pipeline"].fits and by["pipeline"].chips == by["pipeline"].min_chips == 2
    assert by["head"].fits and by["head"].min_chips == 2
    # 8 rows split by 2 chips: reduce-scatters of O and FFN2, all-gathers of both LayerNorms.
    assert by["head"].collectives_per_layer == 4 and by["head"].comm_bytes_per_layer > 0
    for s in report.strategies:
        if s.strategy not in COMPILED and s.notes:
            assert "analytic" in s.timing or s.predicted_cycles is None
    table = report.table()
    assert table.splitlines()[2].startswith("*")       # the best, first
    assert "does not fit" in table


def test_llama_on_lpu_like():
    """The 7B Llama on lpu-like, every strategy's fewest chips (the CPU time is printed, not
    asserted: the bench measures the planner's speed)."""
    start = time.process_time()
    report = plan(npu_preset("lpu-like"), model_preset("llama2-7b"), min_chips=True)
    print(f"planned in {time.process_time() - start:.1f} s of CPU")
    by = {s.strategy: s for s in report.strategies}
    assert not ring_buildable(npu_preset("lpu-like"))
    single = by["single"]
    assert not single.fits and single.predicted_cycles > 0
    text = " ".join(single.notes)
    assert "silu" not in text and "rmsnorm" not in text and "gated" not in text
    # Heads of 128 lanes share the 320-lane words: nothing is padded (no note says so).
    assert not any("padded" in note for s in report.strategies for note in s.notes)
    assert by["head+pipeline"].min_chips is not None


def test_rejections():
    with pytest.raises(BadInput, match="either --chips N or --min-chips"):
        plan(TINY, small())
    with pytest.raises(BadInput, match="strategy 'tensor' is not one of all, single"):
        plan(TINY, small(), chips=1, strategy="tensor")
    with pytest.raises(TypeError, match="npu must be an NpuConfig"):
        plan("tiny", small(), chips=1)


# A 2-layer d_model 64 model on a tiny chip with room for its int16 FFN hidden.
S16_NPU = dataclasses.replace(npu_preset("tiny"), sram_bytes=131072)
S16_MODEL = dataclasses.replace(model_preset("tiny"), n_layers=2, d_model=64, n_heads=8,
                                d_head=8, d_ff=128)


@pytest.mark.parametrize("strategy, chips", [
    pytest.param("single", 1, marks=pytest.mark.slow), ("head", 2),
    pytest.param("head", 4, marks=pytest.mark.slow), ("pipeline", 2)])
def test_smooth16_is_planned_as_it_is_compiled(strategy, chips):
    """smooth16's programs (int16 FFN hidden, GELU16, FFN2 in two passes) are planned from
    the compiler's own shapes-only compile: their cycles differ from int8's and equal the
    ISS's timed run (pipelines: the launch-level model, within 1%)."""
    batch = chips if strategy == "pipeline" else 1
    cycles = {}
    for quant in ("int8", "smooth16"):
        model = dataclasses.replace(S16_MODEL, quant=quant, batch=batch)
        planned = plan(S16_NPU, model, chips=chips, strategy=strategy).strategies[0]
        ran = simulate(S16_NPU, model, strategy=strategy, chips=chips, backend="iss",
                       reference="none")
        assert ran.golden_match
        assert abs(planned.predicted_cycles / ran.cycles - 1) <= 0.01, \
            (quant, planned.predicted_cycles, ran.cycles, planned.timing)
        cycles[quant] = planned.predicted_cycles
    assert cycles["smooth16"] > cycles["int8"] * 1.1, cycles
