"""Compiled programs: what each chip runs and where a run's inputs and outputs live.

Every strategy's compiler returns a :class:`SystemProgram`: one :class:`ChipProgram` per chip
(instruction words, the allocator with its initial memory image) and, per sample of the batch,
where its int16 input goes (:class:`Placement`, on one or several chips) and where its int16
output is read back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hw.spec import ConfigError, ModelConfig, NpuConfig
from hw.spec.memory import pack_rows, unpack_rows

from .alloc import Allocator
from .assembler import Assembler

__all__ = ["Placement", "ChipProgram", "SystemProgram", "finish", "split_ranges"]


def split_ranges(total: int, parts: int) -> list[range]:
    """``numpy.array_split(range(total), parts)`` as ranges (the first ``total % parts`` one
    longer), without building the array: the compilers' one rule for splitting heads, FFN
    columns, layers, samples and tokens."""
    q, r = divmod(total, parts)
    edges = [k * q + min(k, r) for k in range(parts + 1)]
    return [range(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]


@dataclass(frozen=True)
class Placement:
    """A sample's [seq, d] int16 activations on chip ``chip``: ``rows`` rows of ``row_words``
    words from ``base`` (the sample's padded ``seq_pad`` rows, ``cols`` columns).

    ``tokens`` = ``(start, stop)``: the placement holds only those tokens of the sample (a
    chunk of the sequence, sequence parallelism); None: every token. ``col``/``width``: the
    placement holds only the sample's columns ``col .. col + width - 1`` (a column slice,
    hidden parallelism); ``width`` None: every column."""

    chip: int
    base: int
    rows: int
    cols: int
    row_words: int
    tokens: tuple[int, int] | None = None
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
        if self.tokens is not None:
            x_int = x_int[self.tokens[0]:self.tokens[1]]
        if self.width is not None:
            x_int = x_int[:, self.col:self.col + self.width]
        x[:x_int.shape[0], :x_int.shape[1]] = x_int
        words = pack_rows(x, 2, size)
        assert len(words) == self.words, (len(words), self.words)
        return words

    def read(self, words, seq: int, d: int) -> np.ndarray:
        """The placement's part of the sample's [seq, d] activations (its tokens for a chunk,
        its ``width`` columns for a column slice)."""
        if self.tokens is not None:
            seq = self.tokens[1] - self.tokens[0]
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
    #: Per sample: where its output is read: a placement; a list of token chunks,
    #: concatenated in order (sequence); or a tuple of column slices, in column order, when the
    #: chips hold a sample's columns between them (hidden).
    outputs: list[Placement | list[Placement] | tuple[Placement, ...]]
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
        for place in self.flat_outputs():
            regions[place.chip].append((place.base, place.words))
        return regions

    def flat_outputs(self) -> list[Placement]:
        """Every output placement, in :attr:`outputs` order (a sample's chunks or column
        slices in turn)."""
        return [p for out in self.outputs
                for p in (out if isinstance(out, (list, tuple)) else [out])]

    def read(self, sample: int, parts, d: int | None = None) -> np.ndarray:
        """Sample ``sample``'s [seq, d] output from ``parts``, the words read back from each of
        its placements in :meth:`flat_outputs` order: chunks stacked by rows, column slices
        side by side."""
        d = self.cfg.d_model if d is None else d
        out = self.outputs[sample]
        places = out if isinstance(out, (list, tuple)) else [out]
        arrays = [p.read(w, self.seq, d) for p, w in zip(places, parts, strict=True)]
        if isinstance(out, tuple):
            return np.concatenate(arrays, axis=1)
        return np.concatenate(arrays, axis=0)


def finish(npu: NpuConfig, chip: ChipProgram, *, check: bool = True):
    """Halt, check the capacity and the program size (unless ``check`` is false: the
    planner's shapes-only compiles, which name every limit themselves), encode the program."""
    chip.asm.halt()
    if check:
        chip.alloc.check_capacity()
    chip.program = chip.asm.words()
    if check and len(chip.program) > npu.imem_words:
        raise ConfigError(f"is too small: chip {chip.chip}'s program has {len(chip.program)} "
                          "instructions", path=npu.path, key="imem_words", value=npu.imem_words)
    return chip
