"""Training's gradient all-reduce (sim.planner.training, npu plan --training): the parameter
count, and the closed form against the cycle model."""

import dataclasses
import json

import numpy as np
import pytest

from hw.spec import model_preset, npu_preset
from hw.spec.topology import Topology
from sim.flows.collective import run_collective
from sim.golden.float_model import random_weights
from sim.planner.training import _plan_cycles, parameter_count, plan_training
from tests.helpers import TINY_MODEL, TINY_NPU, run

TINY = npu_preset("tiny")


@pytest.mark.parametrize("name", ["tiny", "tiny-llama", "gpt2-small"])
def test_the_parameter_count_is_every_weight(name):
    """The layers' weights (as the golden model draws them), the embeddings and the final
    norm (RMSNorm: a weight; LayerNorm: a weight and a bias)."""
    cfg = model_preset(name)
    if cfg.n_layers > 4:
        cfg = dataclasses.replace(cfg, n_layers=1)
    layers = sum(v.size for v in random_weights(cfg, 0).values())
    tables = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)
    final = cfg.d_model * (1 if cfg.norm_kind == "rmsnorm" else 2)
    assert parameter_count(cfg) == layers + tables + final


def test_llama2_7b_has_its_published_parameter_count():
    assert parameter_count(model_preset("llama2-7b")) == 6_738_415_616


@pytest.mark.parametrize("dims, nbytes, algorithm", [
    ((16,), 4096, "auto"), ((4, 4), 4096, "halves"), ((4, 4), 64, "rows_columns"),
    ((2, 4), 2048, "halves"),
])
def test_the_closed_form_is_the_cycle_model_within_two_percent(dims, nbytes, algorithm):
    """Each phase's collective step by step, against the 2-D (or 1-D) all-reduce's programs
    run on the ISS and timed by its cycle model: within 2%, and a few cycles for a message of
    a word or two (its fetch and drain)."""
    topo = Topology(dims)
    npu = dataclasses.replace(TINY, topology=topo) if topo.is_torus else TINY
    x = np.random.default_rng(1).integers(-9, 9, (topo.chips, nbytes // 4), dtype=np.int32)
    report = run_collective(npu, kind="all_reduce", chips=topo.chips, x=x, backend="iss",
                            algorithm=algorithm)
    assert report.golden_match
    predicted, bound = _plan_cycles(TINY, topo, nbytes // 4, algorithm)
    assert bound == report.bound_cycles
    assert abs(predicted - report.cycles) <= 0.02 * report.cycles + 4, \
        (predicted, report.cycles)


def test_npu_plan_training_on_a_torus(capsys, tmp_path):
    """npu plan --training: the tiny model's gradients on a 4 x 4 torus, the 1-D ring and the
    2-D algorithms; the 2-D halves beat the ring of the same 16 chips."""
    out_json = tmp_path / "t.json"
    status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                           "--training", "--topology", "4x4", "--json", str(out_json))
    assert status == 0, err
    assert "42,432 parameters" in out and "2-D halves" in out and "1-D ring" in out, out

    plans = {p["algorithm"]: p for p in json.loads(out_json.read_text())["training"]}
    assert plans["2-D halves"]["cycles"] < 0.7 * plans["1-D ring"]["cycles"]
    assert plans["1-D ring"]["sections"] == 3 and plans["1-D ring"]["bytes"] == 4 * 42_432
    ring = plan_training(TINY, model_preset("tiny"), Topology.ring(16))
    assert [p.algorithm for p in ring] == ["1-D ring"]
    assert ring[0].cycles == plans["1-D ring"]["cycles"]
