"""``ATTN`` encodings shared by the attention engine, the ISS, the launch builder and the timing
model: the ``AT_FLAGS`` bits, the position width, the softmax lanes per cycle and the order in
which a launch writes keys and issues queries.

Plain Python, no Amaranth (``docs/isa.md``, section ATTN).
"""

from __future__ import annotations

from .isa import COUNT_BITS

__all__ = ["POS_BITS", "FLAG_BIDIR", "FLAG_INTERLEAVED", "HALO_SHIFT", "HALO_BITS",
           "FLAGS_WIDTH", "KNOWN_FLAGS", "softmax_lanes", "schedule", "flags_value",
           "flags_halo"]

#: Absolute token positions are unsigned 16-bit (a chunk's position base plus its index).
POS_BITS = 16

#: ``AT_FLAGS`` bit 0: bidirectional mask (every held key is visible).
FLAG_BIDIR = 1
#: ``AT_FLAGS`` bit 1: interleaved schedule (one key write before each query) instead of
#: "preload every key, then every query".
FLAG_INTERLEAVED = 2
#: ``AT_FLAGS[HALO_SHIFT + HALO_BITS - 1 : HALO_SHIFT]``: keys written before the interleaving
#: starts (interleaved schedule only).
HALO_SHIFT = 8
HALO_BITS = COUNT_BITS
#: Width of the engine's ``flags`` field.
FLAGS_WIDTH = HALO_SHIFT + HALO_BITS
#: Every bit of ``AT_FLAGS`` that carries meaning.
KNOWN_FLAGS = FLAG_BIDIR | FLAG_INTERLEAVED | (((1 << HALO_BITS) - 1) << HALO_SHIFT)


def flags_value(*, bidirectional: bool, interleaved: bool, halo: int = 0) -> int:
    """The ``AT_FLAGS`` value of a launch."""
    if not 0 <= halo < 1 << HALO_BITS:
        raise ValueError(f"halo={halo} does not fit {HALO_BITS} bits")
    return (FLAG_BIDIR if bidirectional else 0) | (FLAG_INTERLEAVED if interleaved else 0) \
        | (halo << HALO_SHIFT)


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
