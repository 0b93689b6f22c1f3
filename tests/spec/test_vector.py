"""Vector-unit commands (hw.spec.vector): VectorCmd rejects bad fields and unknown ops."""

import pytest

from hw.spec.vector import VectorCmd, VectorOp


@pytest.mark.parametrize("field, value", [("length", -1), ("n", 1 << 16), ("mult", 1 << 16),
                                          ("shift", 64), ("gshift", 1.5)])
def test_cmd_rejects(field, value):
    kwargs = {"op": VectorOp.ADD, "length": 4, field: value}
    with pytest.raises(ValueError, match=rf"VectorCmd {field}={value!r} must be an integer"):
        VectorCmd(**kwargs)


def test_cmd_rejects_unknown_op():
    with pytest.raises(ValueError):
        VectorCmd(99, 4)
