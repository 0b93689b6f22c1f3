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
    """Bump pointers per region: matmul B operands (``low=True``) grow up from word 0,
    everything else grows down from the top of the scratchpad, and buffers that another chip
    reads or writes while this one computes (``transfer=True``: the messages of SEND and RECV)
    grow down from the top of the second bank from the top (``spare=True``: from the top of
    the third bank from the top, a second such region, for double buffers whose halves must
    not share a port; the transfer region when there are fewer than 4 banks). Banks hold
    contiguous address
    ranges and serve their ports by fixed priority, with the send and receive units last: so
    the weight stream (RD1), the activation stream (RD0) and a transfer read different banks
    unless the scratchpad is nearly full (then they still work, sharing a bank's port). With
    ``transfer_bank=False`` (or fewer than 3 banks) transfers go to the top region.

    Tables that a unit reads while a matmul runs (:data:`BESIDE_MATMUL`: the activation LUT,
    which LOAD_LUT loads during the FFN1 matmul) go in the transfer region too: in the top
    bank they would share a port with the matmul's A and parameter streams, which outrank the
    vector unit's, and the 64-word load would wait for the matmul (938 cycles instead of 69
    on the tiny preset)."""

    #: Name suffixes of the tables read beside a running matmul (see above).
    BESIDE_MATMUL = (".lut",)

    npu: NpuConfig
    low_word: int = 0
    high_word: int = -1
    transfer_bank: bool = True
    tensors: dict = field(default_factory=dict)
    images: dict = field(default_factory=dict)     # base -> [words, N] uint8 initial contents
    used: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    #: What the capacity refusal should also say (a scheme's extra buffers).
    notes: list = field(default_factory=list)

    def __post_init__(self):
        if self.high_word < 0:
            self.high_word = self.npu.sram_words
        banks = self.npu.sram_banks
        on = banks >= 3 and self.transfer_bank
        self.mid_top = (banks - 1) * self.npu.bank_words if on else None
        self.mid_word = self.mid_top
        self.spare_top = (banks - 2) * self.npu.bank_words if on and banks >= 4 else None
        self.spare_word = self.spare_top

    @property
    def next_word(self) -> int:
        """Words in use (every region)."""
        mid = self.mid_top - self.mid_word if self.mid_top is not None else 0
        spare = self.spare_top - self.spare_word if self.spare_top is not None else 0
        return self.low_word + self.npu.sram_words - self.high_word + mid + spare

    @property
    def n(self) -> int:
        return self.npu.array_size

    def alloc(self, name: str, rows: int, cols: int, eb: int, category: str,
              row_words_: int | None = None, *, low: bool = False,
              transfer: bool = False, spare: bool = False, fallback: bool = False) -> Tensor:
        """``fallback``: a ``spare`` or ``transfer`` tensor for which its region has no room
        left above the weights (``low``) goes to the next region up (spare, transfer, top)
        instead of overlapping them (the tensors of a unit that only runs faster there)."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}")
        if name in self.tensors:
            raise ValueError(f"tensor {name!r} allocated twice")
        rw = row_words(cols, eb, self.n) if row_words_ is None else row_words_
        words = rows * rw
        if low:
            base = self.low_word
            self.low_word += words
        elif spare and self.spare_top is not None and not (
                fallback and (self.spare_word - words < self.low_word or
                              self.mid_word < self.spare_top)):
            self.spare_word -= words
            base = self.spare_word
        elif (transfer or spare) and self.mid_top is not None and not (
                fallback and (self.mid_word - words < max(self.low_word, self._spare_top_used())
                              or self.mid_top > self.high_word)):
            self.mid_word -= words
            base = self.mid_word
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
        t = self.alloc_block(name, len(words), category, low=low)
        self.images[t.base] = words
        return t

    def note(self, text: str):
        """Add ``text`` to the capacity refusal's message (once)."""
        if text not in self.notes:
            self.notes.append(text)

    def alloc_block(self, name: str, count: int, category: str, *,
                    low: bool = False) -> Tensor:
        """Allocate ``count`` raw words where :meth:`alloc_words` would put them, without
        contents: a compile that needs only the program and the layout (the planner's, for
        models whose weights it never holds) allocates exactly what the full one does."""
        beside = not low and name.endswith(self.BESIDE_MATMUL)
        return self.alloc(name, count, self.n, 1, category, row_words_=1, low=low,
                          transfer=beside)

    @property
    def overflows(self) -> bool:
        """The allocation exceeds the scratchpad or its regions overlap
        (:meth:`check_capacity` would refuse it)."""
        return self.next_word > self.npu.sram_words or self._overlap()

    def _spare_top_used(self) -> int:
        """The top of the spare region when it holds something (the transfer region must stay
        above it), else 0."""
        used = self.spare_top is not None and self.spare_word < self.spare_top
        return self.spare_top if used else 0

    def _overlap(self) -> bool:
        mid_used = self.mid_top is not None and self.mid_word < self.mid_top
        spare_used = self.spare_top is not None and self.spare_word < self.spare_top
        return self.low_word > self.high_word or (
            mid_used and (self.low_word > self.mid_word or self.mid_top > self.high_word)) or (
            spare_used and (self.low_word > self.spare_word or self.spare_top > self.mid_word
                            or self.spare_top > self.high_word))

    def check_capacity(self):
        """Raise :class:`ConfigError` naming every category when the image exceeds the SRAM."""
        need = self.next_word * self.n
        overlap = self._overlap()
        if need > self.npu.sram_bytes or overlap:
            parts = ", ".join(f"{c} {self.used[c]:,}" for c in CATEGORIES)
            where = "" if need > self.npu.sram_bytes else \
                " (its regions overlap: the transfer bank is full)"
            notes = "".join(f"; {n}" for n in self.notes)
            raise ConfigError(f"is too small: the model needs {need:,} bytes of scratchpad "
                              f"({parts}){where}{notes}", path=self.npu.path,
                              key="sram_bytes", value=self.npu.sram_bytes)
