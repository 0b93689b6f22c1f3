"""The registry of top-level designs (hw.tops): each top is built with its preset's sizes;
``npu fpga`` builds the chip-bearing tops without AVG's divider."""

import re

from amaranth.back import rtlil

from hw.fpga.board import COLL_AVG, _ChipOnRing
from hw.ring.collective import CollectiveEngine
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


def _division_cells(design):
    return sorted(set(re.findall(r"cell \$(div\w*|mod\w*)\b", rtlil.convert(design))))


def test_collective_engine_without_avg_has_no_division():
    """The FPGA build's engine has no generic division cell (synth_ecp5 crashes on AVG's
    64-bit one: tests/hw/test_yosys_regressions.py); the default engine has AVG's."""
    assert _division_cells(CollectiveEngine(link_bytes=8)) == ["divfloor"]
    assert _division_cells(CollectiveEngine(link_bytes=8, avg=False)) == []


def test_fpga_builds_leave_out_avg():
    npu = npu_preset("tiny")
    assert build_top("tile", npu).coll_avg and not build_top("tile", npu, fpga=True).coll_avg
    assert not any(c.coll_avg for c in build_top("system", npu, fpga=True).chip)
    assert all(c.coll_avg for c in build_top("system", npu).chip)
    assert build_top("node", npu).chip.coll_avg
    assert not build_top("node", npu, fpga=True).chip.coll_avg
    assert not any(e.avg for e in build_top("ring", npu, fpga=True).engines)
    assert build_top("matmul", npu, fpga=True).size == npu.array_size
    assert not _ChipOnRing(npu).chip.coll_avg and not COLL_AVG
