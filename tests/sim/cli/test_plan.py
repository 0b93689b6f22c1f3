"""``npu plan`` (sim.cli.plan): the table, the JSON report, the Llama-2-7B plan, bad input."""

import json

import pytest

from hw.spec import PRESETS_DIR
from sim.cli.main import build_parser
from tests.helpers import TINY_MODEL, TINY_NPU, assert_one_line_error, run, run_process

LPU = str(PRESETS_DIR / "npu" / "lpu-like.toml")
LLAMA = str(PRESETS_DIR / "models" / "llama2-7b.toml")


def test_plan_is_built():
    args = build_parser().parse_args(["plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                                      "--chips", "2"])
    assert not getattr(args.run, "not_built", False)


def test_table_and_json(capsys, tmp_path):
    out_json = tmp_path / "plan.json"
    status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                           "--chips", "2", "--strategy", "head", "--json", str(out_json))
    assert status == 0, err
    assert out.startswith("npu plan: tiny on tiny") and "cycle model" in out
    data = json.loads(out_json.read_text())
    assert data["npu"] == "tiny" and data["model"] == "tiny"
    (entry,) = data["strategies"]
    assert entry["strategy"] == "head" and entry["chips"] == 2 and entry["fits"] is True
    assert entry["reasons"] == [] and len(entry["per_chip"]) == 2
    assert entry["predicted_cycles"] > 0 and entry["latency_ms"] > 0
    assert entry["collectives_per_layer"] == 4 and entry["min_chips"] == 1


def test_min_chips_all_strategies_names_what_does_not_fit(capsys):
    status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                           "--min-chips")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[2].startswith("*")
    assert "data on 1" not in out or "does not fit" in out


def test_llama_2_7b_on_lpu_like_as_a_process(tmp_path):
    """As a real process: every strategy, the fewest chips, the JSON report."""
    out_json = tmp_path / "llama.json"
    proc = run_process("plan", "--npu", LPU, "--model", LLAMA, "--min-chips", "--strategy",
                       "all", "--json", str(out_json), timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out_json.read_text())
    assert {s["strategy"] for s in data["strategies"]} == {
        "single", "head", "pipeline", "data", "hidden", "sequence", "head+pipeline",
        "data+head", "data+pipeline"}
    single = next(s for s in data["strategies"] if s["strategy"] == "single")
    assert not single["fits"] and any("sram_bytes" in r for r in single["reasons"])
    assert not any("silu" in n or "gated" in n or "rmsnorm" in n for n in single["notes"])


@pytest.mark.parametrize("argv, fragment", [
    (["--npu", TINY_NPU, "--model", TINY_MODEL], "give --chips N, --topology N or XxY, or "
                                                 "--min-chips"),
    (["--npu", TINY_NPU, "--model", TINY_MODEL, "--chips", "8", "--topology", "4x4"],
     "--chips 8 is not the 16 chips of --topology 4x4 (4x4)"),
    (["--npu", TINY_NPU, "--model", TINY_MODEL, "--topology", "4x"],
     "argument --topology: topology '4x' must be N (a ring) or XxY"),
    (["--npu", TINY_NPU, "--model", TINY_MODEL, "--topology", "64x32"],
     "is 2048 chips: a system holds at most 1024"),
    (["--npu", TINY_NPU, "--model", TINY_MODEL, "--topology", "1x4"],
     "a torus needs at least 2 chips along each dimension"),
    (["--npu", TINY_NPU, "--model", TINY_MODEL, "--chips", "0"], "0 must be at least 1"),
    (["--npu", TINY_NPU, "--model", TINY_MODEL, "--chips", "2", "--strategy", "tensor"],
     "invalid choice: 'tensor'"),
    (["--npu", "missing.toml", "--model", TINY_MODEL, "--chips", "1"], "--npu"),
])
def test_bad_input_is_one_line(capsys, argv, fragment):
    assert_one_line_error(*run(capsys, "plan", *argv), fragment)
