"""Sweeps on Dask and in this process (sim.sweep.engine): the same rows on a local cluster, on a
separately started scheduler and in-process; resumption; failing points recorded."""

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from sim.sweep import load_spec, read_rows, run_sweep, runner, write_rows
from sim.sweep.plots import PLOTS
from tests.helpers import ROOT, TINY_MODEL, TINY_NPU, comparable, run, write_spec

# Six points on the ISS (about 0.3 s each): five run, data on 2 chips (batch 1) does not.
GRID = {"npu": TINY_NPU, "model": TINY_MODEL, "strategy": ["head", "pipeline", "data"],
        "chips": [1, 2], "backend": "iss"}
OVERRIDES = {"link_bytes_per_cycle": 8}


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory):
    return write_spec(tmp_path_factory.mktemp("spec") / "grid.toml", GRID, OVERRIDES)


@pytest.fixture(scope="module")
def reference(spec_path, tmp_path_factory):
    """The grid run in this process, one point after the other."""
    out = tmp_path_factory.mktemp("in-process")
    return run_sweep(load_spec(spec_path), out, workers=0), out


def test_in_process_rows(reference):
    result, out = reference
    assert (result.points, result.computed, result.skipped) == (6, 6, 0)
    assert result.counts() == {"ok": 5, "mismatch": 0, "invalid": 1, "failed": 0}
    assert [(r["strategy"], r["chips"], r["status"]) for r in result.rows] == [
        ("head", 1, "ok"), ("head", 2, "ok"), ("pipeline", 1, "ok"), ("pipeline", 2, "ok"),
        ("data", 1, "ok"), ("data", 2, "invalid")]
    assert all(r["link_bytes_per_cycle"] == 8 for r in result.rows)
    assert comparable(read_rows(out)) == comparable(result.rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["points"] == 6 and summary["status"]["invalid"] == 1
    assert summary["cluster"]["kind"] == "in-process"
    for name in ("results.parquet", "results.csv", *PLOTS.values()):
        assert (out / name).stat().st_size > 0


def test_a_local_cluster_gives_the_in_process_rows(reference, spec_path, tmp_path):
    result = run_sweep(load_spec(spec_path), tmp_path, workers=2)
    assert result.cluster["kind"] == "local" and result.cluster["workers"] == 2
    assert result.computed == 6
    assert comparable(result.rows) == comparable(reference[0].rows)
    assert comparable(read_rows(tmp_path)) == comparable(reference[0].rows)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def scheduler(tmp_path):
    """A `dask scheduler` and one `dask worker` on localhost, as separate processes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    port = _free_port()
    info = tmp_path / "scheduler.json"
    address = f"tcp://127.0.0.1:{port}"
    commands = [
        ["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
         "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(info)],
        ["worker", address, "--nworkers", "1", "--nthreads", "1", "--no-nanny",
         "--no-dashboard"],
    ]
    procs = []
    with contextlib.ExitStack() as stack:
        try:
            for command in commands:
                log = stack.enter_context(open(tmp_path / f"{command[0]}.log", "w"))
                procs.append(subprocess.Popen([sys.executable, "-m", "dask", *command],
                                              env=env, cwd=tmp_path, stdout=log,
                                              stderr=subprocess.STDOUT))
                deadline = time.monotonic() + 60
                while command[0] == "scheduler" and not info.exists():
                    assert procs[0].poll() is None, (tmp_path / "scheduler.log").read_text()
                    assert time.monotonic() < deadline, "the scheduler did not start"
                    time.sleep(0.05)
            yield address
        finally:
            for proc in reversed(procs):
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_a_separate_scheduler_gives_the_same_rows(reference, spec_path, scheduler, tmp_path,
                                                  capsys):
    status, out, err = run(capsys, "sweep", spec_path, "--scheduler", scheduler, "--out",
                           str(tmp_path))
    assert status == 0, err
    assert err == ""            # no progress bar off a terminal, no distributed logging
    assert out.startswith(f"npu sweep: 6 points: 6 computed on {scheduler} (1 workers)")
    assert comparable(read_rows(tmp_path)) == comparable(reference[0].rows)


def test_a_second_run_computes_nothing(reference, spec_path, tmp_path, monkeypatch):
    shutil.copytree(reference[1], tmp_path, dirs_exist_ok=True)
    ran = _count_runs(monkeypatch)
    result = run_sweep(load_spec(spec_path), tmp_path, workers=0)
    assert (result.computed, result.skipped, ran) == (0, 6, [])
    assert comparable(result.rows) == comparable(reference[0].rows)


def test_a_partial_output_is_completed(reference, spec_path, tmp_path, monkeypatch):
    rows = reference[0].rows
    write_rows([rows[0], rows[3], rows[5]], tmp_path)
    ran = _count_runs(monkeypatch)
    result = run_sweep(load_spec(spec_path), tmp_path, workers=0)
    assert (result.computed, result.skipped) == (3, 3)
    assert sorted(ran) == [("data", 1), ("head", 2), ("pipeline", 1)]
    assert comparable(read_rows(tmp_path)) == comparable(rows)


def test_rows_of_other_points_are_kept(reference, tmp_path):
    shutil.copytree(reference[1], tmp_path, dirs_exist_ok=True)
    smaller = write_spec(tmp_path / "one.toml", {**GRID, "strategy": "head", "chips": [1, 4]},
                         OVERRIDES)
    result = run_sweep(load_spec(smaller), tmp_path, workers=0)
    assert (result.points, result.computed, result.skipped) == (2, 1, 1)
    assert [(r["strategy"], r["chips"]) for r in result.rows[:2]] == [("head", 1), ("head", 4)]
    assert len(read_rows(tmp_path)) == 7


def _count_runs(monkeypatch):
    ran = []
    real = runner.RUNNERS["iss"]

    def counted(point):
        ran.append((point.params["strategy"], point.params["chips"]))
        return real(point)
    monkeypatch.setitem(runner.RUNNERS, "iss", counted)
    return ran


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(spec_path, tmp_path, monkeypatch,
                                                           capsys):
    real = runner.RUNNERS["iss"]

    def flaky(point):
        if point.params["strategy"] == "pipeline":
            raise RuntimeError("lost the chip")
        return real(point)
    monkeypatch.setitem(runner.RUNNERS, "iss", flaky)
    status, out, err = run(capsys, "sweep", spec_path, "--workers", "0", "--out",
                           str(tmp_path))
    assert status == 1 and err == ""
    assert "5 ok" not in out and "2 failed" in out
    assert "failed: strategy=pipeline, chips=1, backend=iss: RuntimeError: lost the chip" in out
    rows = read_rows(tmp_path)
    assert [r["status"] for r in rows] == ["ok", "ok", "failed", "failed", "ok", "invalid"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [f["error"] for f in summary["failed"]] == ["RuntimeError: lost the chip"] * 2
    # Failed points are kept on a plain rerun and run again with --retry-failed.
    monkeypatch.setitem(runner.RUNNERS, "iss", real)
    assert run(capsys, "sweep", spec_path, "--workers", "0", "--out", str(tmp_path))[0] == 1
    status, out, _ = run(capsys, "sweep", spec_path, "--workers", "0", "--out", str(tmp_path),
                         "--retry-failed")
    assert status == 0 and "2 computed in this process, 4 already in" in out
    assert [r["status"] for r in read_rows(tmp_path)] == ["ok"] * 5 + ["invalid"]


def test_the_progress_bar_is_asked_for(spec_path, tmp_path, capsys):
    spec = load_spec(write_spec(tmp_path / "s.toml", {**GRID, "strategy": "data", "chips": 2}))
    run_sweep(spec, tmp_path / "quiet", workers=0, plots=False)
    assert capsys.readouterr().err == ""
    run_sweep(spec, tmp_path / "bar", workers=0, progress=True, plots=False)
    assert "npu sweep" in capsys.readouterr().err


def test_an_unreachable_scheduler_is_bad_input(spec_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sim.sweep.engine._CONNECT_TIMEOUT_S", 1)
    address = f"tcp://127.0.0.1:{_free_port()}"
    status, out, err = run(capsys, "sweep", spec_path, "--scheduler", address, "--out",
                           str(tmp_path))
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"npu sweep: --scheduler {address}: cannot connect")
