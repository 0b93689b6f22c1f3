"""The sweep's pictures (PNG): latency against chips, SRAM per chip against chips (the capacity
frontier), and the Pareto front of latency against total SRAM.

A *series* is a strategy together with every other parameter that varies in the rows (an NPU
file, a model, an override, the backend, the batch); the grid and the seed do not make series:
at one chip count a series shows its best grid (the lowest value), and the programs, so their
cycles and bytes, do not depend on the seed.
"""

from __future__ import annotations

import math
from pathlib import Path

from .spec import AXES, OVERRIDABLE

__all__ = ["PLOTS", "pareto_front", "write_plots", "series_label"]

#: The file of each plot in the output directory.
PLOTS = {"latency": "latency_vs_chips.png", "sram": "sram_vs_chips.png",
         "pareto": "pareto_latency_sram.png"}
_NOT_SERIES = ("strategy", "chips", "grid", "seed")


def _timed(rows):
    return [r for r in rows if r.get("fits") and r.get("latency_ms") is not None]


def pareto_front(rows) -> list[dict]:
    """The fitting, timed rows that no other beats on both latency and total SRAM (lower is
    better on each), by total SRAM."""
    cand = sorted((r for r in _timed(rows) if r.get("sram_bytes_total") is not None),
                  key=lambda r: (r["sram_bytes_total"], r["latency_ms"]))
    front, best = [], math.inf
    for r in cand:
        if r["latency_ms"] < best:
            front.append(r)
            best = r["latency_ms"]
    return front


def _varying(rows) -> list[str]:
    """The parameters (but strategy, chips, grid, seed) that take more than one value."""
    names = [c for c in (*AXES, *OVERRIDABLE) if c not in _NOT_SERIES
             and any(c in r for r in rows)]
    return [c for c in names if len({repr(r.get(c)) for r in rows}) > 1]


def _short(column, value):
    if column in ("npu", "model") and isinstance(value, str):
        return Path(value).stem
    return value


def series_label(row, varying) -> str:
    rest = ", ".join(f"{c}={_short(c, row.get(c))}" for c in varying)
    return row["strategy"] + (f" ({rest})" if rest else "")


def _series(rows, value, varying):
    """{label: {chips: (lowest value, fits)}} over the rows that have ``value``."""
    out = {}
    for r in rows:
        v = r.get(value)
        if v is None:
            continue
        at = out.setdefault(series_label(r, varying), {})
        old = at.get(r["chips"])
        if old is None or (bool(r.get("fits")), -v) > (old[1], -old[0]):
            at[r["chips"]] = (v, bool(r.get("fits")))
    return out


def _legend(ax):
    # Beside the axes: series often overlap, and a legend inside would hide some.
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _empty(ax, text):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)


def _chip_axis(ax, rows):
    chips = sorted({r["chips"] for r in rows})
    if chips:
        ax.set_xscale("log", base=2)
        ax.set_xticks(chips, [str(c) for c in chips])
        ax.minorticks_off()
    ax.set_xlabel("chips")


def _latency(ax, rows, varying):
    series = _series(_timed(rows), "latency_ms", varying)
    for label, at in sorted(series.items()):
        xs = sorted(at)
        ax.plot(xs, [at[x][0] for x in xs], marker="o", label=label)
    if not series:
        _empty(ax, "no fitting point with a latency\n(the backend gives no cycles, or "
                   "nothing fits)")
    else:
        _legend(ax)
    _chip_axis(ax, rows)
    ax.set_ylabel("latency (ms)")
    ax.set_title("latency vs chips (best grid per chip count)")


def _sram(ax, rows, varying):
    series = _series(rows, "sram_bytes_max", varying)
    for label, at in sorted(series.items()):
        xs = sorted(at)
        (line,) = ax.plot(xs, [at[x][0] for x in xs], marker="", label=label)
        fit = [x for x in xs if at[x][1]]
        miss = [x for x in xs if not at[x][1]]
        ax.plot(fit, [at[x][0] for x in fit], "o", color=line.get_color())
        ax.plot(miss, [at[x][0] for x in miss], "x", color=line.get_color(), markersize=9)
    capacities = sorted({r["sram_capacity"] for r in rows if r.get("sram_capacity")})
    for cap in capacities:
        ax.axhline(cap, linestyle="--", color="black", linewidth=1)
        ax.annotate(f"sram_bytes {cap:,}", (0.01, cap), xycoords=("axes fraction", "data"),
                    va="bottom", fontsize="small")
    unsized = sum(1 for r in rows if r.get("sram_bytes_max") is None)
    if not series:
        _empty(ax, "no point with a size")
    else:
        _legend(ax)
    _chip_axis(ax, rows)
    ax.set_ylabel("SRAM used per chip, largest chip (bytes)")
    title = "SRAM per chip vs chips (o fits, x does not; dashed: capacity)"
    if unsized:
        title += f"\n{unsized} point(s) refused before a size was known are not shown"
    ax.set_title(title)


def _pareto(ax, rows, varying):
    timed = [r for r in _timed(rows) if r.get("sram_bytes_total") is not None]
    by = {}
    for r in timed:
        by.setdefault(series_label(r, varying), []).append(r)
    for label, items in sorted(by.items()):
        ax.scatter([r["sram_bytes_total"] for r in items], [r["latency_ms"] for r in items],
                   label=label, alpha=0.6)
    front = pareto_front(rows)
    if front:
        ax.step([r["sram_bytes_total"] for r in front], [r["latency_ms"] for r in front],
                where="post", color="black", linewidth=1, label="Pareto front")
        for r in front:
            grid = f" {r['grid']}" if r.get("grid") else ""
            ax.annotate(f"{series_label(r, varying)}{grid} x{r['chips']}",
                        (r["sram_bytes_total"], r["latency_ms"]), fontsize="x-small",
                        xytext=(4, 4), textcoords="offset points")
        _legend(ax)
    else:
        _empty(ax, "no fitting point with a latency and a size")
    ax.set_xlabel("total SRAM used, all chips (bytes)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("latency vs total SRAM: the Pareto front")


def write_plots(rows: list[dict], out_dir: str | Path) -> dict[str, Path]:
    """Write the three plots of ``rows`` into ``out_dir``; return their paths by name."""
    # matplotlib is loaded only to draw (it takes a second); a Figure needs no display.
    from matplotlib.figure import Figure

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    varying = _varying(rows)
    paths = {}
    for name, draw in (("latency", _latency), ("sram", _sram), ("pareto", _pareto)):
        fig = Figure(figsize=(10, 5.5), dpi=110, layout="constrained")
        draw(fig.subplots(), rows, varying)
        paths[name] = out_dir / PLOTS[name]
        fig.savefig(paths[name])
    return paths

