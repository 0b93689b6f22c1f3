"""The block emitter (sim.compiler.blocks) and hidden's LayerNorm: the normalisation launches a
model's ``norm_kind`` asks for, on every strategy."""

import dataclasses
from collections import Counter

import numpy as np
import pytest

from hw.spec import model_preset, npu_preset
from hw.spec.isa import REGS, Op, decode
from hw.spec.vector import VectorOp
from sim.compiler.quantize import quantize_model
from sim.golden.float_model import random_weights
from sim.strategies import compile_program

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
