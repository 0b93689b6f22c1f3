"""``ATTN`` in the instruction-set simulator: one attention head per launch, at word level.

Reproduces ``hw.tile.attention_engine.AttentionEngine`` exactly: the same command order (K/V
writes and queries, see :func:`schedule`) through the golden ring (``sim.golden.attention.KVRing``
and ``score_row``, as ``run_sequence`` uses them) with the golden softmax, the engine's narrower
window (:func:`window_mask`), then the output requantiser (``sim.golden.matmul.requant`` to
int8). See ``docs/isa.md`` (ATTN) for the registers.
"""

from __future__ import annotations

import numpy as np

from hw.spec.attention import (
    FLAG_BIDIR,
    FLAG_INTERLEAVED,
    HALO_BITS,
    HALO_SHIFT,
    KNOWN_FLAGS,
    POS_BITS,
    flags_halo,
    schedule,
)
from hw.spec.formats import MULT_BITS, SHIFT_MAX, SHIFT_MIN
from hw.spec.memory import pack_rows

from ..golden.attention import KVRing, score_row
from ..golden.matmul import requant
from ..golden.softmax import softmax
from .errors import IssError

__all__ = ["exec_attention", "window_mask"]


def window_mask(slot_pos, qpos: int, window: int, *, bidirectional: bool) -> np.ndarray:
    """The engine's narrowing of the ring's mask: ``qpos - pos < window`` (causal; the ring
    already ensures ``pos <= qpos``) or ``|qpos - pos| < window``; all true for window 0."""
    diff = qpos - np.asarray(slot_pos, np.int64)
    if window == 0:
        return np.ones(diff.shape, bool)
    return (diff < window) & (diff > -window if bidirectional else True)


def _rows(words: np.ndarray, rows: int, h: int, n: int) -> np.ndarray:
    return words.reshape(rows, h // n * n).view(np.int8).astype(np.int64)[:, :h]


def exec_attention(iss):
    """Execute one ``ATTN`` launch on ``iss`` (a :class:`sim.iss.Iss`)."""
    n, npu = iss.n, iss.npu
    ring, length, dmax = npu.attn_window, npu.softmax_len, npu.d_head_max
    r = {name: iss._reg(f"AT_{name}") for name in (
        "QUERIES", "KEYS", "Q_POS", "K_POS", "WINDOW", "FLAGS", "SCORE_MULT", "SCORE_SHIFT",
        "OUT_MULT", "OUT_SHIFT", "D_HEAD")}
    queries, keys, h, flags = r["QUERIES"], r["KEYS"], r["D_HEAD"], r["FLAGS"]
    if not 1 <= queries < 1 << 16 or not 1 <= keys < 1 << 16:
        raise IssError(f"ATTN with AT_QUERIES={queries} and AT_KEYS={keys} (each 1..65535; "
                       "the first key restarts the ring)")
    if h < n or h % n or h > dmax:
        raise IssError(f"ATTN with AT_D_HEAD={h}: must be a positive multiple of the word size "
                       f"{n} and at most d_head_max={dmax}")
    if flags < 0 or flags & ~KNOWN_FLAGS:
        raise IssError(f"ATTN with AT_FLAGS={flags:#x}: only bits 0 (bidirectional), 1 "
                       f"(interleaved) and {HALO_SHIFT}..{HALO_SHIFT + HALO_BITS - 1} (halo) "
                       "are defined")
    interleaved = bool(flags & FLAG_INTERLEAVED)
    halo = flags_halo(flags)
    if interleaved and halo > keys:
        raise IssError(f"ATTN halo {halo} (AT_FLAGS) exceeds AT_KEYS={keys}")
    if interleaved and keys > halo + queries:
        raise IssError(f"ATTN interleaved with AT_KEYS={keys} > halo {halo} + AT_QUERIES="
                       f"{queries}: the keys after the last query would never be written")
    if not interleaved and halo:
        raise IssError(f"ATTN halo {halo} (AT_FLAGS) needs the interleaved schedule (bit 1)")
    if not 0 <= r["WINDOW"] < 1 << POS_BITS:
        raise IssError(f"ATTN with AT_WINDOW={r['WINDOW']} (0 = the ring's {ring}, else "
                       f"1..{(1 << POS_BITS) - 1})")
    for name, count in (("Q_POS", queries), ("K_POS", keys)):
        if r[name] < 0 or r[name] + count > 1 << POS_BITS:
            raise IssError(f"ATTN positions AT_{name}={r[name]} .. +{count - 1} do not fit "
                           f"{POS_BITS} bits")
    for name in ("SCORE", "OUT"):
        mult, shift = r[f"{name}_MULT"], r[f"{name}_SHIFT"]
        if not 0 <= mult < 1 << MULT_BITS or not SHIFT_MIN <= shift <= SHIFT_MAX:
            raise IssError(f"ATTN with AT_{name}_MULT={mult} (unsigned {MULT_BITS}-bit) and "
                           f"AT_{name}_SHIFT={shift} ({SHIFT_MIN}..{SHIFT_MAX})")

    words = h // n
    k_words, v_words, q_words = iss._gather("RD3"), iss._gather("RD4"), iss._gather("RD5")
    for gen, got, rows in (("RD3", k_words, keys), ("RD4", v_words, keys),
                           ("RD5", q_words, queries)):
        if len(got) != rows * words:
            raise IssError(f"ATTN {gen} walks {len(got)} words, the launch needs {rows} rows "
                           f"of {words} words")
    k, v, q = (_rows(x, len(x) // words, h, n) for x in (k_words, v_words, q_words))
    bidir = bool(flags & FLAG_BIDIR)
    kv_ring = KVRing(window=ring, d_head=h, length=length)
    acc = []
    for kind, i in schedule(keys, queries, interleaved=interleaved, halo=halo):
        if kind == "k":
            kv_ring.write(k[i], v[i], r["K_POS"] + i, first=i == 0)
            continue
        qpos = r["Q_POS"] + i
        mask = kv_ring.mask(qpos, bidirectional=bidir) & window_mask(
            kv_ring.pos, qpos, r["WINDOW"], bidirectional=bidir)
        scores = score_row(kv_ring.raw_scores(q[i]), mask, r["SCORE_MULT"], r["SCORE_SHIFT"])
        # The buffer's P.V sees zero probabilities on the lanes the engine masked.
        acc.append(kv_ring.pv(softmax(scores, mask), mask))
    acc = np.array(acc, np.int64)
    out = requant(acc, r["OUT_MULT"], r["OUT_SHIFT"], 8)
    iss._scatter("WR1", pack_rows(out, 1, n))
