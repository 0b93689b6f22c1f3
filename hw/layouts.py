"""Stream payload layouts shared across units (DESIGN.md §2, integration contract).

Every unit's streams carry a ``data.Struct`` of a vector of lanes plus ``last`` (and, where a unit
needs it, a few more fields): :func:`lanes_layout` builds them so they look alike everywhere.
"""

from amaranth.hdl import ShapeLike
from amaranth.lib import data

__all__ = ["lanes_layout"]


def lanes_layout(shape: ShapeLike, count: int, **extra: ShapeLike) -> data.StructLayout:
    """``{"data": ArrayLayout(shape, count), "last": 1, **extra}``."""
    if not isinstance(count, int) or count < 1:
        raise TypeError(f"Lane count must be a positive integer, not {count!r}")
    return data.StructLayout({"data": data.ArrayLayout(shape, count), "last": 1, **extra})
