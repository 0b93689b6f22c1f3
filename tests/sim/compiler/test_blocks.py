"""The block emitter (sim.compiler.blocks) and hidden's LayerNorm: the normalisation launches a
model's ``norm_kind`` asks for, on every strategy."""

import dataclasses
from collections import Counter

import numpy as np
import pytest

from hw.spec import model_preset, npu_preset
from hw.spec.isa import REGS, Op, decode
from hw.spec.memory import weight_words
from hw.spec.vector import VectorOp
from sim.compiler.blocks import QkvLayout
from sim.compiler.quantize import quantize_model
from sim.golden.float_model import random_weights
from sim.strategies import compile_program
from tests.helpers import PACKED

TINY = npu_preset("tiny")


def vec_ops(words) -> Counter:
    """The op of every VEC launch of a program (the last VU_OP set before it)."""
    ops, op = Counter(), None
    for word in words:
        insn = decode(int(word))
        if insn.op is Op.SET and REGS[insn.reg] == "VU_OP":
            op = VectorOp(insn.value)
        elif insn.op is Op.VEC:
            ops[op] += 1
    return ops


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("strategy, chips", [("single", 1), ("head", 2), ("pipeline", 2),
                                             ("sequence", 2), ("hidden", 2)])
def test_norm_kind_picks_the_launches(strategy, chips, norm):
    """LayerNorm models run LN (hidden: LN_STATS + LN_APPLY), RMSNorm models RMS (hidden:
    LN_STATS + RMS_APPLY) and no LayerNorm op; everything else is the same program."""
    base = dataclasses.replace(model_preset("tiny"), n_layers=2, norm=norm)
    x = np.random.default_rng(0).standard_normal((1, base.seq_len, base.d_model))
    counts = {}
    for kind in ("layernorm", "rmsnorm"):
        cfg = dataclasses.replace(base, norm_kind=kind)
        qm = quantize_model(cfg, random_weights(cfg, 0), x)
        prog = compile_program(strategy, TINY, qm, chips, seq=cfg.seq_len, samples=1)
        counts[kind] = [vec_ops(c.program) for c in prog.chips]
    ln_op, rms_op = ((VectorOp.LN_APPLY, VectorOp.RMS_APPLY) if strategy == "hidden" else
                     (VectorOp.LN, VectorOp.RMS))
    layernorm_ops = {VectorOp.LN, VectorOp.LN_APPLY}
    rmsnorm_ops = {VectorOp.RMS, VectorOp.RMS_APPLY}
    for ln, rms in zip(counts["layernorm"], counts["rmsnorm"], strict=True):
        assert ln[ln_op] > 0 and not rmsnorm_ops & set(ln), ln
        assert not layernorm_ops & set(rms), rms
        # The same launches, RMSNorm's in place of LayerNorm's.
        assert rms == Counter({rms_op if op is ln_op else op: k for op, k in ln.items()})


@pytest.mark.parametrize("strategy, chips", [("single", 1), ("head", 2), ("pipeline", 2),
                                             ("sequence", 2)])
def test_gated_ffn_launches(strategy, chips):
    """A gated FFN adds one matmul (the gate) and one MUL per layer to the MLP's program, and
    no collective: the gate's columns are split with FFN1's."""
    base = dataclasses.replace(model_preset("tiny"), n_layers=2, norm_kind="rmsnorm",
                               activation="silu", bias=False)
    x = np.random.default_rng(0).standard_normal((1, base.seq_len, base.d_model))
    progs = {}
    for ffn in ("mlp", "gated"):
        cfg = dataclasses.replace(base, ffn=ffn)
        qm = quantize_model(cfg, random_weights(cfg, 0), x)
        progs[ffn] = compile_program(strategy, TINY, qm, chips, seq=cfg.seq_len, samples=1)
    for mlp, gated in zip(progs["mlp"].chips, progs["gated"].chips, strict=True):
        m, g = vec_ops(mlp.program), vec_ops(gated.program)
        layers = len(gated.role.get("layers", range(2))) if strategy == "pipeline" else 2
        assert g[VectorOp.MUL] == layers and VectorOp.MUL not in m
        assert g - Counter({VectorOp.MUL: layers}) == m
        assert launches(gated.program, Op.MATMUL) == launches(mlp.program, Op.MATMUL) + layers
        assert launches(gated.program, Op.COLL) == launches(mlp.program, Op.COLL)


def launches(words, op) -> int:
    return sum(1 for word in words if decode(int(word)).op is op)


@pytest.mark.parametrize("d_head, heads, kv_heads, size, rope, want", [
    # (k, v, main, qk, rope_at, rope_lanes, width, fused)
    (8, 4, 2, 4, True, (32, 48, 64, 48, 64, 48, 112, True)),     # tiny-llama: whole words
    (6, 5, 1, 4, True, (30, 36, 42, 36, 44, 36, 80, False)),     # 6 lanes on 4: straddling
    (4, 5, 1, 8, True, (20, 24, 28, 24, 32, 24, 56, False)),     # 4 lanes, two to a word
    (128, 32, 32, 320, True, (4096, 8192, 12288, 8192, 12480, 8320, 20800, False)),  # 7B
    (64, 12, 12, 320, False, (768, 1536, 2304, 1536, 2304, 0, 2304, True)),
])
def test_qkv_layout_packs_heads(d_head, heads, kv_heads, size, rope, want):
    """Heads one after another, d_head lanes each; RoPE's rotated projections from the first
    word boundary after V, over whole table rows of lcm(d_head, N) lanes."""
    lay = QkvLayout(d_head, heads, kv_heads, size, rope)
    got = (lay.k, lay.v, lay.main, lay.qk, lay.rope_at, lay.rope_lanes, lay.width, lay.fused)
    assert got == want
    assert [lay.q_col(k) for k in range(2)] == [0, d_head]
    assert lay.k_col(1) == lay.k + d_head and lay.v_col(1) == lay.v + d_head


@pytest.mark.parametrize("model", ["packed4", "packed6-llama"])
def test_weights_are_stored_unpadded(model):
    """Every matmul's weights take the words of its unpadded matrix (the last column block
    packed), far fewer than padded heads and whole-word rows would."""
    npu, cfg = PACKED[model]
    x = np.random.default_rng(0).standard_normal((1, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 0), x)
    prog = compile_program("single", npu, qm, 1, seq=cfg.seq_len, samples=1)
    tensors = prog.chips[0].alloc.tensors
    n, d, f = npu.array_size, cfg.d_model, cfg.d_ff
    lay = QkvLayout(cfg.d_head, cfg.n_heads, cfg.n_kv_heads, n, cfg.rope)
    qkv_cols = lay.main if not lay.fused else lay.main + (lay.qk if cfg.rope else 0)
    shapes = {"qkv": (d, qkv_cols), "o": (cfg.n_heads * cfg.d_head, d), "ffn1": (d, f),
              "ffn2": (f, d)}
    if not lay.fused:
        shapes["qkr"] = (d, lay.qk)
    if cfg.ffn == "gated":
        shapes["gate"] = (d, f)
    for name, (rows, cols) in shapes.items():
        t = tensors[f"layers.0.{name}.w"]
        assert t.words == weight_words(rows, cols, n, packed=True), (name, t.words)
        assert t.words * n < rows * cols + n * n, (name, t.words * n, rows * cols)
