"""``npu plan --longest-context``: per strategy the longest sequence that fits N chips, and the
limit the next token breaks (sim.planner.plan.longest_context)."""

import dataclasses

import numpy as np
import pytest

from hw.spec import model_preset, npu_preset
from sim.compiler.quantize import quantize_model
from sim.golden.float_model import random_weights
from sim.planner.plan import longest_context, plan
from sim.strategies import compile_program
from sim.timing.cycle import time_programs
from tests.helpers import TINY_MODEL, TINY_NPU, assert_one_line_error, run


def by_name(found):
    return {lc.strategy: lc for lc in found}


def test_tiny_on_four_chips():
    """Head and pipeline run full attention beyond the ring in passes up to max_seq_len (64);
    hidden parallelism stops at the ring (16 keys); sequence parallelism holds every layer on
    each chip, so the scratchpad ends it; data parallelism has one sample."""
    got = by_name(longest_context(npu_preset("tiny"), model_preset("tiny"), 4))
    assert got["head"].tokens == got["pipeline"].tokens == 64, got
    assert "max_seq_len=64" in got["head"].beyond[0].message
    assert got["hidden"].tokens == 16 and "attn_window=16" in got["hidden"].beyond[0].message
    assert got["sequence"].tokens == 66 and got["sequence"].beyond[0].key == "sram_bytes"
    assert got["data"].tokens == 0 and got["data"].beyond[0].key == "batch"
    assert got["head+pipeline"].grid == "2x2" and got["head+pipeline"].tokens == 64


def test_llama2_7b_on_lpu_like():
    """The figure docs/architecture.md gives: 64 lpu-like chips hold 2,240 tokens of
    llama2-7b as a 16 x 4 head+pipeline grid (the activations end it); sequence parallelism
    needs every weight on each chip."""
    npu, cfg = npu_preset("lpu-like"), model_preset("llama2-7b")
    got = by_name(longest_context(npu, cfg, 64, strategy="head+pipeline"))
    assert got["head+pipeline"].tokens == 2240 and got["head+pipeline"].grid == "16x4"
    seq = longest_context(npu, cfg, 64, strategy="sequence")[0]
    assert seq.tokens == 0 and "weights 7,826,018,560" in seq.beyond[0].message


def test_cli(capsys):
    status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL, "--chips", "4",
                           "--longest-context", "--strategy", "head")
    assert status == 0, err
    assert "head: 64 tokens" in out and "beyond: seq_len=65 exceeds max_seq_len=64" in out
    status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                           "--longest-context")
    assert_one_line_error(status, out, err, "--longest-context needs --chips N")


@pytest.mark.parametrize("causal", [True, False])
def test_ring_attention_is_planned_within_ten_percent(causal):
    """Sequence parallelism over 64 tokens (4 x attn_window) on 4 tiny chips: the planner's
    analytic cycles (one chip's chunk, plus the other chunks' merged launches at their
    launch_cycles) within 10% of the cycle model on the compiled programs."""
    cfg = dataclasses.replace(model_preset("tiny"), seq_len=64, n_layers=1, causal=causal,
                              name="tiny-long")
    npu = npu_preset("tiny")
    p = plan(npu, cfg, chips=4, strategy="sequence").strategies[0]
    assert p.fits and p.timing == "analytic", p.reasons
    assert any(n.startswith("ring attention:") for n in p.notes), p.notes
    x = np.random.default_rng(3).standard_normal((1, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 3), x)
    prog = compile_program("sequence", npu, qm, 4, seq=cfg.seq_len, samples=1)
    cycles = time_programs(npu, [c.program for c in prog.chips]).cycles
    assert abs(p.predicted_cycles / cycles - 1) < 0.1, (p.predicted_cycles, cycles)
