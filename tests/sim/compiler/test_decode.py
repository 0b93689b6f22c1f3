"""Generation on chip (sim.compiler.decode, sim.flows.generate): the prefill and a counted loop
of decode steps, bit-exact against the golden incremental decode; a static program."""

import dataclasses

import numpy as np
import pytest

from hw.spec import ConfigError, model_preset, npu_preset
from hw.spec.isa import REGS, Op, decode, loop_fields, loop_operand
from hw.spec.vector import VectorOp
from hw.spec.vector_engine import VecFlags
from sim.compiler.affine import emit_affine
from sim.compiler.assembler import Assembler
from sim.compiler.decode import compile_decode
from sim.compiler.decode_quant import quantize_decode
from sim.errors import BadInput
from sim.flows.generate import generate
from sim.golden.decode import prefill_logits, random_head_weights
from sim.golden.float_model import random_weights
from tests.helpers import PACKED, seeded, tiny_variant

#: The tiny NPU with 128 KiB: the tiny decoder's blocks and head (its table twice: the
#: embedding matmul's B operand and the LM head's) do not fit 64 KiB on one chip.
NPU = tiny_variant(sram_bytes=1 << 17)


def _prompt(cfg, seed, length):
    return seeded(seed).integers(0, cfg.vocab_size, length)


@pytest.mark.parametrize("name,seed,prompt_len,n", [
    ("tiny", 1, 3, 4), ("tiny", 5, 1, 6), ("tiny", 9, 6, 3),
    ("tiny-llama", 2, 4, 5), ("tiny-llama", 3, 1, 16)])
def test_iss_generation_is_bit_exact(name, seed, prompt_len, n):
    """The generated ids and every step's int16 logits equal the golden incremental decode
    (which tests/sim/golden/test_decode.py holds equal to a prefill of the whole sequence)."""
    cfg = model_preset(name)
    prompt = _prompt(cfg, seed, prompt_len)
    out = generate(NPU, cfg, prompt=prompt, n=n, backend="iss", seed=seed)
    assert out["golden_match"], out["first_mismatch"]
    assert out["ids"] == out["golden_ids"] and len(out["ids"][0]) == n
    assert len(out["step_cycles"]) == n - 1
    assert all(s > 0 for s in out["step_cycles"])
    assert out["ttft_cycles"] <= out["cycles"]


@pytest.mark.parametrize("name,seed,prompt_len,n,chips", [
    ("tiny", 1, 3, 4, 2), ("tiny", 5, 2, 5, 3), ("tiny", 6, 4, 4, 4),
    ("tiny-llama", 7, 3, 5, 3), pytest.param("tiny-llama", 8, 2, 6, 4, marks=pytest.mark.slow)])
def test_head_parallel_generation_is_bit_exact(name, seed, prompt_len, n, chips):
    """Head parallelism on the tiny NPU itself (64 KiB a chip: the tiny decoder with its head
    does not fit one): the caches split with the heads, the logits gathered from the chips'
    vocabulary blocks (3 chips: uneven head shards, so chips lay their buffers out
    differently)."""
    cfg = model_preset(name)
    prompt = _prompt(cfg, seed, prompt_len)
    out = generate(npu_preset("tiny"), cfg, prompt=prompt, n=n, backend="iss",
                   strategy="head", chips=chips, seed=seed)
    assert out["golden_match"], out["first_mismatch"]
    assert out["chips"] == chips and len(out["kv_bytes"]) == chips
    # The KV cache splits with the K/V heads: every chip holds its share.
    whole = 2 * cfg.n_layers * (prompt_len + n - 1) * cfg.n_kv_heads * cfg.d_head
    assert sum(out["kv_bytes"]) >= whole and max(out["kv_bytes"]) < whole


def _argmaxes(program):
    """``(pairs, VU_LEN)`` of every ARGMAX launch of a program, in program order."""
    regs, out = {}, []
    for insn in map(decode, program):
        if insn.op is Op.SET:
            regs[REGS[insn.reg]] = insn.value
        elif insn.op is Op.VEC and regs["VU_OP"] == VectorOp.ARGMAX:
            out.append((VecFlags.decode(regs["VU_FLAGS"]).pairs, regs["VU_LEN"]))
    return out


def test_a_block_of_padding_only_takes_no_part_in_the_pick():
    """A vocabulary of 10 over 4 chips is blocks of 4 columns: 4, 4, 2 and only padding. Each
    chip with columns ARGMAXes its block's, and every chip's pair-mode combine reads those 3
    records (a record of the padding's zero logits would beat every negative logit)."""
    cfg = dataclasses.replace(model_preset("tiny"), vocab_size=10)
    out = generate(npu_preset("tiny"), cfg, prompt=[3, 7], n=2, backend="iss",
                   strategy="head", chips=4, seed=12)
    assert out["golden_match"], out["first_mismatch"]
    assert out["logits"].shape == (1, 2, 10)
    qm, head = quantize_decode(cfg, random_weights(cfg, 12), random_head_weights(cfg, 13),
                               [3, 7])
    prog = compile_decode(npu_preset("tiny"), qm, head, prompt_len=2, generate=2, chips=4)
    for c, program in enumerate(prog.programs):
        # The prefill's pick and the loop body's.
        blocks = [] if c == 3 else [(False, [4, 4, 2][c])]
        assert _argmaxes(program) == 2 * (blocks + [(True, 3)]), c


@pytest.mark.parametrize("name,batch,strategy,chips", [
    ("tiny", 2, "single", 1), ("tiny", 4, "single", 1), ("tiny", 2, "head", 2),
    ("tiny-llama", 3, "head", 3)])
def test_a_batch_decodes_together(name, batch, strategy, chips):
    """B sequences' tokens share each step's folds (their caches interleaved by position):
    every sequence's ids and logits equal its own golden decode (RoPE: every row of a step at
    one position)."""
    cfg = model_preset(name)
    prompts = seeded(30 + batch).integers(0, cfg.vocab_size, (batch, 2))
    npu = NPU if strategy == "single" else npu_preset("tiny")
    out = generate(npu, cfg, prompt=prompts, n=4, backend="iss", strategy=strategy,
                   chips=chips, seed=batch)
    assert out["golden_match"], out["first_mismatch"]
    assert out["batch"] == batch and len(out["ids"]) == batch
    # The cache tensors (the allocator's) hold at least the K/V bytes every sequence needs.
    assert out["cache_bytes"][0] >= out["kv_bytes"][0] > 0


@pytest.mark.parametrize("name,batch,chips", [
    ("tiny", 2, 2), pytest.param("tiny", 5, 2, marks=pytest.mark.slow), ("tiny-llama", 3, 3)])
def test_data_parallel_generation_is_bit_exact(name, batch, chips):
    """Data parallelism: the sequences split over the chips (5 over 2: 3 and 2), each chip the
    whole model and its own caches; every sequence equals its golden decode."""
    cfg = model_preset(name)
    prompts = seeded(40 + batch).integers(0, cfg.vocab_size, (batch, 3))
    out = generate(NPU, cfg, prompt=prompts, n=3, backend="iss", strategy="data",
                   chips=chips, seed=batch)
    assert out["golden_match"], out["first_mismatch"]
    per_seq = 2 * cfg.n_layers * 5 * cfg.n_kv_heads * cfg.d_head
    assert sum(out["kv_bytes"]) == batch * per_seq


@pytest.mark.parametrize("name,batch,chips", [
    ("tiny", 4, 4), pytest.param("tiny", 2, 2, marks=pytest.mark.slow),
    pytest.param("tiny-llama", 4, 4, marks=pytest.mark.slow), ("tiny-llama", 1, 2)])
def test_pipeline_generation_is_bit_exact(name, batch, chips):
    """Pipeline parallelism: a sequence per stage in flight, each stage its layers and their
    caches, the last its head, each token sent back to the first stage; on the tiny NPU."""
    cfg = model_preset(name)
    prompts = seeded(50 + batch).integers(0, cfg.vocab_size, (batch, 3))
    out = generate(npu_preset("tiny"), cfg, prompt=prompts, n=4, backend="iss",
                   strategy="pipeline", chips=chips, seed=batch)
    assert out["golden_match"], out["first_mismatch"]
    assert len(out["step_cycles"]) == 3 and out["chips"] == chips


@pytest.mark.parametrize("strategy,name,grid,batch", [
    ("head+pipeline", "tiny", "2x2", 2),
    pytest.param("head+pipeline", "tiny-llama", "2x4", 4, marks=pytest.mark.slow),
    ("data+head", "tiny", "2x2", 3),
    pytest.param("data+pipeline", "tiny-llama", "2x2", 4, marks=pytest.mark.slow)])
def test_grid_generation_is_bit_exact(strategy, name, grid, batch):
    """The grids: head+pipeline (each stage a head group, shard h of a stage sending to shard
    h of the next, the last stage's tokens back to the first's), data+head and data+pipeline
    (the sequences split over the replicas, each a head group or a pipeline)."""
    cfg = model_preset(name)
    prompts = seeded(60 + batch).integers(0, cfg.vocab_size, (batch, 3))
    out = generate(npu_preset("tiny"), cfg, prompt=prompts, n=4, backend="iss",
                   strategy=strategy, grid=grid, seed=batch)
    assert out["golden_match"], out["first_mismatch"]
    a, b = (int(v) for v in grid.split("x"))
    assert out["chips"] == a * b


@pytest.mark.parametrize("model,strategy,chips,grid,batch", [
    ("packed6-llama", "single", 1, None, 1), ("packed6-llama", "head", 3, None, 1),
    ("packed4", "pipeline", 2, None, 2), ("packed6-llama", "hidden", 3, None, 1),
    pytest.param("packed4-llama", "head", 2, None, 2, marks=pytest.mark.slow),
    pytest.param("packed4", "hidden", 2, None, 2, marks=pytest.mark.slow),
    pytest.param("packed6", "data", 2, None, 2, marks=pytest.mark.slow),
    pytest.param("packed6-llama", "head+pipeline", None, "2x2", 2, marks=pytest.mark.slow)])
def test_packed_heads_generate_bit_exact(model, strategy, chips, grid, batch):
    """Generation with heads packed in shared words: the K/V cache rows are the packed QKV
    rows, each step's attention reads its head's lanes of them (RoPE at the step's position;
    the one K/V head of 5 query heads held by every head shard; hidden: each chip's packed
    pieces and their cache, 2 heads split); every sequence equals its golden decode."""
    npu, cfg = PACKED[model]
    if strategy not in ("head", "hidden"):
        npu = dataclasses.replace(npu, sram_bytes=1 << 17)
    if strategy == "hidden":
        npu = dataclasses.replace(npu, imem_words=8192)      # two copies of the blocks
    prompts = seeded(70 + batch).integers(0, cfg.vocab_size, (batch, 3))
    kw = {"grid": grid} if grid else {"chips": chips}
    out = generate(npu, cfg, prompt=prompts, n=4, backend="iss", strategy=strategy,
                   seed=batch, **kw)
    assert out["golden_match"], out["first_mismatch"]
    assert len(out["step_cycles"]) == 3


#: The tiny NPU with twice its instruction words: a hidden generation's program holds two
#: copies of the hidden blocks (the prefill's loop body and the step's), whose reduce-scatters
#: run in row blocks and column groups; tiny-llama's on 3 chips with a batch of 2 needs 4,861.
HIDDEN_NPU = tiny_variant(imem_words=8192)


@pytest.mark.parametrize("name,chips,batch", [
    ("tiny-llama", 3, 2),
    pytest.param("tiny", 2, 1, marks=pytest.mark.slow),
    pytest.param("tiny", 2, 2, marks=pytest.mark.slow),
    pytest.param("tiny", 3, 1, marks=pytest.mark.slow),
    pytest.param("tiny", 3, 2, marks=pytest.mark.slow),
    pytest.param("tiny", 4, 1, marks=pytest.mark.slow),
    pytest.param("tiny", 4, 2, marks=pytest.mark.slow),
    pytest.param("tiny-llama", 2, 1, marks=pytest.mark.slow),
    pytest.param("tiny-llama", 2, 2, marks=pytest.mark.slow),
    pytest.param("tiny-llama", 3, 1, marks=pytest.mark.slow),
    pytest.param("tiny-llama", 4, 1, marks=pytest.mark.slow),
    pytest.param("tiny-llama", 4, 2, marks=pytest.mark.slow)])
def test_hidden_generation_is_bit_exact(name, chips, batch):
    """Hidden parallelism: d_model split over the chips (3: 12, 12 and 8 columns, head 1
    split over chips 0 and 1), the embedding's, positions' and final norm's columns on each,
    the KV cache split with the QKV projection's columns, the LM head's partial sums
    reduce-scattered into vocabulary blocks and the logits all-gathered; every sequence's
    ids and logits equal its golden decode."""
    cfg = model_preset(name)
    prompts = seeded(70 + chips).integers(0, cfg.vocab_size, (batch, 3))
    out = generate(HIDDEN_NPU, cfg, prompt=prompts, n=3, backend="iss", strategy="hidden",
                   chips=chips, seed=chips)
    assert out["golden_match"], out["first_mismatch"]
    assert len(out["ids"]) == batch and len(out["step_cycles"]) == 2
    # Each chip caches its own lanes of K and V: a share of the whole (a K/V head's lanes
    # that two query pieces of one chip read at different offsets are held twice).
    whole = 2 * cfg.n_layers * 5 * batch * cfg.n_kv_heads * cfg.d_head
    assert len(out["kv_bytes"]) == chips and max(out["kv_bytes"]) < whole
    assert sum(out["kv_bytes"]) >= whole
    if cfg.n_kv_heads == cfg.n_heads:
        assert sum(out["kv_bytes"]) == whole


def test_hidden_generates_a_head_wider_than_the_datapath():
    """One head of 32 lanes, twice the tiny NPU's d_head_max: one chip refuses it, hidden on
    2 generates bit-exact (the head split, 16 lanes a chip: its cache too, the split-score
    passes over the cached rows)."""
    cfg = dataclasses.replace(model_preset("tiny"), n_heads=1, n_kv_heads=1, d_head=32)
    prompt = _prompt(cfg, 5, 3)
    with pytest.raises(ConfigError, match="d_head=32 exceeds datapath width d_head_max=16"):
        generate(NPU, cfg, prompt=prompt, n=3, backend="iss")
    out = generate(npu_preset("tiny"), cfg, prompt=prompt, n=3, backend="iss",
                   strategy="hidden", chips=2, seed=5)
    assert out["golden_match"], out["first_mismatch"]
    assert out["kv_bytes"] == [2 * 4 * 5 * 16] * 2


def test_logits_equal_a_prefill_of_the_whole_sequence():
    """Step t's logits on chip are the whole sequence's prefill logits at position P - 1 + t."""
    cfg = model_preset("tiny")
    prompt = _prompt(cfg, 21, 2)
    out = generate(NPU, cfg, prompt=prompt, n=5, backend="iss", seed=21)
    qm, head = quantize_decode(cfg, random_weights(cfg, 21), random_head_weights(cfg, 22),
                               prompt)
    full = prefill_logits(qm, head, np.concatenate([prompt, out["ids"][0][:-1]]))
    want = full[len(prompt) - 1:]
    bad = np.argwhere(out["logits"][0] != want)
    assert bad.size == 0, f"(step, vocab) {bad[0].tolist()}"


def _programs(name, prompt_len, n, strategy="single", chips=1, npu=NPU):
    cfg = model_preset(name)
    rng = seeded(4)
    prompt = rng.integers(0, cfg.vocab_size, prompt_len)
    qm, head = quantize_decode(cfg, random_weights(cfg, 4), random_head_weights(cfg, 5), prompt)
    return compile_decode(npu, qm, head, prompt_len=prompt_len, generate=n, strategy=strategy,
                          chips=chips).programs


def len_body(program):
    return next(loop_fields(decode(w).value)[0] for w in program if decode(w).op is Op.LOOP)


@pytest.mark.parametrize("strategy,chips,npu", [("single", 1, NPU), ("hidden", 2, HIDDEN_NPU)])
def test_imem_does_not_grow_with_the_tokens(strategy, chips, npu):
    """A 16-token generation takes no more instructions than a 2-token one on every chip:
    the same instructions (only addresses, which the longer cache moves, and the LOOP's count
    differ)."""
    shorts = _programs("tiny-llama", 1, 2, strategy, chips, npu)
    longs = _programs("tiny-llama", 1, 16, strategy, chips, npu)
    for short, long in zip(shorts, longs, strict=True):
        assert len(short) == len(long)
        shape = [[(i.op, i.reg) for i in map(decode, p)] for p in (short, long)]
        assert shape[0] == shape[1]
        loops = [(decode(a).value, decode(b).value) for a, b in zip(short, long, strict=True)
                 if decode(a).op is Op.LOOP]
        assert loops == [(loop_operand(len_body(short), 1), loop_operand(len_body(short), 15))]


def test_refusals():
    cfg = model_preset("tiny")
    for n in (0, -3):
        with pytest.raises(BadInput, match=f"--generate must be at least 1 token, not {n}"):
            generate(NPU, cfg, prompt=[1, 2], n=n, backend="iss")
    with pytest.raises(BadInput, match="context 9 exceeds the 8 learned positions"):
        generate(NPU, cfg, prompt=[1, 2, 3], n=7, backend="iss")
    llama = model_preset("tiny-llama")
    with pytest.raises(ConfigError, match="attn_window.*context of 17 tokens"):
        generate(NPU, llama, prompt=[1, 2], n=16, backend="iss")
    with pytest.raises(BadInput, match="prompt id 256 at index 1 is outside 0..255"):
        generate(NPU, cfg, prompt=[1, 256], n=2, backend="iss")
    with pytest.raises(BadInput, match="head\\+pipeline needs --grid AxB"):
        generate(npu_preset("tiny"), cfg, prompt=[1], n=2, strategy="head+pipeline")
    with pytest.raises(BadInput, match="backend iss, pysim, verilator, not board"):
        generate(NPU, cfg, prompt=[1], n=2, backend="board")


def test_a_context_that_does_not_fit_is_refused_with_the_bytes():
    cfg = model_preset("tiny")
    with pytest.raises(ConfigError, match=r"sram_bytes=65536 is too small: the model needs "
                       r"[\d,]+ bytes of scratchpad \(weights [\d,]+, kv_cache [\d,]+"):
        generate(npu_preset("tiny"), cfg, prompt=[1, 2, 3], n=4, backend="iss")


def test_emit_affine_checks_the_step():
    """A step whose values are affine becomes SET + ADDX; anything else is refused."""
    asm = Assembler()
    emit_affine(asm, lambda a, t: a.set("AT_KEYS", 5 + 3 * t), 4)
    ops = [(i.op, i.value) for i in asm.insns]
    assert ops[1:] == [(Op.SET, 5), (Op.ADDX, 3)], ops
    with pytest.raises(AssertionError, match="not affine"):
        emit_affine(Assembler(), lambda a, t: a.set("AT_KEYS", t * t), 4)
    with pytest.raises(AssertionError, match="instructions at iteration 0"):
        emit_affine(Assembler(), lambda a, t: [a.wait(1) for _ in range(t)], 3)
    asm = Assembler()
    emit_affine(asm, lambda a, t: a.wait(1), 0)
    assert asm.insns == []


def _same_run(iss, rtl):
    for key in ("golden_match", "ids", "cycles", "ttft_cycles", "step_cycles"):
        assert rtl[key] == iss[key], (key, rtl[key], iss[key])


@pytest.mark.verilator
@pytest.mark.parametrize("strategy,chips,batch", [
    pytest.param("head", 2, 1, marks=pytest.mark.slow), ("pipeline", 4, 4),
    pytest.param("hidden", 2, 1, marks=pytest.mark.slow)])
def test_verilator_generation_equals_the_iss(verilator_ok, strategy, chips, batch):
    """Head parallelism on 2 tiny NPUs, a 4-stage pipeline with a batch of 4, and hidden
    parallelism on 2, 4 tokens: the ids, the cycles of the whole run, of the first token and
    of every decode step on Verilator equal the ISS's cycle model."""
    cfg = model_preset("tiny")
    prompts = seeded(3).integers(0, cfg.vocab_size, (batch, 3))
    runs = [generate(npu_preset("tiny"), cfg, prompt=prompts, n=4, backend=b,
                     strategy=strategy, chips=chips, seed=3) for b in ("iss", "verilator")]
    assert runs[0]["golden_match"]
    _same_run(*runs)


@pytest.mark.slow
@pytest.mark.parametrize("strategy,chips", [("single", 1), ("head", 2)])
def test_pysim_generation_equals_the_iss(strategy, chips):
    """A 4-token generation on Amaranth's simulator (one chip of the 128 KiB variant; 2 tiny
    NPUs) equals the ISS: ids, every step's cycles."""
    cfg = model_preset("tiny")
    npu = NPU if chips == 1 else npu_preset("tiny")
    prompt = _prompt(cfg, 4, 2)
    runs = [generate(npu, cfg, prompt=prompt, n=4, backend=b, strategy=strategy, chips=chips,
                     seed=4) for b in ("iss", "pysim")]
    assert runs[0]["golden_match"]
    _same_run(*runs)
