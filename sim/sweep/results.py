"""The results of a sweep on disk: one row per point, as Parquet and as CSV.

The columns (``docs/sweep.md``): the point's parameters (:data:`sim.sweep.spec.AXES`), one per
NPU override (named by its key), then the measured ones (:data:`sim.sweep.runner.METRICS`).
Every column has a fixed type (overrides: bool, int or float, from their values), nulls where
nothing was measured. Files are written to a temporary name and renamed, so a reader (or a
resumed sweep) never sees half a file.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import BadInput
from .runner import METRICS
from .spec import AXES, OVERRIDABLE, point_key

__all__ = ["PARQUET", "CSV", "columns", "read_rows", "write_rows", "row_key"]

PARQUET = "results.parquet"
CSV = "results.csv"

_STRING = ("npu", "model", "strategy", "grid", "backend", "status", "error", "note")
_INT = ("chips", "seed", "batch", "cycles", "sram_bytes_max", "sram_bytes_total",
        "sram_capacity", "samples")
_BOOL = ("fits", "golden_match")
_FLOAT = ("latency_ms", "tokens_per_s", "comm_share", "cosine", "wall_s")


def _overrides(rows) -> list[str]:
    seen = {}
    for row in rows:
        for k in row:
            if k in OVERRIDABLE and k not in seen:
                seen[k] = None
    return list(seen)


def columns(rows) -> list[str]:
    """The column order of ``rows``: parameters, overrides in order of appearance, metrics."""
    return [*AXES, *_overrides(rows), *METRICS]


def row_key(row: dict) -> tuple:
    """The key of a result row: its point's parameters (:func:`sim.sweep.spec.point_key`)."""
    return point_key({k: v for k, v in row.items() if k in AXES or k in OVERRIDABLE})


def _schema(rows):
    # pyarrow is the sweep's optional dependency (the `sweep` extra).
    import pyarrow as pa

    fields = []
    for name in columns(rows):
        if name in _STRING:
            kind = pa.string()
        elif name in _INT:
            kind = pa.int64()
        elif name in _BOOL:
            kind = pa.bool_()
        elif name in _FLOAT:
            kind = pa.float64()
        else:
            values = [r[name] for r in rows if r.get(name) is not None]
            if values and all(isinstance(v, bool) for v in values):
                kind = pa.bool_()
            elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                kind = pa.int64()
            else:
                kind = pa.float64()
        fields.append(pa.field(name, kind))
    return pa.schema(fields)


def _table(rows):
    # pyarrow is the sweep's optional dependency (the `sweep` extra).
    import pyarrow as pa

    schema = _schema(rows)
    full = [{name: row.get(name) for name in schema.names} for row in rows]
    return pa.Table.from_pylist(full, schema=schema)


def _replace(path: Path, write) -> None:
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        write(part)
        part.replace(path)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None


def write_rows(rows: list[dict], out_dir: str | Path) -> dict[str, Path]:
    """Write ``rows`` as ``results.parquet`` and ``results.csv`` in ``out_dir``."""
    # pyarrow is the sweep's optional dependency (the `sweep` extra).
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"--out {out_dir}: cannot create the directory: {exc.strerror}") from None
    table = _table(rows)
    paths = {"parquet": out_dir / PARQUET, "csv": out_dir / CSV}
    _replace(paths["parquet"], lambda p: pq.write_table(table, p))
    _replace(paths["csv"], lambda p: pacsv.write_csv(table, p))
    return paths


def read_rows(out_dir: str | Path) -> list[dict]:
    """The rows of ``out_dir/results.parquet`` (none when there is no such file)."""
    # pyarrow is the sweep's optional dependency (the `sweep` extra).
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(out_dir) / PARQUET
    if not path.exists():
        return []
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise BadInput(f"{path}: not a sweep's results ({exc}); use another --out") from None
    missing = [c for c in (*AXES, "status") if c not in table.column_names]
    if missing:
        raise BadInput(f"{path}: has no column {missing[0]!r}, not a sweep's results; use "
                       "another --out")
    return table.to_pylist()
