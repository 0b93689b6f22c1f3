"""Stream payload layouts shared across units (the integration contract of
``docs/architecture.md``).

Every unit's streams carry a ``data.Struct`` of a vector of lanes plus ``last`` (and, where a unit
needs it, a few more fields): :func:`lanes_layout` builds them so they look alike everywhere.
"""

from amaranth.hdl import ShapeLike, signed, unsigned
from amaranth.lib import data

__all__ = ["lanes_layout", "spad_word_layout", "spad_write_layout", "ring_word_layout"]


def lanes_layout(shape: ShapeLike, count: int, **extra: ShapeLike) -> data.StructLayout:
    """``{"data": ArrayLayout(shape, count), "last": 1, **extra}``."""
    if not isinstance(count, int) or count < 1:
        raise TypeError(f"Lane count must be a positive integer, not {count!r}")
    return data.StructLayout({"data": data.ArrayLayout(shape, count), "last": 1, **extra})


def spad_word_layout(size: int) -> data.StructLayout:
    """A scratchpad word (``size`` = N bytes) seen as N int8 lanes, plus ``last``: what the
    scratchpad's read and write ports and the units' word streams carry."""
    return lanes_layout(signed(8), size)


def spad_write_layout(size: int) -> data.StructLayout:
    """A word a unit writes through a masked write port (WR1: the attention engine's output,
    the vector engine's data): :func:`spad_word_layout` plus ``mask``, one write enable per
    byte (lane ``i`` is written when bit ``i`` is set). Heads packed in shared words each write
    their own lanes."""
    return lanes_layout(signed(8), size, mask=unsigned(size))


def ring_word_layout(word_bytes: int, *, tag_bits: int = 0) -> data.StructLayout:
    """A collective-engine (ring) word: ``word_bytes / 4`` little-endian 32-bit lanes plus
    ``last`` (end of block). A 64-bit element occupies two adjacent lanes, low half first.

    With ``tag_bits`` the word also carries a routing ``tag`` (on the links between chips:
    :data:`hw.spec.ring.TAG_BITS`, see ``hw/ring/router.py``)."""
    if not isinstance(word_bytes, int) or word_bytes < 4 or word_bytes % 4:
        raise ValueError(f"word_bytes must be a positive multiple of 4, not {word_bytes!r}")
    extra = {"tag": unsigned(tag_bits)} if tag_bits else {}
    return lanes_layout(unsigned(32), word_bytes // 4, **extra)
