"""The strategy registry: one module per way of spreading a model over chips.

Each module defines one :class:`~sim.strategies.base.Strategy` and registers it: ``single``,
``head``, ``pipeline``, ``data``, ``hidden``, ``sequence``, and the 2-D grids composed of
their parts (``head+pipeline``, ``data+head``, ``data+pipeline``, ``data+pipeline+head``).
The simulator
(:func:`sim.api.simulate`), the planner, the sweeps and the CLI's choices all take the
strategies from here; adding a strategy is adding a module and importing it below.
"""

from __future__ import annotations

from hw.spec import NpuConfig

from ..compiler.program import SystemProgram
from ..compiler.quantize import QModel
from .base import REGISTRY, Split, Strategy, parse_grid
from .data import DATA
from .grids import DATA_HEAD, DATA_PIPELINE, DATA_PIPELINE_HEAD, HEAD_PIPELINE
from .head import HEAD
from .hidden import HIDDEN
from .pipeline import PIPELINE
from .sequence import SEQUENCE
from .single import SINGLE

__all__ = ["REGISTRY", "NAMES", "GRIDS", "GRIDS3", "Strategy", "Split", "get", "parse_grid",
           "compile_program", "table"]

# The order users see: the 1-D strategies, then the grids.
_ORDER = (SINGLE, HEAD, PIPELINE, DATA, HIDDEN, SEQUENCE, HEAD_PIPELINE, DATA_HEAD,
          DATA_PIPELINE, DATA_PIPELINE_HEAD)
assert set(_ORDER) == set(REGISTRY.values()), "a registered strategy is missing from _ORDER"
_registered = dict(REGISTRY)
REGISTRY.clear()
REGISTRY.update((s.name, _registered[s.name]) for s in _ORDER)

#: Every strategy's name (``--strategy``'s choices).
NAMES: tuple[str, ...] = tuple(s.name for s in _ORDER)
#: The 2-D strategies (``--grid AxB``).
GRIDS: tuple[str, ...] = tuple(s.name for s in _ORDER if len(s.parts) == 2)
#: The 3-D strategies (``--grid AxBxC``).
GRIDS3: tuple[str, ...] = tuple(s.name for s in _ORDER if len(s.parts) == 3)


def get(name: str) -> Strategy:
    """The strategy called ``name``; ValueError naming the choices otherwise."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"strategy {name!r} is not one of {', '.join(NAMES)}") from None


def compile_program(strategy: str, npu: NpuConfig, qm: QModel, chips: int, *, seq: int,
                    samples: int, microbatches: int | None = None, grid: str | None = None,
                    reduce: str | None = None) -> SystemProgram:
    """Programs for ``chips`` chips with the strategy called ``strategy``
    (:meth:`Strategy.compile`)."""
    return get(strategy).compile(npu, qm, chips, seq=seq, samples=samples,
                                 microbatches=microbatches, grid=grid, reduce=reduce)


def table() -> str:
    """The strategies as a Markdown table (the README's and docs' lists)."""
    lines = ["| strategy | splits | relieves | quant | planned from |", "|---|---|---|---|---|"]
    for s in _ORDER:
        planned = {"program": "its compiled programs", "analytic": "analytic",
                   "no": "not planned"}[s.planned]
        lines.append(f"| `{s.name}` | {s.splits} | {s.relieves} | {', '.join(s.quants)} | "
                     f"{planned} |")
    return "\n".join(lines)
