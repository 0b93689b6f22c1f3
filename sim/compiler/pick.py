"""The pick of generated tokens across the chips a vocabulary is split over.

Each chip holds a block of the LM head's columns (whole array blocks, :func:`vocab_block`)
and computes its block of every logits row. A pick is: each chip's ARGMAX of its block
(:func:`block_argmax`: ``VU_N`` its first column, so its record holds a global index), an
all-gather of the records (8 bytes a row; a chip's padded to whole engine words,
:func:`records_block`) that the caller emits over its group, and on every chip an ARGMAX in
pair mode (:func:`combine_argmax`) that combines each row's records: the largest logit, the
lowest index on ties, the ARGMAX of the whole row bit for bit (``docs/isa.md``, ARGMAX).
"""

from __future__ import annotations

from hw.spec import NpuConfig
from hw.spec.isa import Unit
from hw.spec.vector import argmax_words

from . import vector_launch as vl
from .assembler import Assembler
from .blocks import pad_to

__all__ = ["vocab_block", "records_block", "block_argmax", "combine_argmax"]


def vocab_block(vocab: int, vc: int, part: int) -> tuple[int, int]:
    """Columns ``(v0, v1)`` of a vocabulary of ``vocab`` in chip ``part``'s block of ``vc``
    (``v1 == v0``: a block of padding only)."""
    v0 = part * vc
    return v0, max(v0, min(v0 + vc, vocab))


def records_block(npu: NpuConfig, rows: int) -> int:
    """Words of one chip's argmax records of ``rows`` rows in a gathered buffer: whole
    engine words (the all-gather's blocks)."""
    return pad_to(rows * argmax_words(npu.array_size), npu.ring_word_bytes // npu.array_size)


def block_argmax(npu: NpuConfig, asm: Assembler, *, vocab: int, v0: int, vc: int, part: int,
                 x: vl.Rows, picks: int) -> None:
    """The first half of a pick over a vocabulary of ``vocab`` split in blocks of ``vc``
    columns: chip ``part``'s ARGMAX of its int16 logits block ``x`` (from column ``v0``:
    global indices, lowest on ties) into its records at ``picks + part * block``
    (:func:`records_block`). A block of padding only writes none. Then every chip's records
    are all-gathered into the buffer at ``picks`` and :func:`combine_argmax` picks."""
    valid = min(vc, vocab - v0)
    if valid > 0:
        vl.emit(asm, vl.argmax_launch(size=npu.array_size, length=valid, x=x,
                                      record_base=picks + part * records_block(npu, x.rows),
                                      offset=v0))
        asm.wait(Unit.VEC)


def combine_argmax(npu: NpuConfig, asm: Assembler, *, vocab: int, vc: int, chips: int,
                   rows: int, picks: int, record_base: int) -> None:
    """The second half of a pick (:func:`block_argmax`): an ARGMAX in pair mode combines each
    of ``rows`` rows' gathered records (those of the chips whose blocks hold columns) into
    ``record_base``: the largest logit, the lowest index on ties, as one ARGMAX of the whole
    row would."""
    vl.emit(asm, vl.argmax_pairs_launch(
        size=npu.array_size, count=min(chips, -(-vocab // vc)), records_base=picks,
        record_base=record_base, rows=rows, stride=records_block(npu, rows),
        row_stride=argmax_words(npu.array_size)))
    asm.wait(Unit.VEC)
