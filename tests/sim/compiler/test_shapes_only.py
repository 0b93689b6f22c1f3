"""The shapes-only compile (``contents=False``, the planner's) is the real compile without the
weights' contents: the same allocator layout (every tensor's name, base and words, the same
per-category bytes) and the same instructions but for the SET values of the scales."""

import dataclasses

import numpy as np
import pytest

from hw.spec.config import load_model, load_npu
from sim.compiler.grid import compile_grid
from sim.compiler.quantize import quantize_model
from sim.golden.float_model import random_weights
from sim.planner.plan import _dummy_qmodel
from sim.strategies import get
from tests.helpers import program_layout, program_stream

NPU = load_npu("constraints/npu/tiny.toml")
TINY = load_model("constraints/models/tiny.toml")


@pytest.mark.parametrize("model, quant, norm", [
    ("tiny", "int8", "pre"), ("tiny", "int8", "post"), ("tiny", "smooth16", "pre"),
    ("tiny", "smooth16", "post"), ("tiny-llama", "int8", "pre"), ("tiny-llama", "llm16", "pre")])
@pytest.mark.parametrize("strategy,chips", [("single", 1), ("head", 2), ("pipeline", 2)])
def test_shapes_only_compile_is_the_real_one(model, quant, norm, strategy, chips):
    """For the tiny model under int8 and smooth16, and the Llama-shaped one (RoPE, GQA,
    SwiGLU) under int8 and llm16."""
    cfg = load_model(f"constraints/models/{model}.toml")
    cfg = dataclasses.replace(cfg, quant=quant, norm=norm, batch=chips,
                              n_layers=2 if model == "tiny" else cfg.n_layers)
    x = np.random.default_rng(1).standard_normal((cfg.batch, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 0), x)
    grid = get(strategy).layout(chips)
    real = compile_grid(NPU, qm, grid, strategy=strategy, samples=cfg.batch)
    shapes = compile_grid(NPU, _dummy_qmodel(cfg), grid, strategy=strategy,
                          samples=cfg.batch, contents=False, check=False)
    assert program_layout(shapes) == program_layout(real)
    assert [c.alloc.used for c in shapes.chips] == [c.alloc.used for c in real.chips]
    assert program_stream(shapes) == program_stream(real)
    assert all(not c.alloc.images for c in shapes.chips)
    if quant == "smooth16":
        names = set(real.chips[0].alloc.tensors)
        assert "layers.0.gelu16.lut" in names and "layers.0.ffn2_hi.p" in names
        assert ("layers.0.qkv.requant" in names) == (norm == "post")
        if strategy == "head":
            assert "layers.0.ffn2_hi.requant" in names


def test_only_compiles_the_chips_asked_for():
    cfg = dataclasses.replace(TINY, n_layers=2)
    grid = get("head").layout(4)
    whole = compile_grid(NPU, _dummy_qmodel(cfg), grid, strategy="head", contents=False,
                         check=False)
    some = compile_grid(NPU, _dummy_qmodel(cfg), grid, strategy="head", contents=False,
                        check=False, only={0, 3})
    assert some.chips[1] is None and some.chips[2] is None
    for k in (0, 3):
        assert [(t.name, t.base, t.words) for t in some.chips[k].alloc.tensors.values()] == \
            [(t.name, t.base, t.words) for t in whole.chips[k].alloc.tensors.values()]
