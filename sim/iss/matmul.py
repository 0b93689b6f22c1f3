"""``MATMUL`` in the instruction-set simulator: one launch of the matmul unit at word level.

The transposer, the array (int8 x int8 or unsigned-8 x int8, int32 wrapping accumulation) and
the per-column requantiser of ``hw/tile/matmul_engine.py``, computed with the golden model's
integer functions; ``docs/isa.md`` (MATMUL) gives the registers and streams.
"""

from __future__ import annotations

import numpy as np

from hw.spec.formats import OutMode
from hw.spec.memory import (
    PARAM_WORDS,
    pack_rows,
    packed_block_words,
    unpack_packed_block,
    unpack_rows,
)

from ..golden.matmul import bias_add, requant, wrap
from .errors import IssError

__all__ = ["exec_matmul"]


def exec_matmul(iss):
    """Execute one ``MATMUL`` launch on ``iss`` (a :class:`sim.iss.Iss`)."""
    n = iss.n
    k, folds = iss._reg("MM_K"), iss._reg("MM_FOLDS")
    mode = OutMode(iss._reg("MM_MODE"))
    a_unsigned = bool(iss._reg("MM_A_UNSIGNED"))
    if k <= 0 or k % n or folds <= 0:
        raise IssError(f"MATMUL with MM_K={k} (a positive multiple of {n}) and "
                       f"MM_FOLDS={folds}")
    kb, blocks, last = (iss._reg(f"MM_B_{x}") for x in ("ROWS", "BLOCKS", "LAST"))
    if not 0 <= kb <= k:
        raise IssError(f"MATMUL with MM_B_ROWS={kb}: 0 (all MM_K={k}) or 1..{k}")
    if not 0 <= last <= n or blocks < 0:
        raise IssError(f"MATMUL with MM_B_LAST={last} (0..{n}) and MM_B_BLOCKS={blocks} "
                       f"(>= 0)")
    kb = kb or k
    # B words per fold: kb rows, or the packed last column block's ceil(kb c / N) words.
    narrow = [bool(last) and (f % max(blocks, 1)) + 1 >= blocks for f in range(folds)]
    per_fold = [packed_block_words(kb, last, n) if nw else kb for nw in narrow]
    a_words = iss._gather("RD0")
    b_words = iss._gather("RD1")
    p_words = iss._gather("RD2")
    if len(a_words) != folds * k or len(b_words) != sum(per_fold):
        raise IssError(f"MATMUL reads {len(a_words)} A and {len(b_words)} B words for "
                       f"{folds} folds of {k} beats ({sum(per_fold)} B words)")
    if len(p_words) != folds * PARAM_WORDS:
        raise IssError(f"MATMUL reads {len(p_words)} parameter words for {folds} folds")
    # Transposer: each block of n words (rows) becomes n column beats.
    a = a_words.reshape(folds, k // n, n, n).transpose(0, 1, 3, 2).reshape(folds, k, n)
    a = a.astype(np.int64) if a_unsigned else a.view(np.int8).astype(np.int64)
    b = np.zeros((folds, k, n), np.int64)
    if not last:
        b[:, :kb] = b_words.view(np.int8).astype(np.int64).reshape(folds, kb, n)
    at = 0
    for f, (count, nw) in enumerate(zip(per_fold, narrow, strict=True)):
        if not last:
            break
        words = b_words[at:at + count]
        at += count
        b[f, :kb] = unpack_packed_block(words, kb, last) if nw else \
            words.view(np.int8).astype(np.int64)
    acc = np.einsum("fkr,fkc->frc", a, b)          # [fold, row, col]; exact in int64
    p = p_words.reshape(folds, PARAM_WORDS, n)
    bias = unpack_rows(p[:, 0:4].reshape(-1, n), folds, n, 4)[:, None, :]
    mult = unpack_rows(p[:, 4:6].reshape(-1, n), folds, n, 2, signed=False)[:, None, :]
    shift = p[:, 6, :].astype(np.int64)[:, None, :]
    y = bias_add(wrap(acc), bias)                    # wraps modulo 2**32, like the array
    if mode is OutMode.RAW:
        out, eb = y, 4
    else:
        eb = 1 if mode is OutMode.INT8 else 2
        if shift.min() < 1 or shift.max() > 47:
            raise IssError(f"MATMUL parameter shift {shift.min()}..{shift.max()} outside "
                           "1..47 (requantisation is unspecified there)")
        out = requant(y, mult, shift, 8 * eb)
    words = pack_rows(out.reshape(folds * n, n), eb, n)
    iss._scatter("WR0", words)
