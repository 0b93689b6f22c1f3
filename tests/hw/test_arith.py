"""hw.arith: the LUT product equals ``*`` for every sign combination; the adder tree; saturation."""

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.sim import Simulator

from hw.arith import lut_product, round_saturate, saturate, tree_sum
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



@pytest.mark.parametrize("shape, bits", [(signed(9), 4), (signed(4), 4), (signed(3), 4),
                                         (unsigned(6), 4), (unsigned(4), 4), (unsigned(3), 4)])
def test_saturate_equals_clamp_for_every_value(shape, bits):
    """Every value of the input shape: the bit tests give ``clamp(v, -2**(b-1), 2**(b-1)-1)``."""
    v = Signal(shape)
    m = Module()
    out = saturate(m, v, bits, "sat")
    assert out.shape() == signed(bits)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    values = range(-(1 << (shape.width - 1)), 1 << (shape.width - 1)) if shape.signed else \
        range(1 << shape.width)
    sim = Simulator(m)

    async def bench(ctx):
        for x in values:
            ctx.set(v, x)
            assert ctx.get(out) == min(max(x, lo), hi), (shape, x)

    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("width, bits, shifts", [(12, 4, range(0, 6)), (10, 8, range(0, 4))])
def test_round_saturate_equals_the_rounding_shift_and_clamp(width, bits, shifts):
    """Every ``v`` of ``signed(width)`` and shift ``s``: ``round_saturate`` of ``w = (v << 1)
    >> s`` gives ``clamp((v + 2**(s-1)) >> s)`` (``v`` itself at ``s = 0``), the requantisers'
    rounding shift."""
    v = Signal(signed(width))
    s = Signal(range(max(shifts) + 1))
    m = Module()
    out = round_saturate(m, (v << 1) >> s, bits, "rs")
    assert out.shape() == signed(bits)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    sim = Simulator(m)

    async def bench(ctx):
        for sh in shifts:
            ctx.set(s, sh)
            for x in range(-(1 << (width - 1)), 1 << (width - 1)):
                ctx.set(v, x)
                want = min(max((x + ((1 << sh) >> 1)) >> sh, lo), hi)
                assert ctx.get(out) == want, (width, bits, sh, x)

    sim.add_testbench(bench)
    sim.run()
