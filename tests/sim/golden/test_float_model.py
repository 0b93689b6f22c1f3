"""The float64 reference model (sim.golden.float_model): attention masks."""

from sim.golden.float_model import attention_mask


def test_attention_masks():
    m = attention_mask(6, 3, True)
    assert m[5].tolist() == [False, False, False, True, True, True]
    assert m[0].tolist() == [True] + [False] * 5
    assert attention_mask(4, 0, False).all()
    assert attention_mask(5, 2, False)[2].tolist() == [False, True, True, True, False]
