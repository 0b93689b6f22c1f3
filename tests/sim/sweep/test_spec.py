"""The sweep spec (sim.sweep.spec): its points, and one line for every bad spec."""

from pathlib import Path

import pytest

from hw.spec import npu_preset
from sim.errors import BadInput
from sim.sweep import load_spec, parse_spec, runner
from tests.helpers import TINY_MODEL, TINY_NPU, write_spec

EXAMPLE = {"npu": [TINY_NPU], "model": [TINY_MODEL], "strategy": ["head", "pipeline", "data"],
           "chips": [1, 2, 4], "backend": "iss"}


def test_lists_are_crossed_with_the_overrides(tmp_path):
    spec = load_spec(write_spec(tmp_path / "s.toml", EXAMPLE, {"link_bytes_per_cycle": [4, 8]}))
    points = spec.points()
    assert len(points) == 3 * 3 * 2
    seen = {(p.params["strategy"], p.params["chips"], p.params["link_bytes_per_cycle"])
            for p in points}
    assert len(seen) == 18
    for p in points:
        assert p.npu.link_bytes_per_cycle == p.params["link_bytes_per_cycle"]
        assert p.params["backend"] == "iss" and p.params["seed"] == 0
        assert p.params["batch"] is None and p.params["grid"] is None
    assert len({p.key for p in points}) == 18


def test_defaults_presets_and_batch(tmp_path):
    spec = parse_spec({"npu": "tiny", "model": "tiny", "strategy": "single", "chips": 1,
                       "batch": [1, 3]}, tmp_path / "s.toml")
    a, b = spec.points()
    assert a.npu == npu_preset("tiny") and a.params["npu"] == "tiny"
    assert (a.model.batch, b.model.batch) == (1, 3)
    assert spec.backend == ("iss",) and spec.seed == (0,)


def test_files_are_found_beside_the_spec(tmp_path, monkeypatch):
    (tmp_path / "hw.toml").write_text(Path(TINY_NPU).read_text())
    spec_path = write_spec(tmp_path / "s.toml", {**EXAMPLE, "npu": "hw.toml"})
    monkeypatch.chdir("/")
    (point, *_) = load_spec(spec_path).points()
    assert point.npu.sram_bytes == npu_preset("tiny").sram_bytes


def test_2d_strategies_run_on_every_grid_of_their_chips(tmp_path):
    spec = parse_spec({**EXAMPLE, "strategy": "head+pipeline", "chips": [2, 4, 8]}, "s.toml")
    assert [(p.params["chips"], p.params["grid"]) for p in spec.points()] == [
        (2, None), (4, "2x2"), (8, "2x4"), (8, "4x2")]
    spec = parse_spec({**EXAMPLE, "strategy": ["head", "data+head"], "chips": 8,
                       "grid": ["4x2", "2x2"]}, "s.toml")
    assert [(p.params["strategy"], p.params["grid"]) for p in spec.points()] == [
        ("head", None), ("data+head", "4x2")]


@pytest.mark.parametrize("change, overrides, fragments", [
    ({"chip": [1]}, None, ["chip=[1] is an unknown key; known keys are npu, model"]),
    ({"chips": []}, None, ["chips=[] is an empty list"]),
    ({"strategy": ["head", "sideways"]}, None, ["strategy='sideways' is not one of single"]),
    ({"backend": "spice"}, None, ["backend='spice' is not one of plan, iss, pysim, verilator"]),
    ({"chips": [1, 0]}, None, ["chips=0 must be at least 1"]),
    ({"chips": ["2"]}, None, ["chips='2' has type str, expected int"]),
    ({"chips": [True]}, None, ["chips=True has type bool, expected int"]),
    ({"chips": [2, 2]}, None, ["chips=[2, 2] repeats a value"]),
    ({"grid": "2by2"}, None, ["grid='2by2' is not AxB"]),
    ({"npu": "no/such/npu.toml"}, None, ["npu='no/such/npu.toml' in", "file not found",
                                         "(no/such/npu.toml)"]),
    ({"model": "nosuch"}, None, ["model='nosuch' in", "file not found"]),
    ({}, {"link_width": [4]}, ["npu_overrides.link_width=[4] is not an NPU-config key"]),
    ({}, {"link_bytes_per_cycle": []}, ["npu_overrides.link_bytes_per_cycle=[] is an empty"]),
    # The NPU config's own messages, naming the override and the file it was applied to.
    ({}, {"link_bytes_per_cycle": [4, 0]},
     ["npu_overrides.link_bytes_per_cycle=0 is below the minimum 1 (applied to"]),
    ({}, {"sram_bytes": [65536, 1000]},
     ["npu_overrides.sram_bytes=1000 is not a multiple of sram_banks * array_size"]),
    ({}, {"clock_mhz": ["fast"]}, ["npu_overrides.clock_mhz='fast' has type str"]),
    # An override that breaks another key's limit names both.
    ({}, {"attn_window": [32]},
     ["npu_overrides attn_window=32 on", "softmax_len=16 is shorter than attn_window 32"]),
])
def test_bad_specs_are_refused_in_one_line(tmp_path, change, overrides, fragments):
    path = write_spec(tmp_path / "s.toml", {**EXAMPLE, **change}, overrides)
    with pytest.raises(BadInput) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_missing_required_key_and_bad_files(tmp_path):
    with pytest.raises(BadInput, match=r"missing required key 'chips' \("):
        parse_spec({k: v for k, v in EXAMPLE.items() if k != "chips"}, "s.toml")
    with pytest.raises(BadInput, match=r"nosuch.toml: file not found"):
        load_spec(tmp_path / "nosuch.toml")
    (tmp_path / "bad.toml").write_text("chips = [1,\n")
    with pytest.raises(BadInput, match=r"bad.toml: bad TOML"):
        load_spec(tmp_path / "bad.toml")
    with pytest.raises(BadInput, match=r"npu_overrides=3 is not a table"):
        parse_spec({**EXAMPLE, "npu_overrides": 3}, "s.toml")


def test_plan_backend_needs_the_planner(monkeypatch):
    monkeypatch.setattr(runner, "planner", None)
    with pytest.raises(BadInput, match=r"backend='plan' needs the planner"):
        parse_spec({**EXAMPLE, "backend": ["iss", "plan"]}, "s.toml")
