"""hw.arith: the LUT product equals ``*`` for every sign combination; the adder tree."""

import pytest
from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.sim import Simulator

from hw.arith import lut_product, tree_sum
from tests.helpers import seeded


@pytest.mark.parametrize("sa, sb, wa, wb", [(True, True, 8, 8), (True, False, 8, 8),
                                            (False, True, 9, 8), (False, False, 5, 7)])
def test_lut_product_is_exact(sa, sb, wa, wb):
    rng = seeded(wa * 100 + wb + 10 * sa + sb)
    a = Signal((signed if sa else unsigned)(wa))
    b = Signal((signed if sb else unsigned)(wb))
    prod = lut_product(a, b)
    assert prod.shape() == (a * b).shape()
    m = Module()
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
