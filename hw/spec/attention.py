"""``ATTN`` encodings shared by the attention engine, the ISS, the launch builder and the timing
model: the ``AT_FLAGS`` bits, the position width, the softmax lanes per cycle and the order in
which a launch writes keys and issues queries.

Plain Python, no Amaranth (``docs/isa.md``, section ATTN).
"""

from __future__ import annotations

from .isa import COUNT_BITS

__all__ = ["POS_BITS", "FLAG_BIDIR", "FLAG_INTERLEAVED", "FLAG_PARTIAL", "FLAG_REDUCED",
           "HALO_SHIFT", "HALO_BITS", "FLAGS_WIDTH", "KNOWN_FLAGS", "PARTIAL_BYTES",
           "softmax_lanes", "schedule", "flags_value", "flags_halo", "split_mode",
           "partial_row_words", "head_words", "head_lanes", "LANE_REGS", "launch_words"]

#: Absolute token positions are unsigned 16-bit (a chunk's position base plus its index).
POS_BITS = 16

#: ``AT_FLAGS`` bit 0: bidirectional mask (every held key is visible).
FLAG_BIDIR = 1
#: ``AT_FLAGS`` bit 1: interleaved schedule (one key write before each query) instead of
#: "preload every key, then every query".
FLAG_INTERLEAVED = 2
#: ``AT_FLAGS`` bit 2: split-score pass 1 (hidden-dimension parallelism): every query's raw
#: int32 partial scores ``q . k_j`` over this chip's lanes of the head are written (WR1) instead
#: of its output; no softmax, no P.V, no V read.
FLAG_PARTIAL = 4
#: ``AT_FLAGS`` bit 3: split-score pass 2: every query's score row is the reduced (summed over
#: the head's chips) int32 row read from RD5 instead of ``q . k``; then softmax and P.V as usual.
#: No Q or K read. Bits 2 and 3 are exclusive.
FLAG_REDUCED = 8
#: ``AT_FLAGS[HALO_SHIFT + HALO_BITS - 1 : HALO_SHIFT]``: keys written before the interleaving
#: starts (interleaved schedule only).
HALO_SHIFT = 8
HALO_BITS = COUNT_BITS
#: Width of the engine's ``flags`` field.
FLAGS_WIDTH = HALO_SHIFT + HALO_BITS
#: Every bit of ``AT_FLAGS`` that carries meaning.
KNOWN_FLAGS = FLAG_BIDIR | FLAG_INTERLEAVED | FLAG_PARTIAL | FLAG_REDUCED \
    | (((1 << HALO_BITS) - 1) << HALO_SHIFT)
#: Bytes of one raw score lane in a partial or reduced row (int32, little-endian).
PARTIAL_BYTES = 4


def flags_value(*, bidirectional: bool, interleaved: bool, halo: int = 0,
                split: str | None = None) -> int:
    """The ``AT_FLAGS`` value of a launch; ``split`` is None, ``"partial"`` (pass 1) or
    ``"reduced"`` (pass 2)."""
    if not 0 <= halo < 1 << HALO_BITS:
        raise ValueError(f"halo={halo} does not fit {HALO_BITS} bits")
    modes = {None: 0, "partial": FLAG_PARTIAL, "reduced": FLAG_REDUCED}
    if split not in modes:
        raise ValueError(f"split must be None, 'partial' or 'reduced', not {split!r}")
    return (FLAG_BIDIR if bidirectional else 0) | (FLAG_INTERLEAVED if interleaved else 0) \
        | modes[split] | (halo << HALO_SHIFT)


def split_mode(flags: int) -> str | None:
    """The split-score pass of an ``AT_FLAGS`` value: None, ``"partial"`` or ``"reduced"``;
    ValueError when both bits are set."""
    partial, reduced = bool(flags & FLAG_PARTIAL), bool(flags & FLAG_REDUCED)
    if partial and reduced:
        raise ValueError("AT_FLAGS bits 2 (partial) and 3 (reduced) are exclusive")
    return "partial" if partial else "reduced" if reduced else None


def partial_row_words(window: int, size: int) -> int:
    """Scratchpad words of one partial or reduced score row: the ``window`` (W) lanes of the
    ring as int32, little-endian, lane j at bytes ``4j .. 4j + 3``, the last word padded with
    zeros: ``ceil(4 W / N)``."""
    return -(-PARTIAL_BYTES * window // size)


def head_words(d_head: int, lane: int, size: int) -> int:
    """Scratchpad words of one token's slice of a head of ``d_head`` lanes whose first lane is
    lane ``lane`` (``AT_Q_LANE`` .. ``AT_O_LANE``, 0..N-1) of its first word:
    ``ceil((lane + d_head) / N)``.
    Heads narrower than a word share words (packed heads); the engine reads the words and
    keeps the head's lanes, and writes its output row into those lanes only."""
    return -(-(lane + d_head) // size)


#: The lane-offset registers of a launch's streams, by stream: Q (RD5), K (RD3), V (RD4) and the
#: output (WR1).
LANE_REGS = {"q": "AT_Q_LANE", "k": "AT_K_LANE", "v": "AT_V_LANE", "o": "AT_O_LANE"}


def launch_words(regs: dict, size: int) -> dict[str, int]:
    """Words per row of each stream of a launch (``regs``: its ``AT_*`` registers, the lane
    offsets 0 when absent): ``{"q", "k", "v", "o"}``."""
    h = regs["AT_D_HEAD"]
    return {s: head_words(h, regs.get(reg, 0), size) for s, reg in LANE_REGS.items()}


def head_lanes(word: int, lane: int, d_head: int, size: int) -> list[bool]:
    """Which bytes of word ``word`` (0-based) of an output row belong to the head: lanes
    ``lane .. lane + d_head - 1`` of the row's words (the write mask of that word)."""
    return [lane <= word * size + i < lane + d_head for i in range(size)]


def flags_halo(flags: int) -> int:
    """The halo field of an ``AT_FLAGS`` value."""
    return (flags >> HALO_SHIFT) & ((1 << HALO_BITS) - 1)


def softmax_lanes(length: int) -> int:
    """Softmax lanes per cycle the attention engine uses: the largest divisor of ``length``
    (``softmax_len``) not above 4."""
    return max(p for p in range(1, 5) if length % p == 0)


def schedule(keys: int, queries: int, *, interleaved: bool, halo: int = 0) -> list:
    """The engine's command order: ``("k", n)`` writes key n, ``("q", t)`` issues query t.

    Preload: every key, then every query. Interleaved: ``halo`` keys, then before query t one
    more key while fewer than ``min(keys, halo + t + 1)`` are written.
    """
    out, written = [], 0
    if not interleaved:
        halo = keys
    for t in range(queries):
        target = keys if not interleaved else min(keys, halo + t + 1)
        while written < target:
            out.append(("k", written))
            written += 1
        out.append(("q", t))
    return out
