"""Scratchpad allocation with per-category accounting, and the capacity check.

Categories (the planner's vocabulary, ``docs/formats.md``): ``weights`` (int8 matrices, matmul
parameters, LayerNorm parameters, activation tables), ``kv_cache`` (K and V of the sequence),
``activations`` (residual stream and intermediate tensors).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hw.spec import ConfigError, NpuConfig
from hw.spec.memory import row_words

__all__ = ["Tensor", "Allocator", "CATEGORIES"]

CATEGORIES = ("weights", "kv_cache", "activations")


@dataclass(frozen=True)
class Tensor:
    """A matrix in the scratchpad: ``rows`` x ``cols`` elements of ``eb`` bytes, token-major."""

    name: str
    base: int
    rows: int
    cols: int
    eb: int
    row_words: int
    category: str

    @property
    def words(self) -> int:
        return self.rows * self.row_words


@dataclass
class Allocator:
    """Two bump pointers: matmul B operands (``low=True``) grow up from word 0, everything
    else grows down from the top of the scratchpad. Banks hold contiguous address ranges, so
    the weight stream (RD1) and the activation stream (RD0) of a matmul read different banks
    unless the scratchpad is nearly full (then they still work, sharing a bank's read port)."""

    npu: NpuConfig
    low_word: int = 0
    high_word: int = -1
    tensors: dict = field(default_factory=dict)
    images: dict = field(default_factory=dict)     # base -> [words, N] uint8 initial contents
    used: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))

    def __post_init__(self):
        if self.high_word < 0:
            self.high_word = self.npu.sram_words

    @property
    def next_word(self) -> int:
        """Words in use (both regions)."""
        return self.low_word + self.npu.sram_words - self.high_word

    @property
    def n(self) -> int:
        return self.npu.array_size

    def alloc(self, name: str, rows: int, cols: int, eb: int, category: str,
              row_words_: int | None = None, *, low: bool = False) -> Tensor:
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}")
        if name in self.tensors:
            raise ValueError(f"tensor {name!r} allocated twice")
        rw = row_words(cols, eb, self.n) if row_words_ is None else row_words_
        words = rows * rw
        if low:
            base = self.low_word
            self.low_word += words
        else:
            self.high_word -= words
            base = self.high_word
        t = Tensor(name, base, rows, cols, eb, rw, category)
        self.used[category] += t.words * self.n
        self.tensors[name] = t
        return t

    def alloc_words(self, name: str, words: np.ndarray, category: str, *,
                    low: bool = False) -> Tensor:
        """Allocate and initialise a block of raw words (weights, parameters, tables)."""
        words = np.asarray(words, np.uint8).reshape(-1, self.n)
        t = self.alloc(name, len(words), self.n, 1, category, row_words_=1, low=low)
        self.images[t.base] = words
        return t

    def check_capacity(self):
        """Raise :class:`ConfigError` naming every category when the image exceeds the SRAM."""
        need = self.next_word * self.n
        if need > self.npu.sram_bytes or self.low_word > self.high_word:
            parts = ", ".join(f"{c} {self.used[c]:,}" for c in CATEGORIES)
            raise ConfigError(f"is too small: the model needs {need:,} bytes of scratchpad "
                              f"({parts})", path=self.npu.path, key="sram_bytes",
                              value=self.npu.sram_bytes)
