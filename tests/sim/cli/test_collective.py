"""``npu collective`` (sim.cli.collective): results, report, output files, exit statuses."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from sim import golden
from sim.cli import main
from sim.errors import EXIT_BAD_INPUT, EXIT_MISMATCH, EXIT_OK
from sim.golden import collectives as golden_collectives
from tests.helpers import TINY_NPU, run


def _run(capsys, *args):
    return run(capsys, "collective", "--npu", TINY_NPU, *args)


def test_all_reduce_random_input_writes_report_and_output(tmp_path, capsys):
    out, report = tmp_path / "y.npy", tmp_path / "r.json"
    code, stdout, _ = _run(capsys, "--kind", "all_reduce", "--op", "sum", "--chips", "3",
                           "--seed", "5", "--output", str(out), "--json", str(report))
    assert code == EXIT_OK, stdout
    data = json.loads(report.read_text())
    assert data["golden_match"] is True
    assert data["chips"] == 3 and data["cycles"] > 0 and data["bytes"] == 4 * data["length"]
    assert data["bound_cycles"] == 2 * 2 * (-(-data["bytes"] // 12) + 2)
    assert data["ratio"] == pytest.approx(data["cycles"] / data["bound_cycles"])
    assert data["model_cycles"] == data["cycles"]
    y = np.load(out)
    assert y.shape == (3, data["length"]) and y.dtype == np.int32
    assert (y == y[0]).all(), "every chip holds the same all-reduce result"


def test_input_file_with_wrapping_group_and_width_64(tmp_path, capsys, rng):
    x = rng.integers(-2**62, 2**62, size=(5, 7), dtype=np.int64)
    src, out = tmp_path / "x.npy", tmp_path / "y"
    np.save(src, x)
    code, stdout, _ = _run(capsys, "--kind", "reduce_scatter", "--op", "max", "--chips", "5",
                           "--width", "64", "--group", "3:3", "--input", str(src),
                           "--output", str(out))
    assert code == EXIT_OK, stdout
    # Blocks of 3, 2, 2 for chips 3, 4, 0; chips 1, 2 are outside the group: an .npz.
    with np.load(tmp_path / "y.npz") as npz:
        got = {k: npz[k] for k in npz.files}
    total = x[[3, 4, 0]].max(axis=0)
    assert got["chip3"].tolist() == total[:3].tolist()
    assert got["chip4"].tolist() == total[3:5].tolist()
    assert got["chip0"].tolist() == total[5:].tolist()
    assert got["chip1"].size == 0 and got["chip2"].size == 0


def test_all_gather_concatenates_rows(tmp_path, capsys, rng):
    x = rng.integers(-100, 100, size=(3, 4), dtype=np.int32)
    src, out = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(src, x)
    code, stdout, _ = _run(capsys, "--kind", "all_gather", "--chips", "3", "--input", str(src),
                           "--output", str(out))
    assert code == EXIT_OK, stdout
    y = np.load(out)
    for chip in range(3):
        assert y[chip].tolist() == x.reshape(-1).tolist(), f"chip {chip}"


def test_mismatch_exits_1(monkeypatch, capsys):
    real = golden_collectives.collective

    def wrong(req, inputs):
        result = real(req, inputs)
        result[1] = result[1] + 1
        return result

    monkeypatch.setattr(golden.collectives, "collective", wrong)
    code, stdout, _ = _run(capsys, "--kind", "all_reduce", "--chips", "2")
    assert code == EXIT_MISMATCH
    assert "MISMATCH" in stdout and "chip 1 element 0" in stdout


def _bad(tmp_path, name, array):
    path = tmp_path / name
    if isinstance(array, dict):
        np.savez(path, **array)
    else:
        np.save(path, array)
    return str(path)


@pytest.mark.parametrize("make_args, message", [
    (lambda t: ["--chips", "2", "--input", _bad(t, "z.npy", np.zeros((2, 0), np.int32))],
     r"has zero length"),
    (lambda t: ["--chips", "4", "--group", "4:2"], r"group first=4 is outside the ring of 4"),
    (lambda t: ["--chips", "4", "--group", "1:5"], r"group count=5 must be 1\.\.4"),
    (lambda t: ["--chips", "4", "--group", "1-2"], r"--group '1-2' is not FIRST:COUNT"),
    (lambda t: ["--chips", "3", "--input", _bad(t, "s.npy", np.zeros((2, 4), np.int32))],
     r"has shape \(2, 4\); expected \[3, length\]"),
    (lambda t: ["--chips", "2", "--input", _bad(t, "v.npy", np.zeros(4, np.int32))],
     r"has shape \(4,\); expected \[2, length\]"),
    (lambda t: ["--chips", "2", "--input", _bad(t, "f.npy", np.zeros((2, 3), np.float32))],
     r"has dtype float32; expected an integer array"),
    (lambda t: ["--chips", "2", "--input", _bad(t, "big.npy", np.full((2, 3), 2**40))],
     r"values outside int32 .* --width 64"),
    (lambda t: ["--chips", "2", "--input", _bad(t, "m.npz", {
        "chip0": np.zeros(3, np.int32), "chip1": np.zeros(4, np.int32)})],
     r"length mismatch between chips: chip0 has 3 elements, chip1 has 4"),
    (lambda t: ["--chips", "2", "--input", str(t / "missing.npy")], r"cannot read --input"),
    (lambda t: ["--chips", "1025"], r"chips must be 1\.\.1024, not 1025"),
    (lambda t: ["--topology", "4x4", "--group", "0:2"], r"--group is a ring's; a torus's group"),
    (lambda t: ["--chips", "4", "--rect", "0,0,2x2"], r"--rect is a torus's"),
    (lambda t: ["--topology", "4x4", "--rect", "3,0,2x2"], r"--rect rectangle 2x2 at \(3, 0\) "
     r"leaves the 4x4 \(x0 \+ w <= 4"),
    (lambda t: ["--topology", "4x4", "--rect", "a,b"], r"--rect 'a,b' is not X0,Y0,WxH"),
])
def test_bad_arguments_exit_2_with_one_line(make_args, message, tmp_path, capsys):
    code, _, err = _run(capsys, "--kind", "all_reduce", *make_args(tmp_path))
    assert code == EXIT_BAD_INPUT
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert re.search(message, lines[0]), lines[0]


def test_npz_input_with_equal_lengths_is_accepted(tmp_path, capsys):
    path = _bad(tmp_path, "ok.npz", {"chip0": np.arange(3, dtype=np.int32),
                                     "chip1": np.arange(3, dtype=np.int32)})
    code, stdout, _ = _run(capsys, "--kind", "all_reduce", "--op", "min", "--chips", "2",
                           "--input", path)
    assert code == EXIT_OK, stdout


def test_bad_link_width_exits_2(tmp_path, capsys):
    toml = tmp_path / "odd.toml"
    toml.write_text(Path(TINY_NPU).read_text().replace(
        "link_bytes_per_cycle = 4", "link_bytes_per_cycle = 3"))
    code = main(["collective", "--npu", str(toml), "--kind", "all_reduce", "--chips", "2"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    assert err.count("\n") == 1
    assert "link_bytes_per_cycle=3 is not a power of two: a ring word is whole link flits" in err


def test_watchdog_exits_3(capsys):
    code, _, err = _run(capsys, "--kind", "all_reduce", "--chips", "4", "--max-cycles", "5")
    assert code == 3
    assert err.strip() == "npu collective: simulation did not finish within max_cycles=5"


@pytest.mark.parametrize("args, what", [
    (["--topology", "3x3", "--kind", "reduce_scatter", "--op", "avg", "--width", "64"],
     "reduce_scatter avg int64 on 9 of the 3x3 torus (columns_rows) of 9 chips"),
    (["--topology", "4x4", "--rect", "1,0,2x3", "--kind", "all_gather"],
     "all_gather sum int32 on 6 of the 4x4 torus (rows_columns) of 16 chips"),
    (["--chips", "6", "--backend", "iss", "--kind", "all_reduce", "--op", "max"],
     "all_reduce max int32 on 6 of 6 chips"),
])
def test_a_torus_runs_its_2d_collective_on_the_chips(args, what, capsys, tmp_path):
    """npu collective --topology XxY: the 2-D collective's programs on the ISS (timed by the
    cycle model), MPI order checked; a ring's on its chips with --backend iss."""
    out_json = tmp_path / "r.json"
    code, out, err = _run(capsys, *args, "--json", str(out_json))
    assert code == EXIT_OK, err
    assert what in out and "golden match" in out, out
    report = json.loads(out_json.read_text())
    assert report["golden_match"] and report["backend"] == "iss" and report["cycles"] > 0
    assert report["cycles"] == report["model_cycles"]
