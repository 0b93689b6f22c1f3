"""VEC launch builders (sim.compiler.vector_launch): bad operands and outputs are refused."""

import pytest

from hw.spec.vector import VectorOp
from sim.compiler.vector_launch import Rows, vector_launch


@pytest.mark.parametrize("kwargs, match", [
    ({"op": VectorOp.LN_STATS, "b": None}, r"stats_base is required for LN_STATS"),
    ({"stats_base": 50}, r"stats_base is only for LN_STATS, LN_APPLY, RMS_APPLY, ARGMAX and "
                         r"ONEHOT"),
    ({"op": VectorOp.LN_APPLY, "stats_base": 50, "q": Rows(30, 2, 1, 1)},
     r"LN_APPLY needs n \(the count over all chips\) in 1\.\.65535, not None"),
    ({"op": VectorOp.LN_STATS, "b": None, "stats_base": 50}, r"LN_STATS writes only its "
                                                              r"statistics"),
    ({"a": Rows(0, 2, 1, 2)}, r"a: row_words=1 cannot hold 4 elements of 2 bytes"),
    ({"b": None}, r"ADD needs operand b"),
    ({"b": Rows(10, 3, 2, 2)}, r"b.rows=3 must be 1 \(shared\) or a.rows=2"),
    ({"q": Rows(30, 2, 1, 1)}, r"q is LN's int8 output: only for LN"),
    ({"data": None}, r"ADD needs an output"),
    ({"data": Rows(20, 1, 2, 2)}, r"data.rows=1 must equal a.rows=2"),
    ({"length": 0}, r"length must be in 1\.\.65535, not 0"),
])
def test_builder_rejects(kwargs, match):
    args = {"size": 4, "op": VectorOp.ADD, "length": 4, "a": Rows(0, 2, 2, 2),
            "b": Rows(10, 2, 2, 2), "data": Rows(20, 2, 2, 2)}
    with pytest.raises(ValueError, match=match):
        vector_launch(**dict(args, **kwargs))


def test_builder_rejects_bad_rows_and_lut_length():
    with pytest.raises(ValueError, match=r"Rows eb must be 1, 2 or 4 bytes, not 3"):
        Rows(0, 1, 1, 3)
    with pytest.raises(ValueError, match=r"Rows base must be a non-negative integer"):
        Rows(-1, 1, 1, 1)
    with pytest.raises(ValueError, match=r"LOAD_LUT length must be 256, not 16"):
        vector_launch(size=4, op=VectorOp.LOAD_LUT, length=16, a=Rows(0, 1, 4, 1))
