"""``ATTN`` encodings shared by the attention engine, the ISS, the launch builder and the timing
model: the ``AT_FLAGS`` bits, the position width, the softmax lanes per cycle and the order in
which a launch writes keys and issues queries.

Plain Python, no Amaranth (``docs/isa.md``, section ATTN).
"""

from __future__ import annotations

from .isa import COUNT_BITS

__all__ = ["POS_BITS", "FLAG_BIDIR", "FLAG_INTERLEAVED", "FLAG_PARTIAL", "FLAG_REDUCED",
           "FLAG_STATE_IN", "FLAG_STATE_OUT", "HALO_SHIFT", "HALO_BITS", "FLAGS_WIDTH",
           "KNOWN_FLAGS", "PARTIAL_BYTES", "STATE_LANE_BYTES", "softmax_lanes", "schedule",
           "flags_value", "flags_halo", "split_mode", "state_mode", "partial_row_words",
           "state_words", "state_lanes_per_word", "head_words", "head_lanes", "LANE_REGS",
           "launch_words", "q_row_words", "chunk_order", "block_order"]

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
#: ``AT_FLAGS`` bit 4: long context, the query rows (RD5) are **state rows**: the head's Q words
#: followed by the state ``(m, l, o)`` of the chunks merged so far, which this launch's partial
#: result is merged into (``hw.spec.softmax``, State and merge).
FLAG_STATE_IN = 16
#: ``AT_FLAGS`` bit 5: long context, the output rows (WR1) are state rows (the Q words as read,
#: then the merged state) instead of int8 outputs. With bit 4 alone the merged state is
#: normalised and requantised to the int8 output. Either bit runs the softmax in partial mode;
#: bits 4 and 5 exclude bits 2 and 3.
FLAG_STATE_OUT = 32
#: ``AT_FLAGS[HALO_SHIFT + HALO_BITS - 1 : HALO_SHIFT]``: keys written before the interleaving
#: starts (interleaved schedule only).
HALO_SHIFT = 8
HALO_BITS = COUNT_BITS
#: Width of the engine's ``flags`` field.
FLAGS_WIDTH = HALO_SHIFT + HALO_BITS
#: Every bit of ``AT_FLAGS`` that carries meaning.
KNOWN_FLAGS = FLAG_BIDIR | FLAG_INTERLEAVED | FLAG_PARTIAL | FLAG_REDUCED | FLAG_STATE_IN \
    | FLAG_STATE_OUT | (((1 << HALO_BITS) - 1) << HALO_SHIFT)
#: Bytes of one raw score lane in a partial or reduced row (int32, little-endian).
PARTIAL_BYTES = 4
#: Bytes of one lane of a state (int32, little-endian): lane 0 ``m`` (its low 16 bits are the
#: int16 maximum), lane 1 ``l``, lanes ``2 .. h + 1`` ``o``.
STATE_LANE_BYTES = 4


def flags_value(*, bidirectional: bool, interleaved: bool, halo: int = 0,
                split: str | None = None, state_in: bool = False,
                state_out: bool = False) -> int:
    """The ``AT_FLAGS`` value of a launch; ``split`` is None, ``"partial"`` (pass 1) or
    ``"reduced"`` (pass 2); ``state_in`` and ``state_out`` the long-context state rows."""
    if not 0 <= halo < 1 << HALO_BITS:
        raise ValueError(f"halo={halo} does not fit {HALO_BITS} bits")
    modes = {None: 0, "partial": FLAG_PARTIAL, "reduced": FLAG_REDUCED}
    if split not in modes:
        raise ValueError(f"split must be None, 'partial' or 'reduced', not {split!r}")
    if split is not None and (state_in or state_out):
        raise ValueError("the split-score passes and the state rows are exclusive")
    return (FLAG_BIDIR if bidirectional else 0) | (FLAG_INTERLEAVED if interleaved else 0) \
        | modes[split] | (FLAG_STATE_IN if state_in else 0) \
        | (FLAG_STATE_OUT if state_out else 0) | (halo << HALO_SHIFT)


def split_mode(flags: int) -> str | None:
    """The split-score pass of an ``AT_FLAGS`` value: None, ``"partial"`` or ``"reduced"``;
    ValueError when both bits are set."""
    partial, reduced = bool(flags & FLAG_PARTIAL), bool(flags & FLAG_REDUCED)
    if partial and reduced:
        raise ValueError("AT_FLAGS bits 2 (partial) and 3 (reduced) are exclusive")
    return "partial" if partial else "reduced" if reduced else None


def state_mode(flags: int) -> str | None:
    """The long-context mode of an ``AT_FLAGS`` value: None (bits 4 and 5 clear), ``"first"``
    (bit 5: no state in, a state out), ``"middle"`` (both) or ``"last"`` (bit 4: a state in,
    the int8 output out); ValueError with a split-score bit."""
    st_in, st_out = bool(flags & FLAG_STATE_IN), bool(flags & FLAG_STATE_OUT)
    if (st_in or st_out) and flags & (FLAG_PARTIAL | FLAG_REDUCED):
        raise ValueError("AT_FLAGS bits 4 and 5 (state rows) exclude bits 2 and 3 (split "
                         "score)")
    return {(False, False): None, (False, True): "first", (True, True): "middle",
            (True, False): "last"}[st_in, st_out]


def state_lanes_per_word(size: int) -> int:
    """int32 lanes of a state row per scratchpad word: ``N / 4`` (state rows need ``N`` a
    multiple of 4)."""
    if size % STATE_LANE_BYTES:
        raise ValueError(f"state rows need a word of a multiple of {STATE_LANE_BYTES} bytes, "
                         f"not {size}")
    return size // STATE_LANE_BYTES


def state_words(d_head: int, size: int) -> int:
    """Scratchpad words of the state part of a state row of a ``d_head``-lane head:
    ``ceil(4 (d_head + 2) / N)`` (lanes ``m``, ``l``, ``o[0..h-1]``, int32 little-endian; the
    last word's other lanes are written as 0 and not read)."""
    return -(-(d_head + 2) // state_lanes_per_word(size))


def q_row_words(regs: dict, size: int) -> int:
    """Words of one RD5 row of a launch: the head's Q words, plus its state words when the
    launch reads state rows (``FLAG_STATE_IN``), or the reduced pass's score row."""
    flags = regs["AT_FLAGS"]
    if split_mode(flags) == "reduced":
        raise ValueError("the reduced pass reads score rows (partial_row_words)")
    words = head_words(regs["AT_D_HEAD"], regs.get("AT_Q_LANE", 0), size)
    if flags & FLAG_STATE_IN:
        words += state_words(regs["AT_D_HEAD"], size)
    return words


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


def chunk_order(seq: int, block: int, *, causal: bool, ring: int) -> list:
    """Long context's merge order (the definition of its integers, ``hw.spec.softmax``) for
    the ``seq`` rows cut into blocks of ``block`` rows (the last may be shorter), one per
    query pass on one chip or per chip of a ring: :func:`block_order` of those blocks."""
    if seq < 1 or block < 1:
        raise ValueError(f"seq={seq} and block={block} must be at least 1")
    return block_order([(b0, min(b0 + block, seq)) for b0 in range(0, seq, block)],
                       causal=causal, ring=ring)


def block_order(blocks, *, causal: bool, ring: int) -> list:
    """``[(q_start, q_stop, [(k_start, k_stop), ...]), ...]``: runs of query rows and their key
    chunks in merge order, for the blocks ``blocks`` (``[(start, stop), ...]``, consecutive
    from 0; a chip's tokens each, or one chip's query passes).

    Block ``b``'s queries run in sub-blocks of at most ``ring`` rows; each sees its own block's
    keys first (in chunks of at most ``ring``, ascending; causal: only those up to its own
    rows), then the other blocks in the order a ring delivers them to chip ``b`` when every chip
    passes K/V on to the next: ``b - 1, ..., 0``, then (bidirectional) ``P - 1, ..., b + 1``;
    causal attention skips the blocks after ``b`` (every key masked). Each block's keys are
    merged in chunks of at most ``ring`` (the K/V ring), ascending. A run that sees one chunk
    is one plain softmax.
    """
    if ring < 1:
        raise ValueError(f"ring={ring} must be at least 1")
    count = len(blocks)

    def chunks_of(c, stop=None):
        a, z = blocks[c]
        z = z if stop is None else min(z, stop)
        return [(k0, min(k0 + ring, z)) for k0 in range(a, z, ring)]

    order = []
    for b, (b0, b1) in enumerate(blocks):
        others = [chunk for s in range(1, b + 1 if causal else count)
                  for chunk in chunks_of((b - s) % count)]
        for q0 in range(b0, b1, ring):
            q1 = min(q0 + ring, b1)
            order.append((q0, q1, chunks_of(b, q1 if causal else None) + others))
    return order
