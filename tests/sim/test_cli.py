"""The ``npu`` CLI's exit-status contract: 0 ok, 2 bad input as exactly one line, no traceback."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

import hw.tops
from hw.spec import PRESETS_DIR
from sim import errors
from sim.cli import main
from sim.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
TINY_NPU = str(PRESETS_DIR / "npu" / "tiny.toml")
TINY_MODEL = str(PRESETS_DIR / "models" / "tiny.toml")
COMMANDS = ["sim", "collective", "plan", "export", "fpga", "bench"]


def run(capsys, *argv):
    """Run ``npu argv`` in-process; return (status, stdout, stderr)."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def assert_one_line_error(status, out, err, *fragments):
    assert status == errors.EXIT_BAD_INPUT, f"exit status {status}, stderr {err!r}"
    assert out == "", f"stdout should be empty, got {out!r}"
    assert err.endswith("\n") and err.count("\n") == 1, f"stderr is not one line: {err!r}"
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"


@pytest.fixture
def bad_files(tmp_path):
    """Three bad NPU files and the fragments their error line must carry (file and key)."""
    unknown = tmp_path / "unknown.toml"
    unknown.write_text(Path(TINY_NPU).read_text() + "array_sise = 8\n")
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("array_size = 4\nsram_bytes = \n")
    missing = tmp_path / "missing.toml"
    return {
        "missing": (missing, [str(missing), "file not found"]),
        "bad TOML": (bad_toml, [str(bad_toml), "bad TOML", "line 2"]),
        "unknown key": (unknown, [str(unknown), "array_sise=8 unknown key"]),
    }


# --- help ---------------------------------------------------------------------------------------

def test_help_lists_every_command(capsys):
    status, out, err = run(capsys, "--help")
    assert status == errors.EXIT_OK and err == ""
    assert out.startswith("usage: npu ")
    for command in COMMANDS:
        assert f"\n    {command} " in out or f"\n    {command}\n" in out, \
            f"{command} missing from --help:\n{out}"


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help(capsys, command):
    status, out, err = run(capsys, command, "-h")
    assert status == errors.EXIT_OK and err == ""
    assert out.startswith(f"usage: npu {command} ")


# --- bad constraint files -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["missing", "bad TOML", "unknown key"])
@pytest.mark.parametrize("argv", [
    ["sim", "--npu", "{bad}", "--model", TINY_MODEL],
    ["plan", "--npu", "{bad}", "--model", TINY_MODEL, "--chips", "2"],
    ["collective", "--kind", "all_reduce", "--chips", "2", "--npu", "{bad}"],
    ["export", "--top", "matmul", "--npu", "{bad}", "-o", "{out}"],
    ["fpga", "--npu", "{bad}"],
], ids=["sim", "plan", "collective", "export", "fpga"])
def test_bad_npu_file(capsys, tmp_path, bad_files, kind, argv):
    path, fragments = bad_files[kind]
    argv = [a.format(bad=path, out=tmp_path / "out") for a in argv]
    status, out, err = run(capsys, *argv)
    assert_one_line_error(status, out, err, f"npu {argv[0]}: argument --npu: ", *fragments)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["sim", "plan"])
def test_bad_model_file(capsys, tmp_path, command):
    path = tmp_path / "model.toml"
    path.write_text(Path(TINY_MODEL).read_text().replace("d_model = 32", "d_model = 96"))
    argv = [command, "--npu", TINY_NPU, "--model", str(path)]
    status, out, err = run(capsys, *argv, *(["--chips", "2"] if command == "plan" else []))
    assert_one_line_error(status, out, err, f"npu {command}: argument --model: ",
                          "d_model=96 is not n_heads * d_head = 4 * 8 = 32", str(path))


def test_bad_value_names_key_value_limit(capsys, tmp_path):
    path = tmp_path / "npu.toml"
    path.write_text(Path(TINY_NPU).read_text().replace("softmax_len = 16", "softmax_len = 8"))
    status, out, err = run(capsys, "fpga", "--npu", str(path))
    assert_one_line_error(status, out, err, "softmax_len=8 is shorter than attn_window 16",
                          str(path))


# --- bad arguments ------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, fragments", [
    (["sim", "--strategy", "zigzag", "--npu", TINY_NPU, "--model", TINY_MODEL],
     ["npu sim: argument --strategy: invalid choice: 'zigzag'"]),
    (["sim", "--chips", "0", "--npu", TINY_NPU, "--model", TINY_MODEL],
     ["npu sim: argument --chips: 0 must be at least 1"]),
    (["sim", "--chips", "-3", "--npu", TINY_NPU, "--model", TINY_MODEL],
     ["npu sim: argument --chips: -3 must be at least 1"]),
    (["sim", "--chips", "two", "--npu", TINY_NPU, "--model", TINY_MODEL],
     ["npu sim: argument --chips: 'two' is not an integer"]),
    (["sim", "--npu", TINY_NPU], ["npu sim: the following arguments are required: --model"]),
    (["sim", "--npu", TINY_NPU, "--model", TINY_MODEL, "--frobnicate"],
     ["npu: unrecognized arguments: --frobnicate"]),
    (["collective", "--kind", "all_reduce", "--chips", "0", "--npu", TINY_NPU],
     ["npu collective: argument --chips: 0 must be at least 1"]),
    (["collective", "--kind", "all_reduce", "--chips", "2", "--npu", TINY_NPU, "--width", "48"],
     ["npu collective: argument --width: invalid choice: 48"]),
    (["plan", "--npu", TINY_NPU, "--model", TINY_MODEL],
     ["npu plan: one of the arguments --chips --min-chips is required"]),
    (["export", "--top", "matmul", "--npu", TINY_NPU, "--chips", "0", "-o", "x"],
     ["npu export: argument --chips: 0 must be at least 1"]),
    (["fpga", "--npu", TINY_NPU, "--device", "ice40"],
     ["npu fpga: argument --device: invalid choice: 'ice40'"]),
    (["frobnicate"], ["npu: argument COMMAND: invalid choice: 'frobnicate'"]),
    ([], ["npu: the following arguments are required: COMMAND"]),
])
def test_bad_arguments(capsys, argv, fragments):
    assert_one_line_error(*run(capsys, *argv), *fragments)


# --- export -------------------------------------------------------------------------------------

def test_export_unknown_top(capsys, tmp_path):
    status, out, err = run(capsys, "export", "--top", "nosuch", "--npu", TINY_NPU,
                           "-o", str(tmp_path / "out"))
    assert_one_line_error(status, out, err, "npu export: unknown --top 'nosuch'; choose from ",
                          "matmul", "system")
    assert not (tmp_path / "out").exists()


class _Wire(wiring.Component):
    a: In(1)
    y: Out(1)

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.y.eq(self.a)
        return m


def test_export_not_built(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(hw.tops.TOPS, "later", hw.tops.Top("later", "a block to come", None))
    status, out, err = run(capsys, "export", "--top", "later", "--npu", TINY_NPU,
                           "-o", str(tmp_path / "out"))
    assert_one_line_error(status, out, err,
                          "npu export: --top later (a block to come) is not built yet")


def test_export_output_is_a_file(capsys, tmp_path, monkeypatch):
    # A registered top whose output directory cannot be created: exit 2 before any Verilog.
    monkeypatch.setitem(hw.tops.TOPS, "wire", hw.tops.Top("wire", "a wire", lambda n, c: _Wire()))
    blocker = tmp_path / "file"
    blocker.write_text("")
    status, out, err = run(capsys, "export", "--top", "wire", "--npu", TINY_NPU,
                           "-o", str(blocker / "sub"))
    assert_one_line_error(status, out, err, "npu export: cannot create output directory ",
                          str(blocker / "sub"))


# --- commands not built yet ---------------------------------------------------------------------

# Commands still waiting for their issue (remove an entry when its command is built).
GOOD_ARGS = {
    "plan": ["--npu", TINY_NPU, "--model", TINY_MODEL, "--chips", "2"],
}


@pytest.mark.parametrize("command", sorted(GOOD_ARGS))
def test_not_built_commands_say_so(capsys, command):
    args = build_parser().parse_args([command, *GOOD_ARGS[command]])
    assert getattr(args.run, "not_built", False), f"npu {command} is built: drop it here"
    assert_one_line_error(*run(capsys, command, *GOOD_ARGS[command]),
                          f"npu {command}: not built yet (")


# --- the real process ---------------------------------------------------------------------------

def _npu(*argv):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "sim", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_process_help():
    result = _npu("--help")
    assert result.returncode == 0 and result.stderr == ""
    for command in COMMANDS:
        assert command in result.stdout


@pytest.mark.parametrize("argv, fragment", [
    (["sim", "--npu", "no/such/npu.toml", "--model", TINY_MODEL], "no/such/npu.toml"),
    (["sim", "--chips", "0", "--npu", TINY_NPU, "--model", TINY_MODEL], "--chips"),
    (["export", "--top", "nosuch", "--npu", TINY_NPU, "-o", "build/never"], "'nosuch'"),
])
def test_process_exit_status_and_one_line(argv, fragment):
    result = _npu(*argv)
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr
    assert "Traceback" not in result.stderr and fragment in result.stderr, result.stderr
