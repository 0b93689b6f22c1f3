"""The nextpnr report parser and the result table of ``npu fpga`` (sim.flows.fpga).

The parser reads ``fpga_report_ecp5.json``, the report of a real run (tiny 4x4 matmul unit in
the serial shell, nextpnr-0.11.1 router1, seed 1) with the cell names shortened and the unused
resource types left out.
"""

import dataclasses
import json
from pathlib import Path

import pytest

import hw.tops
from hw.spec import npu_preset
from hw.tile.matmul import MatmulUnit
from sim.flows import fpga

FIXTURE = Path(__file__).with_name("fpga_report_ecp5.json")
ECP5 = fpga.DEVICES["ecp5-85k"]


def test_parse_report_fixture():
    result = fpga.parse_report(json.loads(FIXTURE.read_text()), ECP5, 100.0)
    assert result["resources"] == {
        "LUT4": {"used": 5949, "available": 83640, "percent": 7.1},
        "FF": {"used": 3403, "available": 83640, "percent": 4.1},
        "MULT18X18D": {"used": 24, "available": 156, "percent": 15.4},
        "DP16KD": {"used": 0, "available": 208, "percent": 0.0},
    }
    assert result["fmax_mhz"] == 63.62
    assert result["target_mhz"] == 100.0 and result["timing_met"] is False
    # The register-to-register path, not the pad paths nextpnr lists as <async>.
    assert result["critical_path"] == {"from": "design.requant.p2_3",
                                       "to": "design.o__payload$25.data[3]",
                                       "delay_ns": 15.718, "logic_levels": 45, "nets": []}
    # The path's delay is the clock period nextpnr achieved.
    assert abs(1000 / result["critical_path"]["delay_ns"] - result["fmax_mhz"]) < 0.01


def test_parse_report_timing_met_below_fmax():
    assert fpga.parse_report(json.loads(FIXTURE.read_text()), ECP5, 60.0)["timing_met"] is True


def test_parse_report_slowest_clock_and_missing_cells():
    report = {"utilization": {"TRELLIS_COMB": {"used": 10, "available": 100}},
              "fmax": {"a": {"achieved": 120.0, "constraint": 50.0},
                       "b": {"achieved": 48.5, "constraint": 50.0}}}
    result = fpga.parse_report(report, ECP5, 50.0)
    assert result["fmax_mhz"] == 48.5 and result["timing_met"] is False
    assert result["resources"]["LUT4"] == {"used": 10, "available": 100, "percent": 10.0}
    # A cell type the report does not list is unused; the device total fills in.
    assert result["resources"]["DP16KD"] == {"used": 0, "available": 208, "percent": 0.0}
    assert result["critical_path"] is None


def test_parse_report_names_the_nets_of_the_path():
    """The path's nets cut to the design's signal names, in order, once each; nextpnr's own
    nets ($nextpnr...) left out."""
    def step(kind, net=None):
        return {"type": kind, "delay": 1.0, "from": {"cell": "a_TRELLIS_FF_Q"},
                "to": {"cell": "b_TRELLIS_FF_Q_2"}, **({"net": net} if net else {})}
    report = {"fmax": {"clk": {"achieved": 200.0, "constraint": 75.0}},
              "critical_paths": [{"from": "posedge clk", "to": "posedge clk", "path": [
                  step("clk-to-q"), step("routing", "design.x.acc[3]"), step("logic"),
                  step("routing", "design.x.sum_0_1_CCU2C_A0_COUT"),
                  step("routing", "design.x.sum_0_1$CCU2_FCI_INT"),
                  step("routing", "$nextpnr_CCU2C_28$CIN"),
                  step("routing", "design.o_row_TRELLIS_FF_Q_5_DI_LUT4_Z"), step("setup")]}]}
    path = fpga.parse_report(report, ECP5, 75.0)["critical_path"]
    assert path == {"from": "a", "to": "b", "delay_ns": 8.0, "logic_levels": 1,
                    "nets": ["design.x.acc[3]", "design.x.sum_0_1", "design.o_row"]}
    assert "  through design.x.acc[3] > design.x.sum_0_1 > design.o_row" in \
        fpga.format_table({**fpga.parse_report(report, ECP5, 75.0), "top": "t", "npu": "n",
                           "array": "a", "device": "d", "part": "p"}).splitlines()


def test_log_fmax_after_placement(tmp_path):
    """--place-only: nextpnr's report has no timing then; the placer's estimate comes from its
    log (the last line per clock), the slowest clock sets fmax."""
    log = tmp_path / "nextpnr.log"
    log.write_text("Info: Max frequency for clock '$glbnet$clk': 12.50 MHz (FAIL at 75.00 MHz)\n"
                   "Info: Max frequency for clock '$glbnet$clk': 17.89 MHz (FAIL at 75.00 MHz)\n"
                   "Info: Max frequency for clock 'ref': 160.44 MHz (PASS at 75.00 MHz)\n")
    result = fpga._log_fmax(log, 75.0)
    assert result["fmax_mhz"] == 17.89 and result["timing_met"] is False
    assert set(result["clocks"]) == {"$glbnet$clk", "ref"}
    empty = tmp_path / "empty.log"
    empty.write_text("Info: Program finished normally.\n")
    assert fpga._log_fmax(empty, 75.0)["fmax_mhz"] is None


def test_format_table():
    result = fpga.parse_report(json.loads(FIXTURE.read_text()), ECP5, 100.0)
    result.update(top="matmul", npu="tiny", array="4x4 array", device="ecp5-85k",
                  part=ECP5.part, shell={"in_bits": 288, "out_bits": 133, "ffs": 434,
                                         "luts": 133})
    lines = fpga.format_table(result).splitlines()
    assert lines[0] == "matmul (tiny, 4x4 array) on ecp5-85k (LFE5U-85F-6CABGA381)"
    assert lines[3].split() == ["LUT4", "5,949", "83,640", "7.1%"]
    assert lines[5].split() == ["MULT18X18D", "24", "156", "15.4%"]
    assert lines[7] == "fmax 63.6 MHz, target 100.0 MHz (MISSED)"


# --- the real tools on a small unit (the fpga extra; a couple of minutes) ------------------------

def _needs_tools():
    if fpga.tools_missing():
        pytest.skip("FPGA tools not installed (the fpga extra; make test installs it)")


@pytest.mark.fpga
def test_synthesis_smoke_2x2_matmul_unit(tmp_path, monkeypatch):
    """Yosys, nextpnr (router2) on a 2x2 matmul unit in the serial shell: it fits, the
    requantiser's wide products use DSPs, the array's LUTs, and timing is reported."""
    _needs_tools()
    monkeypatch.setitem(hw.tops.TOPS, "mm2", hw.tops.Top("mm2", "2x2 matmul unit",
                                                          lambda n, c: MatmulUnit(size=2)))
    npu = dataclasses.replace(npu_preset("tiny"), clock_mhz=75.0)
    result = fpga.synthesize(npu, top="mm2", build_dir=tmp_path)
    res = result["resources"]
    assert result["fits"] and result["shell"] and result["bitstream"] is None
    # Two 18x18 partial products per column of the requantiser; the 9x8 products in LUTs.
    assert res["MULT18X18D"]["used"] == 4, res
    assert res["DP16KD"]["used"] == 0 and res["LUT4"]["used"] > 100, res
    assert 20 < result["fmax_mhz"] < 500 and result["critical_path"]["delay_ns"] > 0
    assert set(result["wall_s"]) == {"export", "synth", "pnr"}
    assert "fmax" in fpga.format_table(result)
