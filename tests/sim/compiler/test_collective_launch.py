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
