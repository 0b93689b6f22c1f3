"""``npu plan --longest-context``: per strategy the longest sequence that fits N chips, and the
limit the next token breaks (sim.planner.plan.longest_context)."""

from hw.spec import model_preset, npu_preset
from sim.planner.plan import longest_context
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
