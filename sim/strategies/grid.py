"""The strategies of the grid compiler (:mod:`sim.compiler.grid`): data replicas, pipeline
stages and head shards, alone or two at a time.

A 1-D strategy puts all of its chips on one axis of the grid; a 2-D one (:class:`Composite`)
puts ``--grid AxB``'s A chips on its first part's axis and B on its second's, and adds both
parts' report sections and limits."""

from __future__ import annotations

import dataclasses

import numpy as np

from ..compiler.grid import Grid, compile_grid, head_shards, stage_layers
from .base import Split, Strategy, parse_grid
from .roles import part, stage_roles

__all__ = ["GridStrategy", "Composite"]

#: The grid axis of each 1-D part.
AXES = {"data": "replicas", "pipeline": "stages", "head": "shards"}


class GridStrategy(Strategy):
    """A strategy the grid compiler compiles: its chips on the axes of its :attr:`parts`."""

    long_passes = True

    def layout(self, chips: int, grid: str | None = None) -> Grid:
        """The grid it runs on ``chips`` chips (``grid`` "AxB" for the 2-D ones)."""
        if self.is_grid:
            if grid is None:
                raise ValueError(f"--strategy {self.name} needs --grid AxB (A x B = --chips "
                                 f"{chips})")
            a, b = parse_grid(grid)
            if a * b != chips:
                raise ValueError(f"--grid {grid} is {a * b} chips, not --chips {chips}")
            sizes = (a, b)
        else:
            if grid is not None:
                self.check_options(chips=chips, grid=grid)
            sizes = (chips,) * len(self.parts)
        return Grid(**{AXES[p]: size for p, size in zip(self.parts, sizes, strict=True)})

    def split(self, chips: int, grid: tuple[int, int] | None = None) -> Split:
        sizes = grid if self.is_grid else (chips,) * len(self.parts)
        axes = {AXES[p]: size for p, size in zip(self.parts, sizes, strict=True)}
        return Split(axes.get("shards", 1), axes.get("stages", 1), axes.get("replicas", 1))

    def report_limits(self, npu, cfg, chips, grid, limits, *, samples=None):
        """And a head, a layer and (``samples``) a sample for each chip splitting them."""
        super().report_limits(npu, cfg, chips, grid, limits, samples=samples)
        split = self.split(chips, parse_grid(grid) if isinstance(grid, str) else grid) \
            if grid is not None or not self.is_grid else Split()
        limits.run(head_shards, cfg, split.shards)
        limits.run(stage_layers, cfg, split.stages)
        if samples is not None and split.replicas > samples:
            limits.refuse(f"is less than the {split.replicas} data-parallel replicas: data "
                          "parallelism needs a sample per replica", path=cfg.path, key="batch",
                          value=samples, limit=split.replicas)

    def _compile(self, npu, qm, chips, *, seq, samples, microbatches, grid, reduce):
        return compile_grid(npu, qm, self.layout(chips, grid), strategy=self.name, seq=seq,
                            samples=samples, microbatches=microbatches)

    def compile_shapes(self, npu, qm, chips, *, samples, microbatches=None, grid=None,
                       only=None, emit=True):
        return compile_grid(npu, qm, self.layout(chips, grid), strategy=self.name,
                            seq=qm.cfg.seq_len, samples=samples, microbatches=microbatches,
                            contents=False, check=False, only=only, emit=emit)

    def comm(self, npu, cfg, chips, grid=None):
        split = self.split(chips, grid)
        # Each replica runs its share of the batch (numpy.array_split: the first the largest).
        samples = max(len(p) for p in np.array_split(range(cfg.batch), split.replicas))
        sent = colls = 0
        notes = []
        for one in self.parts_of():
            s, c, n = one.part_comm(npu, cfg, split, samples)
            sent, colls, notes = sent + s, colls + c, notes + n
        return sent, colls, notes

    def parts_of(self) -> tuple[GridStrategy, ...]:
        return (self,)

    def part_comm(self, npu, cfg, split, samples) -> tuple[int, int, list[str]]:
        """This 1-D part's communication per layer (also inside a grid): bytes a chip sends,
        collectives, notes; ``samples``: the batch of one replica."""
        return 0, 0, []

    def part_sections(self, prog, comms, res, spans) -> dict:
        """The sections this 1-D strategy adds (also inside a grid)."""
        return {}

    def sections(self, prog, comms, res, spans) -> dict:
        return self.part_sections(prog, comms, res, spans)


class Composite(GridStrategy):
    """A 2-D grid of two 1-D grid strategies (``first+second``)."""

    def __init__(self, first: GridStrategy, second: GridStrategy):
        self.first, self.second = first, second
        self.name = f"{first.name}+{second.name}"
        self.parts = (first.name, second.name)
        self.splits = f"{first.name} (A chips) x {second.name} (B chips)"
        self.relieves = "both parts' limits"
        self.quants = tuple(q for q in first.quants if q in second.quants)
        self.options = first.options | second.options | {"grid"}
        self.planned = "analytic"

    def parts_of(self):
        return (self.first, self.second)

    def roles(self, npu, cfg, chips, grid, picks):
        a, b = grid
        if self.first.parts == ("head",):
            # Pipeline stages of head groups: stage c // a, member c % a.
            return stage_roles(cfg, b, a, picks)
        # Data replicas of the second part: replica c // b runs its share of the batch.
        out = []
        for c in picks:
            r, k = divmod(c, b)
            inner = dataclasses.replace(cfg, batch=max(1, part(cfg.batch, a, r)))
            role = self.second.roles(npu, inner, b, None, [k])[0]
            out.append(dataclasses.replace(role, chip=c))
        return out

    def sections(self, prog, comms, res, spans) -> dict:
        return {**self.first.part_sections(prog, comms, res, spans),
                **self.second.part_sections(prog, comms, res, spans)}

    def search_limit(self, cfg, npu) -> int:
        return self.first.search_limit(cfg, npu) * self.second.search_limit(cfg, npu)
