"""COLL launches: descriptors, registers and memory layout of one chip's part of a collective.

Plain Python. Memory format (docs/isa.md, COLL): the input buffer holds the chip's local blocks
in the engine's stream order (:func:`hw.spec.collective.local_blocks`), each block padded to
whole engine words of ``D = max(2 * link_bytes_per_cycle, 8)`` bytes, contiguous from
``in_base``; the output buffer likewise holds the output blocks
(:func:`~hw.spec.collective.output_blocks`) from ``out_base``. An engine word is ``D / N``
consecutive scratchpad words, the first one holding the low bytes. RD6 walks the input buffer
and WR3 the output buffer, word by word; a chip whose schedule has no local input (no output)
starts no RD6 (WR3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw.spec.collective import (
    CollectiveRequest,
    Kind,
    check_fits,
    chunk_of,
    elements_per_word,
    engine_to_words,
    local_blocks,
    output_blocks,
    pack_blocks,
    registers,
    unpack_blocks,
    word_bytes,
    words_to_engine,
)
from hw.spec.isa import COLL_FIFO_WORDS, COLL_GENS, MAX_COUNT, Op

from .descriptors import Desc

__all__ = ["CollLaunch", "coll_registers", "coll_launch", "coll_launch_natural",
           "natural_block_words", "emit", "emit_descs"]

#: Largest count of one address-generator level.

@dataclass(frozen=True)
class CollLaunch:
    """One chip's COLL: ``rd6``/``wr3`` are None when the chip's schedule does not use them."""

    req: CollectiveRequest
    chip: int
    size: int            #: scratchpad word bytes N
    wbytes: int          #: engine word bytes D
    rd6: Desc | None
    wr3: Desc | None
    in_words: int        #: scratchpad words of the input buffer
    out_words: int       #: scratchpad words of the output buffer
    regs: dict
    engine: int = 0      #: the collective engine (the COLL's operand; a torus's chip has 2)

    def pack_input(self, vector) -> np.ndarray:
        """[in_words, N] uint8 input buffer for this chip's local ``vector`` (for all-gather its
        own block; for send/recv the message; otherwise the whole per-chip vector)."""
        blocks = local_blocks(self.req, self.chip)
        return engine_to_words(pack_blocks(vector, self.req, blocks, self.wbytes),
                               self.wbytes, self.size)

    def unpack_output(self, words) -> np.ndarray:
        """This chip's result from its output buffer: the output blocks in block order
        (all-reduce, all-gather: the whole vector; reduce-scatter: its block; send/recv: the
        message)."""
        blocks = output_blocks(self.req, self.chip)
        got = unpack_blocks(words_to_engine(words, self.wbytes), self.req, blocks, self.wbytes)
        dtype = np.int32 if self.req.width == 32 else np.int64
        if not got:
            return np.zeros(0, dtype)
        return np.concatenate([got[b] for b in sorted(got)]).astype(dtype)


def coll_registers(req: CollectiveRequest, chip: int) -> dict:
    """The ``CO_*`` registers of chip ``chip``'s COLL for ``req`` (docs/isa.md, COLL:
    :func:`hw.spec.collective.registers`)."""
    return registers(req, chip)


def _blocks_words(req, blocks, wbytes):
    if req.kind == Kind.BARRIER:
        return 0
    epw = elements_per_word(wbytes, req.width)
    sizes = req.blocks()
    return sum(-(-sizes[b] // epw) for b in blocks)


def _desc(base, words, name):
    if not 0 < words <= MAX_COUNT:
        raise ValueError(f"{name} buffer of {words} scratchpad words must be 1..{MAX_COUNT}")
    return Desc(base, (words, 1, 1, 1), (1, 0, 0, 0))


def coll_launch(req: CollectiveRequest, chip: int, *, in_base: int, out_base: int, size: int,
                link_bytes: int, fifo_words: int = COLL_FIFO_WORDS,
                engine: int = 0) -> CollLaunch:
    """Chip ``chip``'s COLL for ``req``; buffers at ``in_base``/``out_base`` (scratchpad words).

    ``size`` is the scratchpad word (``array_size``), ``link_bytes`` the link width. Raises
    ValueError when a block exceeds the engine's buffers or the chip's input or output would be
    empty (a block of 0 elements: use ``length >= count``).
    """
    if not isinstance(req, CollectiveRequest):
        raise TypeError(f"req must be a CollectiveRequest, not {req!r}")
    if not isinstance(chip, int) or not 0 <= chip < req.chips:
        raise ValueError(f"chip must be 0..{req.chips - 1}, not {chip!r}")
    wbytes = word_bytes(link_bytes, size)
    if wbytes % size:
        raise ValueError(f"engine word of {wbytes} bytes is not a multiple of size={size}")
    check_fits(req, wbytes, fifo_words)
    ratio = wbytes // size
    local, out = local_blocks(req, chip), output_blocks(req, chip)
    in_words = ratio * _blocks_words(req, local, wbytes)
    out_words = ratio * _blocks_words(req, out, wbytes)
    rd6 = _desc(in_base, in_words, "input") if local else None
    wr3 = _desc(out_base, out_words, "output") if out else None
    regs = coll_registers(req, chip)
    return CollLaunch(req, chip, size, wbytes, rd6, wr3, in_words, out_words, regs,
                      _engine(engine))


def natural_block_words(req: CollectiveRequest, size: int, link_bytes: int) -> int:
    """Scratchpad words of each block of ``req`` in a buffer that holds the whole vector in
    natural order, with no gap between blocks (:func:`coll_launch_natural`). ValueError
    unless every block has the same number of elements and fills whole engine words: choose
    ``length`` a multiple of ``count`` times the elements per engine word (or pad it)."""
    wbytes = word_bytes(link_bytes, size)
    epw = elements_per_word(wbytes, req.width)
    if req.length % (req.count * epw):
        raise ValueError(f"a natural-order {req.kind.name} needs length={req.length} to be a "
                         f"multiple of count x elements per engine word = {req.count} x {epw} "
                         f"= {req.count * epw} (equal blocks of whole engine words)")
    return req.length // req.count // epw * (wbytes // size)


def _rotation(blocks, n):
    """``blocks`` is ``j0, j0 - 1, ...`` modulo n (every collective's streams are)."""
    if any((blocks[0] - k) % n != b for k, b in enumerate(blocks)):
        raise AssertionError(f"blocks {blocks} are not a descending rotation")
    return blocks[0]


def coll_launch_natural(req: CollectiveRequest, chip: int, *, base: int, size: int,
                        link_bytes: int, out_base: int | None = None,
                        block_stride: int | None = None,
                        fifo_words: int = COLL_FIFO_WORDS, engine: int = 0) -> CollLaunch:
    """Chip ``chip``'s COLL for ``req`` on buffers that hold the whole vector in natural order.

    The vector (all-reduce, reduce-scatter: the chip's input; all-gather: the result, with the
    chip's own block at its place) is ``count`` blocks of :func:`natural_block_words` words each
    from ``base``, padding words between blocks when a block is not whole engine words. A
    chip's streams visit its blocks in a rotated order (``hw.spec.collective.steps``): RD6 and
    WR3 walk them as a circular buffer (``wrap``), so the data needs no reordering. The output
    goes to ``out_base`` (default ``base``: in place, which every kind allows: a block is
    written only after it was read). Reduce-scatter writes only the chip's block, at its place.

    ``block_stride``: words from one block's start to the next (default: the block's words
    times ``req.chunks``, no gap), so that the blocks of a collective can be every
    ``block_stride`` words of a larger tensor (one chunk of rows of each chip's part). A
    request of several ``chunks`` (``length`` elements each) walks chunk ``c`` at ``c`` times
    a chunk's block words into each block: block ``j`` is the ``chunks`` chunks' parts side
    by side, so the buffer holds the whole vector in natural order.
    """
    if not isinstance(req, CollectiveRequest):
        raise TypeError(f"req must be a CollectiveRequest, not {req!r}")
    if not isinstance(chip, int) or not 0 <= chip < req.chips:
        raise ValueError(f"chip must be 0..{req.chips - 1}, not {chip!r}")
    if req.kind not in (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER):
        raise ValueError(f"{req.kind.name} has no natural-order buffer")
    wbytes = word_bytes(link_bytes, size)
    if wbytes % size:
        raise ValueError(f"engine word of {wbytes} bytes is not a multiple of size={size}")
    check_fits(req, wbytes, fifo_words)
    out_base = base if out_base is None else out_base
    w = natural_block_words(req, size, link_bytes)
    k = req.chunks
    stride = w * k if block_stride is None else block_stride
    if stride < w * k:
        raise ValueError(f"block_stride={stride} is less than a block's {w * k} words")
    n = req.count
    total = n * stride
    if w > MAX_COUNT or n > MAX_COUNT:
        raise ValueError(f"{n} blocks of {w} words exceed a generator's 16-bit counts")
    p = req.position(chip)
    one = chunk_of(req)

    def walk(start, blocks):
        if p is None or not blocks:
            return None
        j0 = _rotation(blocks, n)
        # (A lone chunk's level 2 walks nothing: its stride 0, as the program always set it.)
        return Desc(start, (w, len(blocks), k, 1), (1, -stride, w if k > 1 else 0, 0),
                    wrap=total, off=j0 * stride)

    rd6 = walk(base, local_blocks(one, chip))
    wr3 = walk(out_base, output_blocks(one, chip))
    regs = coll_registers(req, chip)
    return CollLaunch(req, chip, size, wbytes, rd6, wr3, total, total, regs, _engine(engine))


def _engine(engine) -> int:
    if engine not in range(len(COLL_GENS)) or isinstance(engine, bool):
        raise ValueError(f"engine must be 0..{len(COLL_GENS) - 1}, not {engine!r}")
    return engine


def emit_descs(asm, launch: CollLaunch):
    """The SETs of the launch's descriptors, to the generators of its engine
    (``hw.spec.isa.COLL_GENS``: RD6 and WR3 for engine 0, RD8 and WR5 for engine 1)."""
    rd, wr = COLL_GENS[launch.engine]
    if launch.rd6 is not None:
        asm.set_desc(rd, launch.rd6)
    if launch.wr3 is not None:
        asm.set_desc(wr, launch.wr3)


def emit(asm, launch: CollLaunch, *, descs: bool = True):
    """Append the launch's SETs and ``COLL`` to a :class:`sim.compiler.assembler.Assembler`
    (``descs=False``: its descriptors were set before, :func:`emit_descs`)."""
    if descs:
        emit_descs(asm, launch)
    for name, value in launch.regs.items():
        asm.set(name, value)
    asm.launch(Op.COLL, launch.engine)
