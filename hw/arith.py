"""Arithmetic that synthesis should build in a given way, written once for every unit."""

from __future__ import annotations

from amaranth.hdl import Mux, Value, signed, unsigned

__all__ = ["tree_sum", "lut_product"]


def tree_sum(values):
    """Balanced adder tree (log2 depth instead of a linear chain)."""
    values = list(values)
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def lut_product(a, b):
    """``a * b``, exact, as a tree of shifted partial products (one per bit of ``b``) rather
    than a multiplication, so that synthesis keeps it in LUTs and carry chains.

    Why: the chip has more small products than the ECP5-85k has DSP blocks (156 18x18
    multipliers, one per product whatever its width); an 8x8 product costs ~70 LUT4 here.
    The result has the shape of ``a * b``.
    """
    a, b = Value.cast(a), Value.cast(b)
    sa, sb = a.shape().signed, b.shape().signed
    shape = (signed if sa or sb else unsigned)(len(a) + len(b))
    terms = []
    for i in range(len(b)):
        term = Mux(b[i], a, 0) << i
        # The top bit of a signed b weighs -2**(len(b) - 1).
        terms.append(-term if sb and i == len(b) - 1 else term)
    # The exact product fits the shape: dropping the adders' extra top bits loses nothing.
    total = tree_sum(terms)[:shape.width]
    return total.as_signed() if shape.signed else total
