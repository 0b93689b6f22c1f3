"""The strategies of the grid compiler (:mod:`sim.compiler.grid`): data replicas, pipeline
stages and head shards, alone, two or three at a time.

A 1-D strategy puts all of its chips on one axis of the grid; a 2-D one (:class:`Composite`)
puts ``--grid AxB``'s A chips on its first part's axis and B on its second's, a 3-D one
``--grid AxBxC``'s on its three, and adds the parts' report sections and limits."""

from __future__ import annotations

import dataclasses
import math

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
            shape = "x".join("ABC"[:len(self.parts)])
            if grid is None:
                raise ValueError(f"--strategy {self.name} needs --grid {shape} ("
                                 f"{' x '.join(shape.split('x'))} = --chips {chips})")
            sizes = parse_grid(grid, len(self.parts))
            if math.prod(sizes) != chips:
                raise ValueError(f"--grid {grid} is {math.prod(sizes)} chips, not --chips "
                                 f"{chips}")
        else:
            if grid is not None:
                self.check_options(chips=chips, grid=grid)
            sizes = (chips,) * len(self.parts)
        return Grid(**{AXES[p]: size for p, size in zip(self.parts, sizes, strict=True)})

    def split(self, chips: int, grid: tuple[int, ...] | None = None) -> Split:
        sizes = grid if self.is_grid else (chips,) * len(self.parts)
        axes = {AXES[p]: size for p, size in zip(self.parts, sizes, strict=True)}
        return Split(axes.get("shards", 1), axes.get("stages", 1), axes.get("replicas", 1))

    def report_limits(self, npu, cfg, chips, grid, limits, *, samples=None):
        """And a head, a layer and (``samples``) a sample for each chip splitting them."""
        super().report_limits(npu, cfg, chips, grid, limits, samples=samples)
        split = self.split(chips, parse_grid(grid, len(self.parts)) if isinstance(grid, str)
                           else grid) if grid is not None or not self.is_grid else Split()
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
        samples = -(-cfg.batch // split.replicas)        # the largest replica's share
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
    """A grid of two or three 1-D grid strategies (``first+second``, ``first+second+third``):
    ``--grid AxB`` (``AxBxC``) gives each part its axis's chips."""

    def __init__(self, *parts: GridStrategy):
        self.members = parts
        self.first, self.second = parts[0], parts[1]
        self.name = "+".join(p.name for p in parts)
        self.parts = tuple(p.name for p in parts)
        self.splits = " x ".join(f"{p.name} ({c} chips)" for p, c in zip(parts, "ABC",
                                                                         strict=False))
        self.relieves = "every part's limits" if len(parts) > 2 else "both parts' limits"
        self.quants = tuple(q for q in parts[0].quants if all(q in p.quants for p in parts))
        self.options = frozenset().union(*(p.options for p in parts)) | {"grid"}
        self.planned = "analytic" if len(parts) == 2 else "no"

    def parts_of(self):
        return self.members

    def roles(self, npu, cfg, chips, grid, picks):
        if len(self.members) == 3:
            # Data replicas of head+pipeline grids: replica c // (B C) runs its share of the
            # batch on B stages of C head shards (chip (r, s, h) = (r B + s) C + h).
            a, b, c3 = grid
            out = []
            for c in picks:
                r, k = divmod(c, b * c3)
                sub = dataclasses.replace(cfg, batch=max(1, part(cfg.batch, a, r)))
                role = stage_roles(sub, b, c3, [k])[0]
                out.append(dataclasses.replace(role, chip=c))
            return out
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
        out = {}
        for p in self.members:
            out.update(p.part_sections(prog, comms, res, spans))
        return out

    def search_limit(self, cfg, npu) -> int:
        return math.prod(p.search_limit(cfg, npu) for p in self.members)
