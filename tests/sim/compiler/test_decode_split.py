"""Split-KV decode (sim.compiler.decode_split, ``--generate N --strategy sequence``): a context
longer than one chip's attention buffer decodes on a chain of chips that each cache a chunk of
its positions, bit-exact against the golden decode in the chain's merge order."""

import dataclasses

import numpy as np
import pytest

from hw.spec import ConfigError, model_preset, npu_preset
from hw.spec.attention import FLAG_STATE_IN, FLAG_STATE_OUT
from hw.spec.isa import REGS, Op, decode
from sim.compiler.decode import compile_decode
from sim.compiler.decode_quant import quantize_decode
from sim.compiler.decode_split import kv_chunks
from sim.errors import BadInput
from sim.flows.generate import generate
from sim.golden.decode import generate_int, random_head_weights, split_kv_order
from sim.golden.float_model import random_weights
from sim.planner.decode import plan_generate
from tests.helpers import PACKED6_LLAMA, run, seeded, tiny_variant

TINY = npu_preset("tiny")
#: The tiny NPU with an attention buffer of 8 keys: the same splits at half the cycles.
W8 = tiny_variant(attn_window=8, softmax_len=8)
#: 2 layers, d_model 16, 32 learned positions: twice the tiny NPU's attn_window of 16.
LONG = model_preset("tiny-long")
#: Its Llama-shaped twin: RoPE, one K/V head for two query heads, RMSNorm, SwiGLU.
LONG_LLAMA = dataclasses.replace(LONG, name="tiny-long-llama", n_kv_heads=1, rope_theta=1e4,
                                 norm_kind="rmsnorm", activation="silu", ffn="gated",
                                 bias=False)
#: Packed heads (6 lanes on 4-lane words), RoPE, 5 query heads on one K/V head.
LONG_PACKED = dataclasses.replace(PACKED6_LLAMA, seq_len=32)


def _prompts(cfg, seed, batch, length):
    return seeded(seed).integers(0, cfg.vocab_size, (batch, length))


@pytest.mark.parametrize("npu,cfg,chips,batch,prompt_len,n", [
    (TINY, LONG, 2, 1, 24, 9),      # context 32 = 2 x attn_window, the prompt in 2 passes
    (W8, LONG, 2, 1, 6, 4),         # a prompt within the ring: one launch per head
    (W8, LONG, 3, 1, 18, 7),        # a chain of three: chip 1 merges in the middle
    (W8, LONG, 2, 2, 12, 5),        # a batch: one state row per sequence and head
    (W8, LONG_LLAMA, 2, 1, 12, 5),
    pytest.param(W8, LONG_PACKED, 2, 1, 12, 5, marks=pytest.mark.slow)])
def test_split_kv_decode_is_bit_exact(npu, cfg, chips, batch, prompt_len, n):
    """The ids and every step's int16 logits equal the golden decode that merges each step's
    partial softmaxes over the chips' chunks, last chip first (and the prefill's in passes)."""
    prompts = _prompts(cfg, chips + prompt_len, batch, prompt_len)
    out = generate(npu, cfg, prompt=prompts, n=n, backend="iss", strategy="sequence",
                   chips=chips, seed=prompt_len)
    assert out["golden_match"], out["first_mismatch"]
    assert len(out["ids"][0]) == n and len(out["step_cycles"]) == n - 1
    context = prompt_len + n - 1
    assert out["kv_chunks"] == kv_chunks(context, chips)
    # Each chip caches K and V of its own positions only.
    d_kv = cfg.n_kv_heads * cfg.d_head
    assert out["kv_bytes"] == [2 * cfg.n_layers * (b - a) * batch * d_kv
                               for a, b in out["kv_chunks"]]


def test_the_merge_changes_the_integers():
    """The golden the run is held to is not one softmax per row: merging over the chips'
    chunks rounds differently, and another split gives other integers (so a chip that merged
    in the wrong order, or attended the wrong chunk, would not match)."""
    cfg, prompt = LONG, _prompts(LONG, 5, 1, 24)[0]
    qm, head = quantize_decode(cfg, random_weights(cfg, 0), random_head_weights(cfg, 1), prompt)
    plain = generate_int(qm, head, prompt, 9)["logits"]
    split = generate_int(qm, head, prompt, 9, ring=16, kv_chunks=[(0, 16), (16, 32)])["logits"]
    other = generate_int(qm, head, prompt, 9, ring=16, kv_chunks=[(0, 12), (12, 32)])["logits"]
    assert (plain != split).sum() > split.size // 2
    assert (split[1:] != other[1:]).any() and (split[0] == other[0]).all()


def _attn_modes(program):
    """Per ATTN launch the state flags set before it: 'plain', 'first', 'middle', 'last'."""
    modes, flags = [], 0
    for word in program:
        insn = decode(word)
        if insn.op is Op.SET and REGS[insn.reg] == "AT_FLAGS":
            flags = insn.value
        if insn.op is Op.ATTN:
            state_in, state_out = flags & FLAG_STATE_IN, flags & FLAG_STATE_OUT
            modes.append({(0, 0): "plain", (0, 1): "first", (1, 1): "middle",
                          (1, 0): "last"}[(bool(state_in), bool(state_out))])
    return modes


def test_the_chain_and_a_static_step():
    """The step's loop body holds, per layer and head, a first launch on the last chip, a
    middle one on the chips between and a last one on chip 0 (every chip's prefill runs the
    same passes); the program does not grow with the tokens generated."""
    cfg = LONG
    qm, head = quantize_decode(cfg, random_weights(cfg, 0), random_head_weights(cfg, 1),
                               np.arange(24) % cfg.vocab_size)
    progs = {n: compile_decode(TINY, qm, head, prompt_len=24, generate=n, chips=3,
                               strategy="sequence") for n in (3, 9)}
    assert [len(p) for p in progs[3].programs] == [len(p) for p in progs[9].programs]
    h = cfg.n_heads
    # The prefill of 24 tokens per layer: queries 0..15 over their own chunk (plain), 16..23
    # over theirs then 0..15 (first, last); then the step's link of the chain.
    prefill = (["plain"] * h + ["first"] * h + ["last"] * h) * cfg.n_layers
    for c, program in enumerate(progs[9].programs):
        step = {0: "last", 1: "middle", 2: "first"}[c]
        assert _attn_modes(program) == prefill + [step] * h * cfg.n_layers, c


def test_one_chip_is_refused_and_two_suffice(capsys):
    """One tiny chip cannot decode the 32-token context (a step attends its cache in one ATTN
    of at most attn_window keys): refused naming the limit and the chips that would; the
    sequence split refuses what its chips cannot hold, naming the chips needed."""
    prompt = _prompts(LONG, 1, 1, 24)
    with pytest.raises(ConfigError, match=r"attn_window=16 holds 16 keys: a context of 32 "
                       r"tokens .* one chip's .* over 2 chips"):
        generate(TINY, LONG, prompt=prompt, n=9, backend="iss")
    with pytest.raises(ConfigError, match="attn_window=16 .* context of 48 tokens .* on 2 "
                       "chips is chunks of 24; use at least 3 chips"):
        generate(TINY, dataclasses.replace(LONG, seq_len=48), prompt=prompt, n=25,
                 backend="iss", strategy="sequence", chips=2)
    with pytest.raises(BadInput, match="the last of 2 chips caches positions 10..19.*needs at "
                       "least 11"):
        generate(TINY, LONG, prompt=prompt[:, :8], n=13, backend="iss", strategy="sequence",
                 chips=2)
    with pytest.raises(ConfigError, match="window.* is 8: split-KV decode"):
        generate(TINY, dataclasses.replace(LONG, window=8), prompt=prompt, n=9,
                 backend="iss", strategy="sequence", chips=2)


def test_the_cli_and_the_planner(tmp_path, capsys):
    """``npu sim --generate`` refuses one chip (exit 2, one line naming attn_window);
    ``npu plan --generate`` times the split's program (its figures are the ISS run's) and
    finds the longest prompt its chips' rings hold."""
    ids = tmp_path / "p.npy"
    np.save(ids, _prompts(LONG, 2, 1, 24)[0])
    status, out, err = run(capsys, "sim", "--npu", str(TINY.path), "--model", str(LONG.path),
                           "--generate", "9", "--prompt-ids", str(ids), "--backend", "iss")
    assert status == 2 and "attn_window=16" in err and len(err.strip().splitlines()) == 1
    ran = generate(W8, LONG, prompt=_prompts(LONG, 2, 1, 12), n=5, backend="iss",
                   strategy="sequence", chips=2)
    planned = plan_generate(W8, LONG, generate=5, prompt_len=12, strategy="sequence",
                            chips=2)
    assert planned.fits and planned.timed_by == "cycle model"
    # The longest prompt: the context of 2 chips' rings, 2 x 8 keys.
    assert planned.longest_prompt == 12 and "attn_window=8" in planned.longest_prompt_limit
    assert planned.ttft_cycles == ran["ttft_cycles"]
    assert planned.step_cycles == ran["step_cycles"]
    assert planned.kv_bytes == ran["kv_bytes"] and planned.sram_bytes == ran["sram_bytes"]


def test_split_kv_order():
    """A query at position p merges the chunks that hold a position up to p, each cut at p,
    from the last chip's to chip 0's."""
    chunks = [(0, 5), (5, 9), (9, 20)]
    assert split_kv_order(chunks, 12) == [(9, 13), (5, 9), (0, 5)]
    assert split_kv_order(chunks, 9) == [(9, 10), (5, 9), (0, 5)]
    assert split_kv_order(chunks, 6) == [(5, 7), (0, 5)]
    with pytest.raises(ValueError, match="do not start at position 0"):
        split_kv_order([(1, 5)], 3)


@pytest.mark.verilator
def test_verilator_split_kv_decode_equals_the_iss(verilator_ok):
    """The 32-token context on 2 tiny NPUs on Verilator (the one-chip build, twice on its
    ring): the ids, the cycles of the run, of the first token and of every step equal the
    ISS's cycle model."""
    prompts = _prompts(LONG, 7, 1, 24)
    runs = [generate(TINY, LONG, prompt=prompts, n=9, backend=b, strategy="sequence",
                     chips=2, seed=7) for b in ("iss", "verilator")]
    assert runs[0]["golden_match"] and runs[1]["golden_match"]
    for key in ("ids", "cycles", "ttft_cycles", "step_cycles"):
        assert runs[1][key] == runs[0][key], (key, runs[1][key], runs[0][key])
