"""Compiled programs: what each chip runs and where a run's inputs and outputs live.

Every strategy's compiler returns a :class:`SystemProgram`: one :class:`ChipProgram` per chip
(instruction words, the allocator with its initial memory image) and, per sample of the batch,
where its int16 input goes (:class:`Placement`, on one or several chips) and where its int16
output is read back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hw.spec import ModelConfig, NpuConfig
from hw.spec.memory import pack_rows, unpack_rows

from .alloc import Allocator
from .assembler import Assembler

__all__ = ["Placement", "ChipProgram", "SystemProgram"]


@dataclass(frozen=True)
class Placement:
    """A sample's [seq, d] int16 activations on chip ``chip``: ``rows`` rows of ``row_words``
    words from ``base`` (the sample's padded ``seq_pad`` rows, ``cols`` columns). A chip that
    holds only some columns (hidden parallelism) has the sample's columns ``col .. col +
    width - 1`` there."""

    chip: int
    base: int
    rows: int
    cols: int
    row_words: int
    col: int = 0
    width: int | None = None

    @property
    def words(self) -> int:
        return self.rows * self.row_words

    def image(self, x_int, size: int) -> np.ndarray:
        """The words of ``x_int`` [seq, d] (its columns here, zero-padded to ``rows`` x
        ``cols``)."""
        x = np.zeros((self.rows, self.cols), np.int64)
        x_int = np.asarray(x_int, np.int64)
        if self.width is not None:
            x_int = x_int[:, self.col:self.col + self.width]
        x[:x_int.shape[0], :x_int.shape[1]] = x_int
        words = pack_rows(x, 2, size)
        assert len(words) == self.words, (len(words), self.words)
        return words

    def read(self, words, seq: int, d: int) -> np.ndarray:
        """The sample's [seq, d] activations (its ``width`` columns for a column slice)."""
        cols = d if self.width is None else self.width
        return unpack_rows(words, self.rows, self.cols, 2)[:seq, :cols]


@dataclass
class ChipProgram:
    """One chip's program and scratchpad image."""

    chip: int
    asm: Assembler
    alloc: Allocator
    program: list[int] = field(default_factory=list)
    #: What the chip runs, for reports: e.g. ``{"layers": [0, 1], "heads": [0, 1]}``.
    role: dict = field(default_factory=dict)
    #: How the program's launches group, for reports (pipeline: the compute launches of each
    #: microbatch, ``{"microbatch_launches": [{"matmul": k, ...}, ...]}``).
    spans: dict = field(default_factory=dict)

    @property
    def images(self) -> dict:
        return self.alloc.images


@dataclass
class SystemProgram:
    """Programs for every chip and the placement of each sample."""

    npu: NpuConfig
    cfg: ModelConfig
    strategy: str
    chips: list[ChipProgram]
    seq: int
    seq_pad: int
    inputs: list[list[Placement]]      # per sample: every copy (or column slice) of its input
    #: Per sample: where its output is read; a tuple of column slices, in column order, when
    #: the chips hold a sample's columns between them.
    outputs: list
    #: Strategy facts for the report (``{"stages": ..., "microbatches": ...}``).
    meta: dict = field(default_factory=dict)
    #: The collectives and transfers of the program, in program order, for the report.
    comms: list[dict] = field(default_factory=list)

    def images(self, samples_int) -> list[dict[int, np.ndarray]]:
        """Every chip's initial memory: the weights and the inputs ``samples_int`` ([seq, d]
        int16 each)."""
        out = [dict(c.images) for c in self.chips]
        size = self.npu.array_size
        for x_int, places in zip(samples_int, self.inputs, strict=True):
            for place in places:
                out[place.chip][place.base] = place.image(x_int, size)
        return out

    def reads(self) -> list[list[tuple[int, int]]]:
        """Per chip: the ``(base, words)`` regions to read back, in :attr:`outputs` order."""
        regions = [[] for _ in self.chips]
        for out in self.outputs:
            for place in out if isinstance(out, tuple) else (out,):
                regions[place.chip].append((place.base, place.words))
        return regions
