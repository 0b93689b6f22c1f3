"""sim.models.accuracy: per-layer errors against float64, local and chained; on the real
all-MiniLM-L6-v2 (``slow``: the cached checkpoint, ``tests/conftest.py``) the smooth16 scheme
meets its targets and int8 does not.

Targets (``docs/accuracy.md``): every block alone (local) within cosine 0.999 of float64, the
six layers chained within 0.995, on each of three sentences calibrated on itself.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hw.spec import ModelConfig, npu_preset
from sim.benches.accuracy import SENTENCES, launch_cycles
from sim.flows.simulate import simulate
from sim.models.accuracy import layer_accuracy
from sim.models.checkpoint import embed, import_checkpoint, tokenize
from tests.helpers import outlier_model

SMALL = ModelConfig(n_layers=3, d_model=16, n_heads=4, d_head=4, d_ff=32, seq_len=4,
                    name="small3")


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("quant", ["int8", "smooth16"])
def test_chained_is_what_npu_sim_measures(norm, quant):
    """The last block chained is the whole model's error as ``npu sim`` reports it; block 0's
    local and chained figures are one and the same run."""
    cfg = dataclasses.replace(SMALL, norm=norm, causal=norm == "pre", quant=quant)
    w, x = outlier_model(cfg, 40)
    acc = layer_accuracy(cfg, w, x)
    report = simulate(npu_preset("tiny"), cfg, backend="iss", weights=w, x=x)
    assert report.golden_match
    assert [a.layer for a in acc] == [0, 1, 2]
    assert abs(acc[-1].chained_cosine - report.cosine) < 1e-12
    assert abs(acc[-1].chained_max_abs - report.max_abs) < 1e-9
    assert (acc[0].local_cosine, acc[0].local_max_abs) == (acc[0].chained_cosine,
                                                           acc[0].chained_max_abs)
    for a in acc:
        assert 0.99 < a.local_cosine <= 1 and a.local_max_abs >= 0, a


def test_launch_cycles_counts_every_launch():
    """The closed-form sum: smooth16 adds the FFN2 hi pass's folds (d_ff beats per fold) to the
    matmul unit and GELU16, LOAD_LUT16 and the second ADD to the vector unit."""
    cfg = dataclasses.replace(SMALL, n_layers=1)
    w, x = outlier_model(cfg, 41)
    npu = npu_preset("tiny")
    base = launch_cycles(npu, cfg, w, x)
    new = launch_cycles(npu, dataclasses.replace(cfg, quant="smooth16"), w, x)
    n = npu.array_size
    folds = (cfg.seq_len // n) * (cfg.d_model // n)
    assert new["matmul"] - base["matmul"] == folds * cfg.d_ff + 3 * n + 4
    assert new["attention"] == base["attention"] and new["vector"] > base["vector"]
    assert base["total"] == sum(base[k] for k in ("matmul", "attention", "vector",
                                                  "instructions"))


@pytest.fixture(scope="module")
def minilm(minilm_checkpoint, tmp_path_factory):
    result = import_checkpoint(minilm_checkpoint, tmp_path_factory.mktemp("minilm"))
    with np.load(result.weights_path) as npz:
        weights = {k: np.asarray(npz[k], np.float64) for k in npz.files}
    return result, weights


@pytest.mark.slow
@pytest.mark.parametrize("sentence", SENTENCES)
def test_minilm_targets(minilm, sentence):
    result, weights = minilm
    x = embed(result, tokenize(result, sentence).ids)
    got = {}
    for quant in ("int8", "smooth16"):
        cfg = dataclasses.replace(result.model, seq_len=len(x), quant=quant)
        got[quant] = acc = layer_accuracy(cfg, weights, x)
        for a in acc:
            print(f"{len(x)} tokens {quant} layer {a.layer}: local cosine {a.local_cosine:.5f} "
                  f"max abs {a.local_max_abs:.3f}; chained {a.chained_cosine:.5f} max abs "
                  f"{a.chained_max_abs:.3f}")
    new, old = got["smooth16"], got["int8"]
    for a in new:
        assert a.local_cosine >= 0.999, f"smooth16 layer {a.layer}: {a}"
    assert new[-1].chained_cosine >= 0.995, new[-1]
    assert new[-1].chained_max_abs < 0.25, new[-1]
    # The int8 scheme misses both targets on the same input.
    assert min(a.local_cosine for a in old) < 0.991 and old[-1].chained_cosine < 0.98
