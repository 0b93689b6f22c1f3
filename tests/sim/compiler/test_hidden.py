"""Hidden-dimension parallelism (sim/compiler/hidden.py): d_model sharded across the chips,
every layer bit-exact with the single-chip golden model.

The matrix (chip counts x seeds, norms, windows, batches, uneven shards, both reductions) runs
on the ISS (timed by its cycle model, so a deadlock of the RTL shows there too). The RTL runs of
`make test` are in tests/sim/timing/test_cycle.py (two heads each split over 2 of 4 chips on
Verilator, held to the cycle model and, in the report, the ISS); the slow suite runs 3 chips with
uneven shards and a split head (here, and held to the cycle model there) and 4 chips with two
split heads on pysim.
"""

import dataclasses
import json

import numpy as np
import pytest

from hw.spec import ConfigError, ModelConfig, npu_preset
from hw.spec.isa import COLL_FIFO_WORDS
from sim.compiler.hidden import (
    REDUCE_MODES,
    Reduction,
    compile_hidden,
    hidden_plan,
    split_widths,
)
from sim.compiler.quantize import quantize_input, quantize_model
from sim.errors import BadInput
from sim.flows.simulate import simulate
from sim.golden.float_model import random_weights
from sim.golden.layer import model_int
from sim.iss import IssSystem
from sim.rtl.system_runner import run_system_pysim
from sim.timing.cycle import time_programs
from tests.helpers import (
    TINY_MODEL,
    TINY_NPU,
    assert_one_line_error,
    check_report,
    pairwise,
    run,
    write_model,
)

TINY = npu_preset("tiny")
#: Four heads of 8 over 32 columns (8 words): every chip count 1..8, heads split on 5..8.
WIDE = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, d_ff=64, seq_len=8,
                   name="wide32")
#: One head of 32 lanes: twice the tiny chip's d_head_max.
BROAD_HEAD = ModelConfig(n_layers=2, d_model=32, n_heads=1, d_head=32, d_ff=64, seq_len=8,
                         name="head32")
#: d_model 96 and heads of 24: both beyond one tiny chip (d_model_max 64, d_head_max 16).
BROAD = ModelConfig(n_layers=1, d_model=96, n_heads=4, d_head=24, d_ff=64, seq_len=8,
                    name="d96")
#: Small enough for pysim: two heads of 8 (split over 2 chips each on 4 chips).
TWO_HEADS = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_ff=32, seq_len=4,
                        name="h2x8")
#: Four heads of 4, for uneven shards.
FOUR_HEADS = ModelConfig(n_layers=1, d_model=16, n_heads=4, d_head=4, d_ff=32, seq_len=4,
                         name="h4x4")


def compiled(cfg, chips, *, seed=0, batch=1, **kw):
    """The quantised model, the int16 inputs and the hidden programs for ``chips`` chips."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, seed), x)
    prog = compile_hidden(TINY, qm, chips, samples=batch, **kw)
    return qm, [quantize_input(qm, s) for s in x], prog


def outputs(prog, regions):
    """Each sample's output from the chips' read-back regions (its column slices joined)."""
    taken = [0] * len(prog.chips)
    out = []
    for parts in prog.outputs:
        cols = []
        for place in parts:
            cols.append(place.read(regions[place.chip][taken[place.chip]], prog.seq,
                                   prog.cfg.d_model))
            taken[place.chip] += 1
        out.append(np.concatenate(cols, axis=1))
    return np.stack(out)


def run_iss(prog, x_ints):
    system = IssSystem(prog.npu, len(prog.chips))
    for iss, image in zip(system.chip, prog.images(x_ints), strict=True):
        for base, words in image.items():
            iss.write_words(base, words)
    system.run([c.program for c in prog.chips])
    reads = prog.reads()
    return outputs(prog, [[system.chip[c].read_words(b, w) for b, w in reads[c]]
                          for c in range(len(prog.chips))])


def assert_golden(qm, x_ints, got, what):
    want = np.stack([model_int(qm, x) for x in x_ints])
    bad = np.argwhere(got != want)
    assert not len(bad), f"{what}: first mismatch at {bad[0]}: {got[tuple(bad[0])]} vs " \
                         f"{want[tuple(bad[0])]}"


# --- shards ----------------------------------------------------------------------------------

def test_default_shards_cut_across_heads():
    """32 columns (8 words) on 3 chips: 12, 12, 8; head 1 (columns 8..15) on chips 0 and 1."""
    assert split_widths(32, 3, 4) == [12, 12, 8]
    assert split_widths(30, 4, 4) == [8, 8, 8, 6]     # the last word is part padding
    plan = hidden_plan(TINY, WIDE, 3)
    assert plan.cols == ((0, 12), (12, 24), (24, 32))
    assert plan.groups == ((0, 1), (0, 2), (1, 1), (2, 1))
    assert plan.split_heads == [1]
    assert [(p.head, p.lo, p.hi, p.off, p.width) for p in plan.pieces[0]] == \
        [(0, 0, 8, 0, 8), (1, 8, 12, 8, 4)]
    assert [(p.head, p.lo, p.hi, p.off, p.width) for p in plan.pieces[1]] == \
        [(1, 12, 16, 0, 4), (2, 16, 24, 4, 8)]
    assert plan.q_width(1) == 12 and plan.ffn == ((0, 24), (24, 44), (44, 64))


def test_explicit_uneven_shards_pack_each_piece():
    """Columns 4, 6, 6 of heads of 4: head 2 (8..11) is 2 + 2 lanes, the pieces packed one
    after another (head 3's from lane 2 of chip 2's first word)."""
    plan = hidden_plan(TINY, FOUR_HEADS, 3, widths=[4, 6, 6], ffn_widths=[4, 12, 16])
    assert plan.groups == ((0, 1), (1, 1), (1, 2), (2, 1))
    assert [(p.head, p.lo, p.hi, p.off, p.width) for p in plan.pieces[2]] == \
        [(2, 10, 12, 0, 2), (3, 12, 16, 2, 4)]
    assert plan.q_width(2) == 6
    assert plan.ffn == ((0, 4), (4, 16), (16, 32))


@pytest.mark.parametrize("cfg, chips, kw, key, match", [
    (BROAD_HEAD, 1, {}, "d_head", "on chip 0 of 1: it holds 32 lanes of head 0"),
    (BROAD, 3, {}, "d_head", "exceeds datapath width d_head_max=16 on chip 0 of 3"),
    (BROAD, 1, {}, "d_head", "it holds 24 lanes"),
    (BROAD_HEAD, 2, {"widths": [24, 8]}, "d_head", "on chip 0 of 2: it holds 24 lanes"),
    (ModelConfig(n_layers=1, d_model=128, n_heads=16, d_head=8, d_ff=64, seq_len=4), 1, {},
     "d_model", "exceeds d_model_max=64 on chip 0 of 1: its slice has 128 columns"),
    (ModelConfig(n_layers=1, d_model=12, n_heads=3, d_head=4, d_ff=64, seq_len=4), 4, {},
     "d_model", "12 columns are 3 words of 4: fewer than 4 chips"),
    (ModelConfig(n_layers=1, d_model=32, n_heads=4, d_head=8, d_ff=8, seq_len=4), 3, {},
     "d_ff", "8 columns are 2 words of 4"),
])
def test_shards_beyond_a_chip_are_refused(cfg, chips, kw, key, match):
    with pytest.raises(ConfigError, match=match) as info:
        hidden_plan(TINY, cfg, chips, **kw)
    assert info.value.key == key


def test_bad_explicit_widths():
    with pytest.raises(ConfigError, match="must be 2 positive widths summing to 32"):
        hidden_plan(TINY, WIDE, 2, widths=[16, 8])


# --- the reductions' layouts -----------------------------------------------------------------

@pytest.mark.parametrize("mode", REDUCE_MODES)
@pytest.mark.parametrize("widths, rows", [([48, 48], 8), ([12, 12, 8], 8), ([4] * 8, 12),
                                          ([8, 24, 4], 4)])
def test_reduction_chunks_cover_the_buffer(mode, widths, rows):
    """The COLLs of one reduction cover the partial-sum buffer once, in blocks that fit the
    engine's buffers; the weight columns put every destination column once."""
    red = Reduction(widths=widths, rows=rows, size=4, link_bytes=4, mode=mode)
    chips, wbytes = len(widths), 8
    covered = np.zeros(red.words, int)
    for base, elems in red.chunks(0):
        # Equal blocks of whole engine words (2 int32 each), within the engine's buffers.
        assert elems % (chips * 2) == 0 and elems // chips * 4 <= COLL_FIFO_WORDS * wbytes
        covered[base:base + elems] += 1          # int32 elements in 4-byte words
    assert (covered == 1).all()
    flat = [[p * 1000 + c for c in range(w)] for p, w in enumerate(widths)]
    cols = red.columns(flat)
    assert sorted(c for c in cols if c >= 0) == sorted(v for dest in flat for v in dest)


def test_reduction_groups_split_wide_destinations():
    """96 columns per chip = 24 tiles of 4 x 4 int32 (64 B) against 512-B engine buffers: three
    column groups of 8 tiles, so 3 COLLs per row block."""
    red = Reduction(widths=[96, 96], rows=8, size=4, link_bytes=4, mode="reduce_scatter")
    assert red.groups == [(0, 8), (8, 8), (16, 8)]
    assert len(red.chunks(0)) == 2 * 3


# --- the ISS ---------------------------------------------------------------------------------

# Every chip count with seed 0; seed 7 on 3 and 8 chips (the rest in the slow suite).
@pytest.mark.parametrize("chips, seed", [
    pytest.param(chips, seed, marks=[pytest.mark.slow] if seed and chips not in (3, 8) else [])
    for seed in (0, 7) for chips in range(1, 9)])
def test_hidden_on_the_iss(chips, seed):
    r = simulate(TINY, WIDE, strategy="hidden", chips=chips, backend="iss", seed=seed)
    check_report(r, f"hidden on {chips} chips, seed {seed}")
    h = r.hidden
    assert h["columns_per_chip"] == split_widths(32, chips, 4)
    assert h["collectives_per_layer"] == (6 + bool(h["split_heads"]) if chips > 1 else 0)


# Pairs of the axes by default, the whole product in the slow suite.
@pytest.mark.parametrize("norm, causal, window, chips, reduce", pairwise(
    [("post", True, 0), ("pre", False, 0), ("pre", True, 3), ("post", False, 4)], [2, 3, 5],
    REDUCE_MODES))
def test_norms_windows_and_batches_on_the_iss(norm, causal, window, chips, reduce):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, d_ff=64, seq_len=12,
                      norm=norm, causal=causal, window=window, name="w12")
    r = simulate(TINY, cfg, strategy="hidden", chips=chips, backend="iss", batch=2,
                 reduce=reduce)
    check_report(r, f"{norm}-norm, causal {causal}, window {window} on {chips} chips ({reduce})")


@pytest.mark.parametrize("chips, reduce, norm", pairwise([1, 2, 3], REDUCE_MODES,
                                                            ["pre", "post"]))
def test_swiglu_on_the_iss(chips, reduce, norm):
    """A gated FFN (SiLU, RMSNorm, no biases): the gate's partial sums are reduced like
    FFN1's onto the same columns, so MUL runs on each chip's own columns; bit-exact, with one
    collective per layer more than the MLP (the gate's), as the strategy's list says."""
    from sim.strategies import get as get_strategy
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, d_ff=64, seq_len=8,
                      norm=norm, norm_kind="rmsnorm", activation="silu", ffn="gated",
                      bias=False, name="swiglu")
    r = simulate(TINY, cfg, strategy="hidden", chips=chips, backend="iss", reduce=reduce,
                 seed=4)
    check_report(r, f"swiglu {norm}-norm on {chips} chips ({reduce})")
    if chips > 1:
        mlp = simulate(TINY, dataclasses.replace(cfg, ffn="mlp"), strategy="hidden",
                       chips=chips, backend="iss", reduce=reduce, seed=4)
        assert r.hidden["collectives_per_layer"] == mlp.hidden["collectives_per_layer"] + 1
        assert len(get_strategy("hidden").collectives(TINY, cfg)) == \
            r.hidden["collectives_per_layer"] - bool(r.hidden["split_heads"]) + 1


@pytest.mark.parametrize("cfg, chips, widths, ffn_widths", [
    (FOUR_HEADS, 3, [4, 6, 6], None),
    (FOUR_HEADS, 3, [5, 3, 8], [4, 12, 16]),
    (WIDE, 4, [12, 4, 8, 8], [8, 8, 16, 32]),
    (WIDE, 2, [20, 12], None),
])
@pytest.mark.parametrize("reduce", REDUCE_MODES)
def test_uneven_shards_on_the_iss(cfg, chips, widths, ffn_widths, reduce):
    qm, x_ints, prog = compiled(cfg, chips, seed=3, batch=2, widths=widths,
                                ffn_widths=ffn_widths, reduce=reduce)
    assert prog.meta["columns_per_chip"] == widths
    assert_golden(qm, x_ints, run_iss(prog, x_ints), f"widths {widths} ({reduce})")


def test_grouped_query_pieces_share_their_kv_head():
    """Query heads 0, 1 on K/V head 0, heads 2, 3 on K/V head 1: on one chip two K/V pieces;
    on 3 chips (12, 12, 8 columns) head 1 is split, so chip 0 holds K/V head 0 whole (head 0's)
    and its lanes 0..3 (head 1's), chip 1 its lanes 4..7 and K/V head 1 whole."""
    gqa = dataclasses.replace(WIDE, n_kv_heads=2)
    one = hidden_plan(TINY, gqa, 1)
    assert [(k.head, k.lo, k.hi, k.off) for k in one.kv_pieces[0]] == [(0, 0, 8, 0),
                                                                        (1, 8, 16, 8)]
    assert [p.kv_off for p in one.pieces[0]] == [0, 0, 8, 8] and one.kv_width(0) == 16
    three = hidden_plan(TINY, gqa, 3)
    assert [(k.head, k.lo, k.hi, k.off, k.width) for k in three.kv_pieces[0]] == \
        [(0, 0, 8, 0, 8), (0, 0, 4, 8, 4)]
    assert [(k.head, k.lo, k.hi) for k in three.kv_pieces[1]] == [(0, 4, 8), (1, 8, 16)]
    assert [(k.head, k.lo, k.hi) for k in three.kv_pieces[2]] == [(1, 8, 16)]
    # Without grouped-query attention the K/V layout is the Q layout.
    plain = hidden_plan(TINY, WIDE, 3)
    for c in range(3):
        assert [(k.lo, k.off, k.width) for k in plain.kv_pieces[c]] == \
            [(p.lo, p.off, p.width) for p in plain.pieces[c]]


ROPE = {"rope_theta": 10000.0}


@pytest.mark.parametrize("cfg, chips, kw", [
    # One head of 32 lanes: every lane's rotate-half partner on another chip (2 chips), or
    # a head over 3 and 8 chips.
    (dataclasses.replace(BROAD_HEAD, **ROPE), 2, {}),
    (dataclasses.replace(BROAD_HEAD, **ROPE), 3, {}),
    (dataclasses.replace(BROAD_HEAD, **ROPE), 8, {}),
    # Heads of 24 on 2 K/V heads, every head split (6 and 8 chips).
    (dataclasses.replace(BROAD, n_kv_heads=2, **ROPE), 6, {}),
    (dataclasses.replace(BROAD, n_kv_heads=2, **ROPE), 8, {}),
    # Uneven shards with split heads, one K/V head, both reductions.
    (dataclasses.replace(FOUR_HEADS, n_kv_heads=1, **ROPE), 3,
     {"widths": [5, 3, 8], "ffn_widths": [4, 12, 16]}),
    (dataclasses.replace(FOUR_HEADS, n_kv_heads=2, **ROPE), 3,
     {"widths": [4, 6, 6], "reduce": "all_reduce"}),
    (dataclasses.replace(FOUR_HEADS, n_kv_heads=2), 3, {"widths": [5, 3, 8]}),
])
def test_rope_and_grouped_query_attention(cfg, chips, kw):
    """RoPE with heads split across chips (the rotated projections' columns reduced onto the
    chips of their Q and K lanes, each chip rotating its own lanes) and grouped-query
    attention: bit-exact."""
    qm, x_ints, prog = compiled(cfg, chips, seed=5, batch=2, **kw)
    assert prog.meta["split_heads"]
    assert_golden(qm, x_ints, run_iss(prog, x_ints), f"{cfg.name} on {chips} chips {kw}")


@pytest.mark.parametrize("norm, causal, window, chips, reduce", pairwise(
    [("post", False, 4), ("pre", True, 3)], [2, 3, 5], REDUCE_MODES))
def test_rope_and_gqa_norms_windows_and_batches(norm, causal, window, chips, reduce):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=4, d_head=8, n_kv_heads=2, d_ff=64,
                      seq_len=12, norm=norm, causal=causal, window=window, rope_theta=10000.0,
                      norm_kind="rmsnorm", name="w12-llama")
    r = simulate(TINY, cfg, strategy="hidden", chips=chips, backend="iss", batch=2,
                 reduce=reduce)
    check_report(r, f"RoPE+GQA {norm}-norm, window {window} on {chips} chips ({reduce})")


@pytest.mark.parametrize("cfg, chips", [(BROAD_HEAD, 2), (BROAD_HEAD, 3), (BROAD_HEAD, 8),
                                        (BROAD, 6), (BROAD, 8)])
def test_beyond_one_chip_runs_hidden_and_not_single(cfg, chips):
    """A head twice d_head_max, a d_model above d_model_max: single refuses, hidden on enough
    chips runs it bit-exact (with no single-chip reference)."""
    with pytest.raises(ConfigError, match="exceeds"):
        simulate(TINY, cfg, strategy="single", backend="iss")
    r = simulate(TINY, cfg, strategy="hidden", chips=chips, backend="iss")
    check_report(r, f"{cfg.name} on {chips} chips")
    assert r.hidden["split_heads"]


def test_report_and_refusals():
    r = simulate(TINY, WIDE, strategy="hidden", chips=4, backend="iss", batch=2)
    report = json.loads(json.dumps(r.to_json()))
    h = report["hidden"]
    for key in ("columns_per_chip", "ffn_columns_per_chip", "head_groups", "split_heads",
                "reduce", "collectives_per_layer", "coll_launches_per_layer",
                "bytes_per_layer", "per_layer", "seed_estimate", "why"):
        assert key in h, key
    whats = [c["what"] for c in h["per_layer"]]
    assert whats == ["LN1 statistics", "QKV projection", "O projection", "LN2 statistics",
                     "FFN1 projection", "FFN2 projection"]       # 4 chips: no split head
    assert h["bytes_per_layer"] == sum(c["bytes"] for c in h["per_layer"])
    assert [c["kind"] for c in h["per_layer"]].count("reduce_scatter") == 4
    layers = {c["layer"] for c in report["collectives"]}
    assert layers == {0, 1}
    with pytest.raises(BadInput, match="reduce applies to --strategy hidden"):
        simulate(TINY, WIDE, strategy="head", chips=2, backend="iss", reduce="all_reduce")
    with pytest.raises(BadInput, match="reduce must be one of"):
        simulate(TINY, WIDE, strategy="hidden", chips=2, backend="iss", reduce="ring")


@pytest.mark.parametrize("cfg, chips, widths", [(FOUR_HEADS, 3, [4, 6, 6]), (WIDE, 5, None),
                                                 (WIDE, 7, None)])
def test_every_collective_is_over_all_chips(cfg, chips, widths):
    """No chip's predecessor on the ring ever changes, so no collective's words can reach a
    chip still in another (the engine takes ring words from any sender) and no ordering
    message is needed: per-head groups needed one, and on 5 and 7 chips it waited behind the
    next collective's words for a chip that waited for it (a deadlock of the RTL, which the
    cycle model shows). Those programs now halt on the cycle model."""
    _, _, prog = compiled(cfg, chips, widths=widths)
    assert prog.meta["split_heads"]
    assert {tuple(c["group"]) for c in prog.comms} == {(0, chips)}
    assert all(c["kind"] != "send" for c in prog.comms)
    timing = time_programs(TINY, [c.program for c in prog.chips], max_cycles=200_000)
    print(f"{chips} chips: {timing.cycles} cycles")


# --- the RTL ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_pysim_uneven_shards_with_a_split_head():
    """3 chips, columns 4, 6, 6: head 2 split over chips 1 and 2, chip 0 with the least work.
    Bit-exact and equal to the ISS."""
    qm, x_ints, prog = compiled(FOUR_HEADS, 3, seed=3, widths=[4, 6, 6])
    out = run_system_pysim(TINY, [c.program for c in prog.chips], prog.images(x_ints),
                           prog.reads(), max_cycles=50_000)
    got = outputs(prog, out["regions"])
    assert_golden(qm, x_ints, got, "pysim, widths 4, 6, 6")
    assert np.array_equal(got, run_iss(prog, x_ints))


@pytest.mark.slow
def test_pysim_two_split_heads():
    """4 chips, two heads each split over two chips: both heads' partial scores in one
    all-reduce over all chips; the ISS's report (its cycle model) is pysim's."""
    iss = simulate(TINY, TWO_HEADS, strategy="hidden", chips=4, backend="iss", seed=2)
    rtl = simulate(TINY, TWO_HEADS, strategy="hidden", chips=4, backend="pysim", seed=2)
    check_report(rtl, "hidden on 4 chips (pysim)")
    assert np.array_equal(rtl.output, iss.output)
    h = rtl.hidden
    assert h["split_heads"] == [0, 1] and h["head_groups"] == [[0, 2], [2, 2]]
    assert [c["what"] for c in h["per_layer"]].count("attention scores, heads 0, 1") == 1
    assert all("cycles" in c for c in rtl.collectives)
    assert iss.cycles == rtl.cycles and iss.collectives == rtl.collectives


def test_cli(capsys, tmp_path):
    """``npu sim --strategy hidden``: the tiny model on 4 chips, and a head of 32 lanes that
    ``--strategy single`` refuses (one line, exit 2) on 2 chips; the JSON report's section."""
    status, out, err = run(capsys, "sim", "--strategy", "hidden", "--chips", "4", "--npu",
                           TINY_NPU, "--model", TINY_MODEL, "--backend", "iss")
    assert status == 0 and "hidden: columns [8, 8, 8, 8]" in out, err
    model = write_model(tmp_path, n_layers=1, d_model=32, n_heads=1, d_head=32, d_ff=32,
                        seq_len=4)
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", model, "--backend",
                           "iss")
    assert_one_line_error(status, out, err, "d_head=32 exceeds datapath width d_head_max=16")
    report = tmp_path / "r.json"
    status, out, err = run(capsys, "sim", "--strategy", "hidden", "--chips", "2", "--npu",
                           TINY_NPU, "--model", model, "--backend", "iss", "--json",
                           str(report))
    assert status == 0, err
    h = json.loads(report.read_text())["hidden"]
    assert h["split_heads"] == [0] and h["collectives_per_layer"] == 7
    status, out, err = run(capsys, "sim", "--strategy", "hidden", "--chips", "1", "--npu",
                           TINY_NPU, "--model", model, "--backend", "iss")
    assert_one_line_error(status, out, err, "it holds 32 lanes of head 0")
