"""The softmax unit's shared tables (hw.spec.softmax): the exp LUT."""

from hw.spec.softmax import EXP_BITS, EXP_LUT


def test_exp_table():
    assert EXP_LUT[0] == 1 << EXP_BITS
    assert all(a > b for a, b in zip(EXP_LUT[:-1], EXP_LUT[1:], strict=True)), "EXP_LUT must fall"
    assert EXP_LUT[-1] > 1 << (EXP_BITS - 1)
