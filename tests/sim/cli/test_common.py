"""What every ``npu`` command shares (sim.cli.common): bad files and arguments, one line, exit 2."""

from pathlib import Path

import pytest

from tests.helpers import TINY_MODEL, TINY_NPU, assert_one_line_error, run


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
    (["sim", "--npu", TINY_NPU, "--model", TINY_MODEL, "--quant", "int4"],
     ["npu sim: argument --quant: invalid choice: 'int4'"]),
    (["sim", "--npu", TINY_NPU, "--model", TINY_MODEL, "--frobnicate"],
     ["npu: unrecognized arguments: --frobnicate"]),
    (["collective", "--kind", "all_reduce", "--chips", "0", "--npu", TINY_NPU],
     ["npu collective: argument --chips: 0 must be at least 1"]),
    (["collective", "--kind", "all_reduce", "--chips", "2", "--npu", TINY_NPU, "--width", "48"],
     ["npu collective: argument --width: invalid choice: 48"]),
    (["plan", "--npu", TINY_NPU, "--model", TINY_MODEL],
     ["npu plan: give --chips N, --topology N or XxY, or --min-chips"]),
    (["export", "--top", "matmul", "--npu", TINY_NPU, "--chips", "0", "-o", "x"],
     ["npu export: argument --chips: 0 must be at least 1"]),
    (["fpga", "--npu", TINY_NPU, "--device", "ice40"],
     ["npu fpga: argument --device: invalid choice: 'ice40'"]),
    (["frobnicate"], ["npu: argument COMMAND: invalid choice: 'frobnicate'"]),
    ([], ["npu: the following arguments are required: COMMAND"]),
])
def test_bad_arguments(capsys, argv, fragments):
    assert_one_line_error(*run(capsys, *argv), *fragments)
