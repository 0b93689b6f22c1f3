"""The registry of top-level designs (hw.tops): each top is built with its preset's sizes."""

from hw.spec import npu_preset
from hw.tops import build_top


def test_top_registered():
    npu = npu_preset("tiny")
    dut = build_top("attention", npu)
    assert (dut.window, dut.d_head, dut.length) == (npu.attn_window, npu.d_head_max,
                                                    npu.softmax_len)


def test_top_builder_uses_softmax_len():
    for preset in ("tiny", "fpga"):
        npu = npu_preset(preset)
        assert build_top("softmax", npu).length == npu.softmax_len
