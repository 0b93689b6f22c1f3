"""``npu sweep`` (sim.cli.sweep): bad specs and options are one line and exit 2; a sweep prints
its summary and writes its files."""

import pytest

from tests.helpers import (
    TINY_MODEL,
    TINY_NPU,
    assert_one_line_error,
    run,
    run_process,
    write_spec,
)

GOOD = {"npu": TINY_NPU, "model": TINY_MODEL, "strategy": ["data"], "chips": [1, 2]}


@pytest.mark.parametrize("change, overrides, fragment", [
    ({"chip": 2}, None, "chip=2 is an unknown key"),
    ({"strategy": []}, None, "strategy=[] is an empty list"),
    ({"strategy": "diagonal"}, None, "strategy='diagonal' is not one of"),
    ({"backend": "fpga"}, None, "backend='fpga' is not one of plan, iss, pysim, verilator"),
    ({}, {"link_speed": 8}, "npu_overrides.link_speed=8 is not an NPU-config key"),
    ({}, {"link_latency_cycles": [2, 0]},
     "npu_overrides.link_latency_cycles=0 is below the minimum 1"),
    ({"model": "constraints/models/nosuch.toml"}, None, "file not found"),
])
def test_bad_specs_exit_2_in_one_line(tmp_path, capsys, change, overrides, fragment):
    path = write_spec(tmp_path / "bad.toml", {**GOOD, **change}, overrides)
    status, out, err = run(capsys, "sweep", path, "--workers", "0", "--out",
                           str(tmp_path / "out"))
    assert_one_line_error(status, out, err, "npu sweep: ", fragment, "bad.toml")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["no/such/spec.toml"], "no/such/spec.toml: file not found"),
    (["SPEC", "--workers", "-1"], "argument --workers: -1 must be at least 0"),
    (["SPEC", "--workers", "2", "--scheduler", "tcp://127.0.0.1:1"],
     "argument --scheduler: not allowed with argument --workers"),
])
def test_bad_options_exit_2_in_one_line(tmp_path, capsys, argv, fragment):
    spec = write_spec(tmp_path / "s.toml", GOOD)
    argv = [spec if a == "SPEC" else a for a in argv]
    assert_one_line_error(*run(capsys, "sweep", *argv), fragment)


def test_a_process_refuses_a_bad_spec_without_a_traceback(tmp_path):
    path = write_spec(tmp_path / "bad.toml", {**GOOD, "chips": [0]})
    result = run_process("sweep", path, "--workers", "0")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "chips=0 must be at least 1" in result.stderr


def test_a_sweep_prints_its_summary_and_writes_its_files(tmp_path, capsys):
    path = write_spec(tmp_path / "s.toml", GOOD)
    status, out, err = run(capsys, "sweep", path, "--workers", "0", "--out",
                           str(tmp_path / "out"))
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith(f"npu sweep: 2 points: 2 computed in this process, 0 already "
                               f"in {tmp_path / 'out'}, ")
    assert lines[0].endswith(" points/s")
    assert lines[1] == "  1 ok, 0 mismatch, 1 invalid, 0 failed"
    for name in ("results.parquet", "results.csv", "summary.json", "latency_vs_chips.png",
                 "sram_vs_chips.png", "pareto_latency_sram.png"):
        assert name in lines[-1] and (tmp_path / "out" / name).exists()
    status, out, _ = run(capsys, "sweep", path, "--workers", "0", "--out",
                         str(tmp_path / "out"))
    assert status == 0 and "0 computed (nothing new), 2 already in" in out


def test_an_output_that_cannot_be_a_directory_is_refused_first(tmp_path, capsys):
    path = write_spec(tmp_path / "s.toml", GOOD)
    (tmp_path / "file").write_text("")
    assert_one_line_error(*run(capsys, "sweep", path, "--workers", "0", "--out",
                               str(tmp_path / "file")),
                          f"--out {tmp_path / 'file'}: cannot create the directory")
