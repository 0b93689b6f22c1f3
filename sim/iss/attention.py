"""``ATTN`` in the instruction-set simulator: one attention head per launch, at word level.

Reproduces ``hw.tile.attention_engine.AttentionEngine`` exactly: the same command order (K/V
writes and queries, see :func:`schedule`) through the golden ring (``sim.golden.attention.KVRing``
and ``score_row``, as ``run_sequence`` uses them) with the golden softmax, the engine's narrower
window (:func:`window_mask`), then the output requantiser (``sim.golden.matmul.requant`` to
int8). See ``docs/isa.md`` (ATTN) for the registers.

A head's lanes need not fill whole words: ``AT_Q_LANE``, ``AT_K_LANE``, ``AT_V_LANE`` and
``AT_O_LANE`` name the lane of each stream's first word where the head's ``AT_D_HEAD`` lanes
begin (``hw.spec.attention.head_words`` words per row); the output row writes only its lanes
(byte write enables), so heads packed in shared words each write their own.

Split-score mode (hidden-dimension parallelism, ``AT_FLAGS`` bits 2 and 3), in two launches
over the same keys, queries and schedule:

- **partial** (pass 1): K (RD3) and Q (RD5) only; per query, in issue order, the raw int32 row
  ``wrap32(q . k_j)`` of the W ring lanes (0 on lanes not written since the launch's first key),
  ``partial_row_words(W, N)`` words (``hw.spec.attention``), is written through WR1;
- **reduced** (pass 2): V (RD4) and one reduced row per query (RD5, the same format: the
  partial rows of the head's chips summed, wrapping); the row replaces ``q . k`` in
  ``score_row``, then softmax, P.V and the int8 output as usual (WR1).
"""

from __future__ import annotations

import numpy as np

from hw.spec.attention import (
    FLAG_BIDIR,
    FLAG_INTERLEAVED,
    HALO_BITS,
    HALO_SHIFT,
    KNOWN_FLAGS,
    PARTIAL_BYTES,
    POS_BITS,
    flags_halo,
    head_lanes,
    head_words,
    partial_row_words,
    schedule,
    split_mode,
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


def _rows(words: np.ndarray, rows: int, h: int, lane: int, n: int) -> np.ndarray:
    """The head's ``h`` lanes from lane ``lane`` of each row's words."""
    width = head_words(h, lane, n) * n
    return words.reshape(rows, width).view(np.int8).astype(np.int64)[:, lane:lane + h]


def exec_attention(iss):
    """Execute one ``ATTN`` launch on ``iss`` (a :class:`sim.iss.Iss`)."""
    n, npu = iss.n, iss.npu
    ring, length, dmax = npu.attn_window, npu.softmax_len, npu.d_head_max
    r = {name: iss._reg(f"AT_{name}") for name in (
        "QUERIES", "KEYS", "Q_POS", "K_POS", "WINDOW", "FLAGS", "SCORE_MULT", "SCORE_SHIFT",
        "OUT_MULT", "OUT_SHIFT", "D_HEAD", "Q_LANE", "K_LANE", "V_LANE", "O_LANE")}
    queries, keys, h, flags = r["QUERIES"], r["KEYS"], r["D_HEAD"], r["FLAGS"]
    lanes = {s: r[f"{s.upper()}_LANE"] for s in "qkvo"}
    if not 1 <= queries < 1 << 16 or not 1 <= keys < 1 << 16:
        raise IssError(f"ATTN with AT_QUERIES={queries} and AT_KEYS={keys} (each 1..65535; "
                       "the first key restarts the ring)")
    if not 1 <= h <= dmax:
        raise IssError(f"ATTN with AT_D_HEAD={h}: must be 1..d_head_max={dmax}")
    for s, lane in lanes.items():
        if not 0 <= lane < n:
            raise IssError(f"ATTN with AT_{s.upper()}_LANE={lane}: must be 0..{n - 1} (a lane "
                           f"of the row's first word)")
    if flags < 0 or flags & ~KNOWN_FLAGS:
        raise IssError(f"ATTN with AT_FLAGS={flags:#x}: only bits 0 (bidirectional), 1 "
                       f"(interleaved), 2 (partial), 3 (reduced) and "
                       f"{HALO_SHIFT}..{HALO_SHIFT + HALO_BITS - 1} (halo) are defined")
    try:
        split = split_mode(flags)
    except ValueError as exc:
        raise IssError(f"ATTN with AT_FLAGS={flags:#x}: {exc}") from None
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

    words = {s: head_words(h, lane, n) for s, lane in lanes.items()}
    prw = partial_row_words(ring, n)
    # Which streams the launch reads (docs/isa.md, ATTN): the partial pass no V, the reduced
    # pass no K, and its RD5 carries reduced score rows instead of Q.
    reads = {"RD3": (keys, words["k"]) if split != "reduced" else None,
             "RD4": (keys, words["v"]) if split != "partial" else None,
             "RD5": (queries, prw if split == "reduced" else words["q"])}
    got = {}
    for gen, shape in reads.items():
        if shape is None:
            continue
        got[gen] = iss._gather(gen)
        rows, per_row = shape
        if len(got[gen]) != rows * per_row:
            raise IssError(f"ATTN {gen} walks {len(got[gen])} words, the launch needs {rows} "
                           f"rows of {per_row} words")
    zeros = np.zeros((keys, h), np.int64)
    k = _rows(got["RD3"], keys, h, lanes["k"], n) if "RD3" in got else zeros
    v = _rows(got["RD4"], keys, h, lanes["v"], n) if "RD4" in got else zeros
    if split == "reduced":
        raw_rows = got["RD5"].reshape(queries, prw * n)[:, :PARTIAL_BYTES * ring]
        reduced = np.ascontiguousarray(raw_rows).view("<i4").astype(np.int64)
        q = np.zeros((queries, h), np.int64)
    else:
        q = _rows(got["RD5"], queries, h, lanes["q"], n)
    bidir = bool(flags & FLAG_BIDIR)
    kv_ring = KVRing(window=ring, d_head=h, length=length)
    acc = []
    for kind, i in schedule(keys, queries, interleaved=interleaved, halo=halo):
        if kind == "k":
            kv_ring.write(k[i], v[i], r["K_POS"] + i, first=i == 0)
            continue
        if split == "partial":
            # Lanes not written since the restart hold no key of this launch: the engine
            # zeroes them (the golden ring holds zeros there).
            acc.append(kv_ring.raw_scores(q[i])[:ring])
            continue
        qpos = r["Q_POS"] + i
        mask = kv_ring.mask(qpos, bidirectional=bidir) & window_mask(
            kv_ring.pos, qpos, r["WINDOW"], bidirectional=bidir)
        raw = kv_ring.raw_scores(q[i])
        if split == "reduced":
            raw = np.zeros(length, np.int64)
            raw[:ring] = reduced[i]
        scores = score_row(raw, mask, r["SCORE_MULT"], r["SCORE_SHIFT"])
        # The buffer's P.V sees zero probabilities on the lanes the engine masked.
        acc.append(kv_ring.pv(softmax(scores, mask), mask))
    acc = np.array(acc, np.int64)
    if split == "partial":
        out = np.zeros((queries, prw * n), np.uint8)
        out[:, :PARTIAL_BYTES * ring] = acc.astype("<i4").view(np.uint8).reshape(queries, -1)
        iss._scatter("WR1", out.reshape(queries * prw, n))
        return
    out = requant(acc, r["OUT_MULT"], r["OUT_SHIFT"], 8)
    # The output row goes to the head's lanes of its words; the others are not written.
    lane, wo = lanes["o"], words["o"]
    row = np.zeros((queries, wo * n), np.int64)
    row[:, lane:lane + h] = out
    mask = np.array([head_lanes(w, lane, h, n) for w in range(wo)] * queries, bool)
    iss._scatter("WR1", pack_rows(row, 1, n), mask=mask)
