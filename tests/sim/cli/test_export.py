"""``npu export`` (sim.cli.export): the Verilog file, and bad input as one line."""

import hw.tops
from tests.helpers import TINY_NPU, FlipFlop, assert_one_line_error, run


def test_cli_export(tmp_path, capsys):
    status, out, err = run(capsys, "export", "--top", "softmax", "--npu", TINY_NPU,
                           "-o", str(tmp_path))
    assert status == 0, err
    (verilog_file,) = tmp_path.glob("*.v")
    text = verilog_file.read_text()
    assert "i__payload" in text and "o__payload" in text


def test_export_unknown_top(capsys, tmp_path):
    status, out, err = run(capsys, "export", "--top", "nosuch", "--npu", TINY_NPU,
                           "-o", str(tmp_path / "out"))
    assert_one_line_error(status, out, err, "npu export: unknown --top 'nosuch'; choose from ",
                          "matmul", "system")
    assert not (tmp_path / "out").exists()


def test_export_not_built(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(hw.tops.TOPS, "later", hw.tops.Top("later", "a block to come", None))
    status, out, err = run(capsys, "export", "--top", "later", "--npu", TINY_NPU,
                           "-o", str(tmp_path / "out"))
    assert_one_line_error(status, out, err,
                          "npu export: --top later (a block to come) is not built yet")


def test_export_output_is_a_file(capsys, tmp_path, monkeypatch):
    # A registered top whose output directory cannot be created: exit 2 before any Verilog.
    monkeypatch.setitem(hw.tops.TOPS, "wire", hw.tops.Top("wire", "a wire",
                                                          lambda n, c: FlipFlop()))
    blocker = tmp_path / "file"
    blocker.write_text("")
    status, out, err = run(capsys, "export", "--top", "wire", "--npu", TINY_NPU,
                           "-o", str(blocker / "sub"))
    assert_one_line_error(status, out, err, "npu export: cannot create output directory ",
                          str(blocker / "sub"))
