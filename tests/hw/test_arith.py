"""hw.arith: the LUT product equals ``*`` for every sign combination; the narrow division
equals Python's ``divmod`` on every operand pair of small ranges."""

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.sim import Simulator

from hw.arith import lut_product, small_divmod, tree_sum
from tests.helpers import seeded


@pytest.mark.parametrize("kept", [False, True])
@pytest.mark.parametrize("sa, sb, wa, wb", [(True, True, 8, 8), (True, False, 8, 8),
                                            (False, True, 9, 8), (False, False, 5, 7)])
def test_lut_product_is_exact(sa, sb, wa, wb, kept):
    """Every sign combination; ``kept``: the partial sums as kept signals of the module."""
    rng = seeded(wa * 100 + wb + 10 * sa + sb)
    a = Signal((signed if sa else unsigned)(wa))
    b = Signal((signed if sb else unsigned)(wb))
    m = Module()
    prod = lut_product(a, b, m=m if kept else None)
    assert prod.shape() == (a * b).shape()
    y = Signal(prod.shape())
    m.d.comb += y.eq(prod)
    lo_a, hi_a = (-(1 << (wa - 1)), 1 << (wa - 1)) if sa else (0, 1 << wa)
    lo_b, hi_b = (-(1 << (wb - 1)), 1 << (wb - 1)) if sb else (0, 1 << wb)
    # The corners, then random pairs.
    pairs = [(x, z) for x in (lo_a, hi_a - 1, 0) for z in (lo_b, hi_b - 1, 0)]
    pairs += [(int(x), int(z)) for x, z in zip(rng.integers(lo_a, hi_a, 300),
                                               rng.integers(lo_b, hi_b, 300), strict=True)]
    sim = Simulator(m)

    async def bench(ctx):
        for x, z in pairs:
            ctx.set(a, x)
            ctx.set(b, z)
            assert ctx.get(y) == x * z, (x, z)

    sim.add_testbench(bench)
    sim.run()


def test_tree_sum_of_one():
    a = Signal(4)
    assert tree_sum([a]) is a


def test_tree_sum_keeps_its_partial_sums():
    """With a module, each addition drives a signal marked keep (carry chains on the FPGA),
    and the sum is the same."""
    xs = [Signal(signed(6), name=f"x{i}") for i in range(5)]
    m = Module()
    total = tree_sum(xs, m=m, name="t")
    y = Signal(total.shape())
    m.d.comb += y.eq(total)
    text = rtlil.convert(m, ports=[*xs, y])
    assert text.count("attribute \\keep 1") >= 4, text
    m = Module()
    total = tree_sum(xs, m=m, name="t")
    y = Signal(total.shape())
    m.d.comb += y.eq(total)
    sim = Simulator(m)

    async def bench(ctx):
        for values in ([-32, -32, -32, -32, -32], [31, 31, 31, 31, 31], [1, -2, 3, -4, 5]):
            for x, v in zip(xs, values, strict=True):
                ctx.set(x, v)
            assert ctx.get(y) == sum(values), values

    sim.add_testbench(bench)
    sim.run()


def _divmod_cases(x_bits, d_bits, d_max, cases):
    """Run ``small_divmod`` on every ``(x, d)`` of ``cases`` in pysim; the first mismatch
    fails naming its index, operands and both results."""
    x, d = Signal(x_bits), Signal(d_bits)
    m = Module()
    qs, rs = small_divmod(m, x, d, d_max=d_max)
    assert len(qs) == x_bits and len(rs) == d_max.bit_length()
    sim = Simulator(m)

    async def bench(ctx):
        for i, (xv, dv) in enumerate(cases):
            ctx.set(x, xv)
            ctx.set(d, dv)
            got, want = (ctx.get(qs), ctx.get(rs)), divmod(xv, dv)
            assert got == want, (f"case {i} of {len(cases)}: {xv} divmod {dv} (d_max={d_max}) "
                                 f"gave {got}, Python {want}")

    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("x_bits, d_max", [(6, 1), (6, 2), (7, 3), (8, 5), (8, 8), (5, 16)])
def test_small_divmod_exhaustive(x_bits, d_max):
    """Every x of ``x_bits`` bits by every divisor 1..d_max (the divisor signal as narrow as
    d_max allows, as the collective engine's group size is)."""
    cases = [(xv, dv) for xv in range(1 << x_bits) for dv in range(1, d_max + 1)]
    _divmod_cases(x_bits, d_max.bit_length(), d_max, cases)


def test_small_divmod_wide_dividend():
    """The collective engine's use: a 24-bit length by a group size 1..8 (extremes, then
    random pairs), with a divisor signal wider than d_max needs."""
    rng = seeded(7)
    cases = [(xv, dv) for xv in (0, 1, 7, 8, 9, (1 << 23), (1 << 24) - 1)
             for dv in range(1, 9)]
    cases += [(int(xv), int(dv)) for xv, dv in zip(rng.integers(0, 1 << 24, 400),
                                                   rng.integers(1, 9, 400), strict=True)]
    _divmod_cases(24, 6, 8, cases)


@pytest.mark.parametrize("x, d, d_max, error, match", [
    (Signal(8), Signal(4), 0, ValueError, r"d_max must be a positive integer, not 0"),
    (Signal(8), Signal(4), True, ValueError, r"d_max must be a positive integer, not True"),
    (Signal(signed(8)), Signal(4), 8, TypeError, r"unsigned operands"),
    (Signal(8), Signal(signed(4)), 8, TypeError, r"unsigned operands"),
])
def test_small_divmod_rejects(x, d, d_max, error, match):
    with pytest.raises(error, match=match):
        small_divmod(Module(), x, d, d_max=d_max)
