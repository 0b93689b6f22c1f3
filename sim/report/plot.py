"""A run's timeline as a picture (``npu sim --plot``): one row per chip, what it did when.

Each chip's row shows, over cycles, its compute units (matmul, attention, vector), its
communication (collective, send, receive) and the cycles in which it was idle, from the
busy intervals of its trace (``sim.report.timeline``).
"""

from __future__ import annotations

from pathlib import Path

from .timeline import COMM_UNITS, COMPUTE_UNITS

__all__ = ["COLORS", "plot_timeline", "plot_spans"]

#: Colour per unit (compute in blues and greens, communication in oranges and reds).
COLORS = {"matmul": "#1f77b4", "attention": "#17becf", "vector": "#2ca02c",
          "collective": "#d62728", "send": "#ff7f0e", "recv": "#e6b800"}


def plot_timeline(report, path: str | Path) -> Path:
    """Write ``report``'s timeline (a timed :class:`~sim.report.core.SimReport`) as a PNG."""
    if report.spans is None:
        raise ValueError("the run has no timing (the ISS does not time programs)")
    title = (f"{report.model.name} on {len(report.spans)} x {report.npu.name}, strategy "
             f"{report.strategy}, {report.backend}: {report.cycles:,} cycles")
    if report.pipeline and report.pipeline.get("bubble_fraction") is not None:
        title += f", bubble {report.pipeline['bubble_fraction']:.1%}"
    return plot_spans(report.spans, report.cycles, title, path)


def plot_spans(spans, cycles: int, title: str, path: str | Path, marks=()) -> Path:
    """Write a timeline of ``spans`` (per chip, per unit its busy intervals) over ``cycles``
    as a PNG; ``marks``: ``(cycle, label)`` pairs drawn as vertical lines (a generation's
    picks: the first token, then each step)."""
    # matplotlib is imported only when a plot is asked for (it takes a second to load);
    # the Agg backend needs no display.
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    matplotlib.use("Agg")

    chips = len(spans)
    units = COMPUTE_UNITS + COMM_UNITS
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.9 * chips), dpi=120)
    lane = 0.8 / len(units)
    for c, span in enumerate(spans):
        y0 = chips - 1 - c
        ax.broken_barh([(0, cycles)], (y0 - 0.45, 0.9), facecolors="#f0f0f0")
        for k, unit in enumerate(units):
            bars = [(s, e - s) for s, e in span[unit]]
            if bars:
                ax.broken_barh(bars, (y0 - 0.4 + k * lane, lane), facecolors=COLORS[unit])
    for cycle, label in marks:
        ax.axvline(cycle, color="black", linewidth=0.8)
        ax.text(cycle, chips - 0.45, f" {label}", fontsize=7, va="bottom")
    ax.set_yticks(range(chips))
    ax.set_yticklabels([f"chip {chips - 1 - y}" for y in range(chips)])
    ax.set_xlim(0, cycles)
    ax.set_ylim(-0.6, chips - 0.4 + (0.35 if marks else 0))
    ax.set_xlabel("cycle")
    ax.set_title(title)
    handles = [Patch(color=COLORS[u], label=u) for u in units] + \
        [Patch(color="#f0f0f0", label="idle")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.6 / (chips + 1)),
              ncol=len(handles), frameon=False)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
