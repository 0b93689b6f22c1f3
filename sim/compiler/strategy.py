"""Compile a model for N chips with one of the strategies: a grid of data replicas, pipeline
stages and head shards (``sim.compiler.grid``), or sequence (``sim.compiler.sequence``) and
hidden-dimension (``sim.compiler.hidden``) parallelism, which have compilers of their own."""

from __future__ import annotations

import re

from hw.spec import NpuConfig

from .grid import Grid, compile_grid
from .hidden import compile_hidden
from .program import SystemProgram
from .quantize import QModel
from .sequence import compile_sequence

__all__ = ["BUILT", "GRIDS", "SMOOTH16", "parse_grid", "strategy_grid", "compile_program"]

#: Strategies with a compiler (the others are refused as not built yet).
BUILT = ("single", "head", "pipeline", "data", "sequence", "head+pipeline", "data+head",
         "data+pipeline", "hidden")
#: The 2-D strategies: ``--grid AxB`` gives the first part A chips, the second B.
GRIDS = ("head+pipeline", "data+head", "data+pipeline")
#: Strategies whose compiler emits ``quant = "smooth16"`` (the grid compiler's block emitter).
SMOOTH16 = ("single", "head", "pipeline", "data", "head+pipeline", "data+head", "data+pipeline")


def parse_grid(text: str) -> tuple[int, int]:
    """``"2x3"`` -> ``(2, 3)``; ValueError for anything else."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text or "")
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise ValueError(f"--grid {text!r} is not AxB with A, B >= 1 (e.g. 2x2)")
    return int(match[1]), int(match[2])


def strategy_grid(strategy: str, chips: int, grid: str | None = None) -> Grid:
    """The grid a strategy runs on ``chips`` chips (``grid`` "AxB" for the 2-D ones)."""
    if strategy in GRIDS:
        if grid is None:
            raise ValueError(f"--strategy {strategy} needs --grid AxB (A x B = --chips {chips})")
        a, b = parse_grid(grid)
        if a * b != chips:
            raise ValueError(f"--grid {grid} is {a * b} chips, not --chips {chips}")
        first, second = strategy.split("+")
        sizes = {first: a, second: b}
        return Grid(replicas=sizes.get("data", 1), stages=sizes.get("pipeline", 1),
                    shards=sizes.get("head", 1))
    if grid is not None:
        raise ValueError(f"--grid applies to {', '.join(GRIDS)}, not --strategy {strategy}")
    if strategy == "single":
        if chips != 1:
            raise ValueError(f"--strategy single runs on one chip, not --chips {chips}")
        return Grid()
    return {"head": Grid(shards=chips), "pipeline": Grid(stages=chips),
            "data": Grid(replicas=chips)}[strategy]


def compile_program(strategy: str, npu: NpuConfig, qm: QModel, chips: int, *, seq: int,
                    samples: int, microbatches: int | None = None,
                    grid: str | None = None, reduce: str | None = None) -> SystemProgram:
    """Programs for ``chips`` chips; ``ValueError`` for a strategy/option that does not apply
    (``ConfigError`` for a model or chip that cannot run it). ``reduce``: hidden only
    (``sim.compiler.hidden.REDUCE_MODES``)."""
    if strategy not in BUILT:
        raise ValueError(f"--strategy {strategy} is not built yet (built: {', '.join(BUILT)})")
    if qm.quant == "smooth16" and strategy not in SMOOTH16:
        raise ValueError(f"--strategy {strategy} does not compile quant=\"smooth16\" yet "
                         f"(strategies that do: {', '.join(SMOOTH16)}); use --quant int8")
    if reduce is not None and strategy != "hidden":
        raise ValueError("reduce applies to --strategy hidden")
    if strategy in ("sequence", "hidden"):
        if microbatches is not None:
            raise ValueError("--microbatches applies to strategies with a pipeline")
        if grid is not None:
            raise ValueError(f"--grid applies to {', '.join(GRIDS)}, not --strategy {strategy}")
        if strategy == "hidden":
            return compile_hidden(npu, qm, chips, seq=seq, samples=samples,
                                  reduce=reduce or "reduce_scatter")
        return compile_sequence(npu, qm, chips, seq=seq, samples=samples)
    layout = strategy_grid(strategy, chips, grid)
    if microbatches is not None and "pipeline" not in strategy:
        raise ValueError("--microbatches applies to strategies with a pipeline")
    return compile_grid(npu, qm, layout, strategy=strategy, seq=seq, samples=samples,
                        microbatches=microbatches)
