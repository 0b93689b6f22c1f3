"""One point (sim.sweep.runner): its row per backend; refused points and crashes are rows."""

import dataclasses
from types import SimpleNamespace

import pytest

from hw.spec import npu_preset
from sim.sweep import parse_spec, run_point, runner
from sim.sweep.runner import METRICS, hardware_key


def _point(**keys):
    spec = {"npu": "tiny", "model": "tiny", "strategy": "head", "chips": 2, **keys}
    overrides = spec.pop("npu_overrides", None)
    if overrides:
        spec["npu_overrides"] = overrides
    (point,) = parse_spec(spec, "s.toml").points()
    return point


def test_a_point_that_runs_gives_its_measurements():
    row = run_point(_point())
    assert list(row)[:8] == ["npu", "model", "strategy", "chips", "grid", "backend", "seed",
                             "batch"]
    assert set(METRICS) <= set(row)
    assert row["status"] == "ok" and row["fits"] and row["golden_match"] and not row["error"]
    assert row["sram_capacity"] == 65536
    # Two head shards: each holds about half the weights, both together more than one chip.
    assert 20_000 < row["sram_bytes_max"] < 43_904 < row["sram_bytes_total"]
    assert row["samples"] == 1 and row["wall_s"] > 0


def test_a_strategy_that_does_not_divide_is_an_invalid_row():
    row = run_point(_point(strategy="data"))   # 2 replicas, batch 1
    assert (row["status"], row["fits"]) == ("invalid", False)
    assert "replicas (data parallelism)=2 must be 1..1 (the batch)" in row["error"]
    assert row["cycles"] is None and row["sram_bytes_max"] is None


def test_a_scratchpad_too_small_is_an_invalid_row():
    row = run_point(_point(strategy="single", chips=1, npu_overrides={"sram_bytes": 16384}))
    assert (row["status"], row["fits"], row["sram_capacity"]) == ("invalid", False, 16384)
    assert row["error"].startswith("sram_bytes=16384 is too small: the model needs 43,904 bytes")


def test_a_2d_strategy_without_a_grid_is_an_invalid_row():
    row = run_point(_point(strategy="head+pipeline", chips=2))
    assert row["status"] == "invalid" and "no A x B grid of 2 chips" in row["error"]


def test_a_crash_is_a_failed_row_with_its_reason(monkeypatch):
    def boom(point):
        raise RuntimeError("the simulator fell over\non two lines")
    monkeypatch.setitem(runner.RUNNERS, "iss", boom)
    row = run_point(_point())
    assert (row["status"], row["fits"]) == ("failed", None)
    assert row["error"] == "RuntimeError: the simulator fell over on two lines"


def test_an_interrupt_gets_through(monkeypatch):
    def stop(point):
        raise KeyboardInterrupt
    monkeypatch.setitem(runner.RUNNERS, "iss", stop)
    with pytest.raises(KeyboardInterrupt):
        run_point(_point())


def test_the_plan_backend_maps_the_planners_report(monkeypatch):
    """Against the planner's API (``plan(npu, model, chips=, strategy=)`` -> a report whose
    ``strategies[0]`` has fits, reasons, per_chip totals, cycles, latency and tokens/s)."""
    asked = {}

    def plan(npu, model, *, chips, strategy):
        asked.update(chips=chips, strategy=strategy)
        chip = SimpleNamespace(total=30_000)
        best = SimpleNamespace(fits=False, reasons=["sram_bytes: 30,000 > 16,384"],
                               per_chip=[chip, chip], predicted_cycles=5000, latency_ms=0.05,
                               tokens_per_s=160_000.0, grid=None, notes=["analytic"],
                               timing="analytic")
        return SimpleNamespace(strategies=[best])
    monkeypatch.setattr(runner, "planner", SimpleNamespace(plan=plan))
    row = run_point(_point(backend="plan"))
    assert asked == {"chips": 2, "strategy": "head"}
    assert (row["status"], row["fits"], row["cycles"]) == ("invalid", False, 5000)
    assert (row["sram_bytes_max"], row["sram_bytes_total"]) == (30_000, 60_000)
    assert row["error"] == "sram_bytes: 30,000 > 16,384"
    assert row["note"] == "analytic; timing: analytic" and row["golden_match"] is None


def test_hardware_key_ignores_names_and_follows_the_hardware():
    tiny = npu_preset("tiny")
    renamed = dataclasses.replace(tiny, name="other", description="same chip")
    wider = dataclasses.replace(tiny, link_bytes_per_cycle=8)
    assert hardware_key(tiny, 1, "verilator") == hardware_key(renamed, 1, "verilator")
    assert hardware_key(tiny, 1, "verilator") != hardware_key(wider, 1, "verilator")
    assert hardware_key(tiny, 1, "verilator") != hardware_key(tiny, 2, "verilator")


@pytest.mark.skipif(runner.planner is None, reason="the planner (sim/planner/) is not built yet")
def test_the_plan_backend_on_the_real_planner():
    row = run_point(_point(backend="plan"))
    assert (row["status"], row["fits"], row["golden_match"]) == ("ok", True, None)
    assert row["cycles"] > 0 and row["latency_ms"] == row["cycles"] / 1e5
    assert 0 < row["sram_bytes_max"] <= 65536 and row["sram_bytes_total"] > row["sram_bytes_max"]
    small = run_point(_point(backend="plan", strategy="pipeline", chips=1,
                             npu_overrides={"sram_bytes": 16384}))
    assert (small["status"], small["fits"]) == ("invalid", False)
    assert "16,384" in small["error"] or "16384" in small["error"]
