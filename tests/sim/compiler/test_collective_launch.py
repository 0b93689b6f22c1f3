"""The COLL launch builder (sim.compiler.collective_launch): impossible launches are refused."""

import pytest

from hw.spec.collective import CollectiveRequest
from sim.compiler.collective_launch import coll_launch


def test_rejections():
    rs = CollectiveRequest("reduce_scatter", "sum", 32, 1, 2)
    with pytest.raises(ValueError, match="output buffer of 0 scratchpad words"):
        coll_launch(rs, 1, in_base=0, out_base=8, size=4, link_bytes=4)
    with pytest.raises(ValueError, match="chip must be 0..1, not 2"):
        coll_launch(rs, 2, in_base=0, out_base=8, size=4, link_bytes=4)


def test_natural_order_needs_equal_whole_word_blocks():
    from sim.compiler.collective_launch import coll_launch_natural, natural_block_words

    req = CollectiveRequest("all_reduce", "sum", 32, 64, 3)
    with pytest.raises(ValueError, match=r"needs length=64 to be a multiple of count x elements "
                                         r"per engine word = 3 x 2 = 6"):
        coll_launch_natural(req, 0, base=0, size=4, link_bytes=4)
    req = CollectiveRequest("all_reduce", "sum", 32, 60, 3)
    assert natural_block_words(req, 4, 4) == 20
    # Chip 1's blocks stream 0, 2, 1 (from offset 0, then wrapping to block 2) in a buffer of 60.
    launch = coll_launch_natural(req, 1, base=100, size=4, link_bytes=4)
    assert (launch.rd6.off, launch.rd6.wrap, launch.rd6.n[:2], launch.rd6.s[:2]) == \
        (0, 60, (20, 3), (1, -20))
