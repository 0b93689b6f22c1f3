"""Scratchpad data formats: how tensors become words (shared by compiler, ISS and tests).

A word is ``word_bytes`` (= the array size N) bytes. A matrix of R rows x C elements of
``elem_bytes`` bytes is stored row by row; each row is packed little-endian (element c at byte
``c * elem_bytes`` of the row) and padded with zeros to a whole number of words.
"""

from __future__ import annotations

import numpy as np

__all__ = ["bank_shift", "bank_of", "row_words", "pack_rows", "unpack_rows", "pack_params",
           "pack_weight_blocks", "weight_words", "packed_block_words", "unpack_packed_block",
           "PARAM_WORDS"]

PARAM_WORDS = 7
_DTYPES = {1: np.int8, 2: np.int16, 4: np.int32}


def bank_shift(bank_words: int) -> int:
    """Bits of a word address below its bank number: banks hold contiguous ranges of
    ``bank_words`` words, a power of two, so word ``addr`` is in bank ``addr >> bank_shift``
    (:func:`bank_of`) at row ``addr % bank_words`` of it. The scratchpad
    (``hw/tile/scratchpad.py``) decodes the bank as the address bits from this one up; the
    cycle models and the allocator call :func:`bank_of`."""
    if not isinstance(bank_words, int) or bank_words < 1 or bank_words & (bank_words - 1):
        raise ValueError(f"bank depth words/banks = {bank_words} must be a power of two")
    return (bank_words - 1).bit_length()


def bank_of(addr, bank_words: int):
    """The bank of word address ``addr`` (an int or a NumPy integer array): ``addr >>
    bank_shift(bank_words)``."""
    return addr >> bank_shift(bank_words)


def row_words(cols: int, elem_bytes: int, word_bytes: int) -> int:
    return -(-cols * elem_bytes // word_bytes)


def pack_rows(x, elem_bytes: int, word_bytes: int) -> np.ndarray:
    """[R, C] integers -> [R * row_words, word_bytes] uint8 words (values must fit)."""
    x = np.asarray(x, dtype=np.int64)
    if x.ndim != 2:
        raise ValueError(f"expected a matrix, got shape {x.shape}")
    lo, hi = -(1 << (8 * elem_bytes - 1)), (1 << (8 * elem_bytes)) - 1
    if x.size and (x.min() < lo or x.max() > hi):
        raise ValueError(f"values outside {elem_bytes}-byte range: {x.min()}..{x.max()}")
    rows, cols = x.shape
    rw = row_words(cols, elem_bytes, word_bytes)
    raw = (x & ((1 << (8 * elem_bytes)) - 1)).astype("<u8")
    as_bytes = raw.view(np.uint8).reshape(rows, cols, 8)[:, :, :elem_bytes]
    out = np.zeros((rows, rw * word_bytes), np.uint8)
    out[:, :cols * elem_bytes] = as_bytes.reshape(rows, cols * elem_bytes)
    return out.reshape(rows * rw, word_bytes)


def unpack_rows(words, rows: int, cols: int, elem_bytes: int, *, signed: bool = True):
    """Inverse of :func:`pack_rows`: words -> [rows, cols] int64."""
    words = np.asarray(words, dtype=np.uint8)
    word_bytes = words.shape[-1]
    rw = row_words(cols, elem_bytes, word_bytes)
    flat = words.reshape(rows, rw * word_bytes)[:, :cols * elem_bytes]
    dtype = np.dtype(_DTYPES[elem_bytes]).newbyteorder("<")
    if not signed:
        dtype = np.dtype(f"<u{elem_bytes}")
    return np.ascontiguousarray(flat).view(dtype).reshape(rows, cols).astype(np.int64)


def pack_params(bias, mult, shift, word_bytes: int) -> np.ndarray:
    """Per-column (bias, mult, shift) -> PARAM_WORDS words per block of ``word_bytes`` columns.

    Block b holds columns ``b*N .. b*N+N-1``: 4 words of int32 bias, 2 of uint16 mult, 1 of
    uint8 shift. Padding columns get bias 0, mult 0, shift 1.
    """
    n = word_bytes
    cols = len(bias)
    blocks = -(-cols // n)
    out = []
    def seg(v, b, fill):
        s = np.full(n, fill, np.int64)
        part = np.asarray(v[b * n:(b + 1) * n], np.int64)
        s[:len(part)] = part
        return s[None, :]

    for b in range(blocks):
        out.append(pack_rows(seg(bias, b, 0), 4, n))
        out.append(pack_rows(seg(mult, b, 0), 2, n))
        out.append(pack_rows(seg(shift, b, 1), 1, n))
    return np.concatenate(out) if out else np.zeros((0, n), np.uint8)


def packed_block_words(rows: int, cols: int, word_bytes: int) -> int:
    """Words of a packed column block of ``cols`` < N columns: its ``rows`` rows of ``cols``
    bytes one after another, the last word padded: ``ceil(rows * cols / N)``."""
    return -(-rows * cols // word_bytes)


def weight_words(k: int, cols: int, word_bytes: int, *, packed: bool = False) -> int:
    """Words :func:`pack_weight_blocks` makes of a [k, cols] matrix: ``ceil(cols / N)`` blocks
    of k words, or with ``packed`` the last block of ``cols mod N`` columns in
    :func:`packed_block_words`."""
    n = word_bytes
    full, last = divmod(cols, n)
    if not packed or not last:
        return -(-cols // n) * k
    return full * k + packed_block_words(k, last, n)


def pack_weight_blocks(b, word_bytes: int, *, packed: bool = False) -> np.ndarray:
    """[K, C] int8 weights -> block-major words: word ``nb*K + k`` is ``b[k, nb*N:(nb+1)*N]``.

    Columns past C are zero-padded to whole blocks of ``word_bytes``; with ``packed`` the last
    block of ``c = C mod N`` columns (if any) is stored unpadded instead, its rows of c bytes
    one after another from word ``(C // N) * K`` (``ceil(K c / N)`` words, the last padded
    with zeros): what the matmul engine unpacks with ``MM_B_LAST`` = c.
    """
    b = np.asarray(b, np.int64)
    k, cols = b.shape
    n = word_bytes
    full, last = divmod(cols, n)
    if packed and last:
        head = pack_weight_blocks(b[:, :full * n], n) if full else np.zeros((0, n), np.uint8)
        tail = np.zeros(packed_block_words(k, last, n) * n, np.int64)
        tail[:k * last] = b[:, full * n:].reshape(-1)
        return np.concatenate([head, pack_rows(tail.reshape(-1, n), 1, n)])
    blocks = -(-cols // n)
    padded = np.zeros((k, blocks * n), np.int64)
    padded[:, :cols] = b
    per_block = padded.reshape(k, blocks, n).transpose(1, 0, 2).reshape(blocks * k, n)
    return pack_rows(per_block, 1, n)


def unpack_packed_block(words, rows: int, cols: int) -> np.ndarray:
    """The [rows, N] int8 beats of a packed block of ``cols`` columns (its words, as
    :func:`pack_weight_blocks` stores them): row r is bytes ``r*cols .. r*cols + cols - 1``,
    the lanes past ``cols`` zero."""
    words = np.asarray(words, np.uint8)
    n = words.shape[-1]
    flat = words.reshape(-1)[:rows * cols].view(np.int8).astype(np.int64)
    out = np.zeros((rows, n), np.int64)
    out[:, :cols] = flat.reshape(rows, cols)
    return out
