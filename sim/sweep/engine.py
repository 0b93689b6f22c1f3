"""Run a sweep's points on Dask (or in this process), resumably, into an output directory.

:func:`run_sweep` reads the rows already in ``out_dir`` and runs only the points not there
(the key is the point's parameters, :func:`sim.sweep.spec.point_key`): a second run computes
nothing, an interrupted one completes. Every point is one Dask task (:func:`run_point`):

- ``workers = N >= 1`` (no ``scheduler``): a ``LocalCluster`` of N worker processes with one
  thread each, started for this sweep and closed after it;
- ``scheduler = "tcp://host:port"``: an existing cluster; its workers must be able to import
  this package (installed, or on their ``PYTHONPATH``);
- ``workers = 0``: in this process, one point after the other (no Dask).

Rows are written as they arrive (at most once a second, and at the end), so an interrupted
sweep keeps what it computed. A task whose worker dies is a ``failed`` row; rows that
``failed`` are kept, and run again with ``retry_failed``. The output: ``results.parquet``,
``results.csv``, ``summary.json`` and the plots (:mod:`sim.sweep.plots`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadInput
from .plots import pareto_front, write_plots
from .results import read_rows, row_key, write_rows
from .runner import METRICS, ready, run_point
from .spec import SweepSpec

__all__ = ["run_sweep", "SweepResult", "SUMMARY", "STATUSES", "default_workers"]

SUMMARY = "summary.json"
#: A row's ``status``: it ran and matched the golden model; it ran and did not; the compiler
#: or planner refused it (does not fit); it raised or its worker died.
STATUSES = ("ok", "mismatch", "invalid", "failed")
_FLUSH_S = 1.0
_CONNECT_TIMEOUT_S = 20


def default_workers() -> int:
    """Worker processes of the local cluster when not told: one per core."""
    return os.cpu_count() or 1


@dataclass
class SweepResult:
    """What a sweep did: ``rows`` (all of the output, the spec's points first, in its order),
    how many points it ``computed`` now and ``skipped`` (already there), its timing (``wall_s``
    in all, ``startup_s`` of those to start or reach the cluster) and the files written."""

    rows: list[dict]
    points: int
    computed: int
    skipped: int
    wall_s: float
    startup_s: float
    cluster: dict
    files: dict[str, Path] = field(default_factory=dict)
    summary: dict = field(default_factory=dict)

    @property
    def points_per_s(self) -> float | None:
        busy = self.wall_s - self.startup_s
        return self.computed / busy if self.computed and busy > 0 else None

    def counts(self) -> dict[str, int]:
        """Rows of the spec's points by status."""
        out = dict.fromkeys(STATUSES, 0)
        for r in self.rows[:self.points]:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out


@contextlib.contextmanager
def _quiet_distributed():
    """Keep distributed's informational logging (scheduler and worker start and stop) off the
    terminal: only its errors."""
    loggers = [logging.getLogger(n) for n in ("distributed", "distributed.scheduler",
                                              "distributed.client", "distributed.nanny",
                                              "distributed.worker", "distributed.core")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _failed(point, exc) -> dict:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return {**point.params, **METRICS, "sram_capacity": point.npu.sram_bytes,
            "status": "failed", "error": text}


@contextlib.contextmanager
def _dask(scheduler, workers, cluster):
    """A Dask client: to ``scheduler``, or to a local cluster of ``workers`` processes."""
    # Dask is the sweep's optional dependency (the `sweep` extra); loaded only to use it.
    import dask
    from distributed import Client, LocalCluster

    start = time.perf_counter()
    local = None
    with _quiet_distributed():
        try:
            if scheduler is not None:
                try:
                    client = Client(scheduler, timeout=_CONNECT_TIMEOUT_S)
                except (OSError, ValueError, TypeError) as exc:
                    raise BadInput(f"--scheduler {scheduler}: cannot connect "
                                   f"({' '.join(str(exc).split())})") from None
                try:
                    client.wait_for_workers(1, timeout=_CONNECT_TIMEOUT_S)
                except TimeoutError:
                    client.close()
                    raise BadInput(f"--scheduler {scheduler}: no worker joined within "
                                   f"{_CONNECT_TIMEOUT_S} s") from None
                cluster.update(kind="scheduler", scheduler=scheduler,
                               workers=len(client.nthreads()))
            else:
                # No dashboard; the scheduler's HTTP routes on a free port of localhost (its
                # default, 8787, may belong to another cluster on this machine). Points are
                # short: hand every worker its share at once rather than one task per round
                # trip to the scheduler (which lives in this process).
                with dask.config.set({"distributed.scheduler.worker-saturation": "inf"}):
                    local = LocalCluster(
                        n_workers=workers, threads_per_worker=1, processes=True,
                        dashboard_address=None, silence_logs=logging.ERROR,
                        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"})
                client = Client(local)
                cluster.update(kind="local", workers=workers)
            client.run(ready)
            cluster["startup_s"] = time.perf_counter() - start
            try:
                yield client
            finally:
                client.close()
        finally:
            if local is not None:
                local.close()


def _on_dask(client, todo):
    # Dask is the sweep's optional dependency (the `sweep` extra); loaded only to use it.
    from distributed import as_completed

    futures = {client.submit(run_point, p, pure=False): p for p in todo}
    try:
        for fut in as_completed(futures):
            try:
                yield fut.result()
            except Exception as exc:          # the worker died, or the task was lost
                yield _failed(futures[fut], exc)
    finally:
        client.cancel(list(futures))


def _bar(total, enabled):
    if not enabled:
        return None
    # tqdm is the sweep's optional dependency (the `sweep` extra); only on a terminal.
    from tqdm import tqdm

    return tqdm(total=total, unit="point", desc="npu sweep", file=sys.stderr, leave=False)


def _merged(spec_keys, fresh, old) -> list[dict]:
    """The spec's points in its order (the fresh row, else the one on disk), then rows of
    other points already on disk, in their order."""
    rows = [fresh.get(k) or old[k] for k in spec_keys if k in fresh or k in old]
    wanted = set(spec_keys)
    return rows + [r for k, r in old.items() if k not in wanted]


def run_sweep(spec: SweepSpec, out_dir: str | Path, *, scheduler: str | None = None,
              workers: int | None = None, progress: bool = False, retry_failed: bool = False,
              plots: bool = True) -> SweepResult:
    """Run the points of ``spec`` not yet in ``out_dir``; write results, summary and plots.

    ``workers``: local worker processes (default :func:`default_workers`; 0 runs in this
    process); ``scheduler``: the address of an existing cluster instead. ``progress`` shows a
    bar on stderr. A point that cannot run is a row, never an exception.
    """
    if scheduler is not None and workers is not None:
        raise BadInput("--workers starts a local cluster; it does not apply with --scheduler")
    if workers is None:
        workers = default_workers() if scheduler is None else None
    if workers is not None and workers < 0:
        raise BadInput(f"--workers {workers} must be 0 (in this process) or more")
    start = time.perf_counter()
    out_dir = Path(out_dir)
    try:        # before any point runs: a sweep must be able to keep what it computes
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--out {out_dir}: cannot create the directory: "
                       f"{exc.strerror or exc}") from None
    points = spec.points()
    keys = [p.key for p in points]
    old = {row_key(r): r for r in read_rows(out_dir)}
    todo = [p for p, k in zip(points, keys, strict=True)
            if k not in old or (retry_failed and old[k]["status"] == "failed")]
    fresh: dict[tuple, dict] = {}
    cluster: dict = {"kind": "in-process", "workers": 0, "startup_s": 0.0}
    files: dict[str, Path] = {}
    last = time.perf_counter()
    bar = _bar(len(todo), progress and bool(todo))
    try:
        if not todo:
            pass
        elif scheduler is None and workers == 0:
            for row in map(run_point, todo):
                fresh[row_key(row)] = row
                last = _tick(bar, keys, fresh, old, out_dir, last, files)
        else:
            with _dask(scheduler, workers, cluster) as client:
                for row in _on_dask(client, todo):
                    fresh[row_key(row)] = row
                    last = _tick(bar, keys, fresh, old, out_dir, last, files)
    finally:
        if bar is not None:
            bar.close()
        rows = _merged(keys, fresh, old)
        if rows:
            files.update(write_rows(rows, out_dir))
    if plots and rows:
        files.update(write_plots(rows, out_dir))
    result = SweepResult(rows=rows, points=len(points), computed=len(fresh),
                         skipped=len(points) - len(todo), wall_s=time.perf_counter() - start,
                         startup_s=cluster.get("startup_s", 0.0), cluster=cluster,
                         files=files)
    files["summary"] = out_dir / SUMMARY
    result.summary = _summary(spec, out_dir, result)
    try:
        files["summary"].write_text(json.dumps(result.summary, indent=2) + "\n")
    except OSError as exc:
        raise BadInput(f"cannot write {files['summary']}: {exc.strerror}") from None
    return result


def _tick(bar, keys, fresh, old, out_dir, last, files):
    if bar is not None:
        bar.update(1)
    now = time.perf_counter()
    if now - last >= _FLUSH_S:
        files.update(write_rows(_merged(keys, fresh, old), out_dir))
        return now
    return last


def _brief(row) -> dict:
    keep = ("npu", "model", "strategy", "chips", "grid", "backend", "latency_ms",
            "tokens_per_s", "sram_bytes_max", "sram_bytes_total")
    return {k: row.get(k) for k in keep}


def _summary(spec, out_dir, result) -> dict:
    rows = result.rows[:result.points]
    best = {}
    for r in rows:
        if r.get("fits") and r.get("latency_ms") is not None:
            cur = best.get(r["strategy"])
            if cur is None or r["latency_ms"] < cur["latency_ms"]:
                best[r["strategy"]] = r
    failed = [{"point": {k: r.get(k) for k in r if k not in METRICS}, "error": r["error"]}
              for r in rows if r["status"] == "failed"]
    return {
        "spec": spec.path, "out": str(out_dir), "points": result.points,
        "computed": result.computed, "skipped": result.skipped,
        "status": result.counts(), "cluster": dict(result.cluster),
        "wall_s": result.wall_s, "points_per_s": result.points_per_s,
        "best_per_strategy": {s: _brief(r) for s, r in sorted(best.items())},
        "pareto": [_brief(r) for r in pareto_front(rows)],
        "failed": failed,
        "files": {k: str(v) for k, v in result.files.items()},
    }
