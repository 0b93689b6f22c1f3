"""``npu bench``: run every benchmark module, write JSON and print a table.

A benchmark module is ``sim/benches/<name>.py`` with ``run(quick: bool) -> list[dict]``. Each row
has at least ``bench`` (what was measured), ``value`` and ``unit``; rows that compare against a
bound or a peer measured in the same run also give ``ref`` and ``ratio``.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import time
from pathlib import Path

from .. import benches
from ..errors import BadInput

__all__ = ["run_benchmarks", "format_table", "write_json"]


def _modules():
    for info in sorted(pkgutil.iter_modules(benches.__path__), key=lambda m: m.name):
        yield info.name, importlib.import_module(f"{benches.__name__}.{info.name}")


def _fmt(value):
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def format_table(rows: list[dict]) -> str:
    cols = ["bench", "value", "unit", "ref", "ratio", "note"]
    cells = [[_fmt(row.get(c)) for c in cols] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def run_benchmarks(*, quick: bool = False, only=None, progress=None) -> list[dict]:
    """Run every benchmark module (or those named in ``only``); return their rows, each with
    ``module`` added. ``progress(name, seconds)`` is called after each module."""
    known = dict(_modules())
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise BadInput(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(known)}")
    rows = []
    for name, module in known.items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        for row in module.run(quick=quick):
            rows.append({"module": name, **row})
        if progress:
            progress(name, time.perf_counter() - start)
    return rows


def write_json(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return path
