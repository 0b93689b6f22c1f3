"""``npu sim --strategy single`` (sim.cli.simulate): whole models on the ISS and RTL, rejections."""

import json
from pathlib import Path

import numpy as np
import pytest

from sim.cli.main import build_parser
from sim.golden.float_model import random_weights
from sim.strategies import NAMES
from tests.helpers import TINY_MODEL, TINY_NPU, run, run_process, write_model


def test_iss_runs_the_tiny_model_bit_exact(capsys, tmp_path):
    report = tmp_path / "r.json"
    out_npy = tmp_path / "y.npy"
    status, out, err = run(capsys, "sim", "--strategy", "single", "--npu", TINY_NPU,
                           "--model", TINY_MODEL, "--backend", "iss", "--json", str(report),
                           "--output", str(out_npy), "--seed", "3")
    assert status == 0, err
    r = json.loads(report.read_text())
    assert r["golden_match"] is True
    assert r["float_error"]["cosine"] >= 0.99
    assert r["strategy"] == "single" and r["chips"] == 1 and r["backend"] == "iss"
    y = np.load(out_npy)
    assert y.dtype == np.float32 and y.shape == (8, 32)


def test_quant_option_and_model_key(capsys, tmp_path):
    """``--quant smooth16`` overrides the model file's scheme; ``quant = "smooth16"`` in the
    file selects it; the report names the scheme it ran."""
    report = tmp_path / "r.json"
    for argv, want in (([], "int8"), (["--quant", "smooth16"], "smooth16")):
        status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", TINY_MODEL,
                               "--backend", "iss", "--json", str(report), *argv)
        assert status == 0, err
        r = json.loads(report.read_text())
        assert r["quant"] == want and r["golden_match"] and r["float_error"]["cosine"] > 0.99
        assert f"vs float64 ({want}): cosine" in out
    model = write_model(tmp_path, norm="post", causal=False, quant="smooth16")
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", model, "--backend",
                           "iss", "--json", str(report))
    assert status == 0, err
    assert json.loads(report.read_text())["quant"] == "smooth16"
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", model, "--backend",
                           "iss", "--json", str(report), "--quant", "int8")
    assert status == 0 and json.loads(report.read_text())["quant"] == "int8"


@pytest.mark.parametrize("norm, causal, backend", [
    ("pre", True, "pysim"),
    pytest.param("post", False, "verilator", marks=pytest.mark.verilator),
    pytest.param("post", False, "pysim", marks=pytest.mark.slow)])
def test_rtl_equals_golden_small_model(capsys, tmp_path, norm, causal, backend, request):
    """`npu sim` on the RTL (Verilator: the build the other Verilator tests share)."""
    if backend == "verilator":
        request.getfixturevalue("verilator_ok")
    model = write_model(tmp_path, norm=norm, causal=causal)
    report = tmp_path / "r.json"
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", model, "--backend",
                           backend, "--json", str(report), "--seed", "1")
    assert status == 0, out + err
    r = json.loads(report.read_text())
    assert r["golden_match"] and r["cycles"] > 0 and r["load_cycles"] > 0
    busy = r["per_chip"][0]["busy"]
    assert busy["matmul"] > 0 and busy["attention"] > 0 and busy["vector"] > 0


@pytest.mark.parametrize("norm_kind, ffn", [("layernorm", "mlp"), ("rmsnorm", "mlp"),
                                           ("rmsnorm", "gated")])
def test_weights_and_input_files(capsys, tmp_path, norm_kind, ffn):
    """A weights file of the model's tensors (an RMSNorm model's has no ln*.bias, a gated
    FFN's has the gate ffn.wg)."""
    model = write_model(tmp_path, n_layers=2, norm_kind=norm_kind, ffn=ffn,
                        activation="silu" if ffn == "gated" else "gelu")
    from hw.spec import load_model
    cfg = load_model(model)
    w = random_weights(cfg, 11)
    np.savez(tmp_path / "w.npz", **{k: v.astype(np.float32) for k, v in w.items()})
    x = np.random.default_rng(2).standard_normal((5, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", model, "--backend",
                           "iss", "--weights", str(tmp_path / "w.npz"), "--input",
                           str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"))
    assert status == 0, err
    assert np.load(tmp_path / "y.npy").shape == (5, 16)
    assert ("layers.0.ln1.bias" in w) == (norm_kind == "layernorm")
    assert ("layers.1.ffn.wg" in w) == (ffn == "gated")
    if ffn == "gated":
        # The gate is required: a file without it is bad input.
        np.savez(tmp_path / "w.npz", **{k: v for k, v in w.items() if ".wg" not in k})
        status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", model,
                               "--backend", "iss", "--weights", str(tmp_path / "w.npz"))
        assert status == 2 and "layers.0.ffn.wg missing" in err, err


@pytest.mark.parametrize("over, needle", [
    ({"ffn": "gated", "activation": "silu", "quant": "smooth16"},
     "ffn='gated' is not supported with quant=\"smooth16\""),
    ({"d_model": 64, "n_heads": 2, "d_head": 32}, "d_head=32 exceeds datapath width "
                                                  "d_head_max=16"),
    ({"seq_len": 40}, "seq_len=40 does not fit attn_window=16: causal attention over 40 "
                      "tokens with window 0"),
    ({"seq_len": 40, "window": 9, "causal": False}, "window=9 does not fit attn_window=16"),
    ({"seq_len": 80}, "seq_len=80 exceeds max_seq_len=64"),
    ({"d_model": 96, "n_heads": 12, "d_head": 8}, "d_model=96 exceeds d_model_max=64"),
    ({"d_ff": 65536, "quant": "smooth16"}, "d_ff=65536 exceeds 65535 for quant=\"smooth16\": "
                                           "the FFN2 lo pass's int32 sum"),
])
def test_incompatible_models_exit_2_one_line(capsys, tmp_path, over, needle):
    model = write_model(tmp_path, **over)
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", model,
                           "--backend", "iss")
    assert status == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err


def test_windowed_sequence_longer_than_the_buffer(capsys, tmp_path):
    """A causal window narrower than the K/V ring over a sequence longer than the ring: the
    interleaved attention schedule, bit-exact on the ISS."""
    model = write_model(tmp_path, seq_len=24, window=5)
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", model, "--backend",
                           "iss", "--json", str(tmp_path / "r.json"))
    assert status == 0, err
    assert json.loads((tmp_path / "r.json").read_text())["golden_match"]


def test_capacity_refusal_names_sram(capsys, tmp_path):
    npu = tmp_path / "small.toml"
    text = Path(TINY_NPU).read_text().replace("sram_bytes = 65536", "sram_bytes = 4096")
    npu.write_text(text)
    status, out, err = run(capsys, "sim", "--npu", str(npu), "--model", TINY_MODEL,
                           "--backend", "iss")
    assert status == 2
    assert "sram_bytes=4096 is too small" in err and "weights" in err, err


def test_bad_input_file(capsys, tmp_path):
    model = write_model(tmp_path)
    np.save(tmp_path / "x.npy", np.zeros((6, 15), np.float32))
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", model, "--input",
                           str(tmp_path / "x.npy"), "--backend", "iss")
    assert status == 2 and "shape [6, 15]" in err and len(err.strip().splitlines()) == 1


def test_watchdog_exit_3(tmp_path):
    model = write_model(tmp_path)
    proc = run_process("sim", "--npu", TINY_NPU, "--model", model, "--backend", "pysim",
                       "--max-cycles", "50", timeout=600)
    assert proc.returncode == 3, proc.stderr
    assert "max_cycles=50" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("extra, needle", [
    (["--microbatches", "4"], "--microbatches applies to strategies with a pipeline"),
    (["--link-stalls", "0.1"], "--link-stalls applies to --backend pysim with --chips > 1"),
    (["--link-stalls", "1.5"], "argument --link-stalls: 1.5 is outside [0, 1)"),
    (["--strategy", "single", "--chips", "2", "--backend", "iss"],
     "--strategy single runs on one chip, not --chips 2"),
    (["--vcd", "w.vcd", "--backend", "iss"], "--vcd needs --backend pysim, not iss"),
])
def test_options_that_do_not_apply_are_refused(capsys, extra, needle):
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", TINY_MODEL, *extra)
    assert status == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_iss_writes_the_timeline_and_the_trace(capsys, tmp_path):
    """The ISS is timed by its cycle model, so --plot and --trace apply to it as to the RTL."""
    png, trace = tmp_path / "t.png", tmp_path / "t.json"
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", TINY_MODEL, "--strategy",
                           "head", "--chips", "2", "--backend", "iss", "--plot", str(png),
                           "--trace", str(trace))
    assert status == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}


def test_the_strategy_choices_are_the_registry():
    sim_parser = build_parser()._subparsers._group_actions[0].choices["sim"]
    choices = next(a.choices for a in sim_parser._actions if a.dest == "strategy")
    assert tuple(choices) == NAMES



@pytest.mark.parametrize("argv, needle", [
    (["--strategy", "head+pipeline", "--chips", "4"], "--strategy head+pipeline needs --grid AxB"),
    (["--strategy", "head+pipeline", "--chips", "4", "--grid", "2x3"],
     "--grid 2x3 is 6 chips, not --chips 4"),
    (["--strategy", "data+head", "--chips", "4", "--grid", "2by2"],
     "--grid '2by2' is not AxB with each side >= 1"),
    (["--strategy", "head", "--chips", "4", "--grid", "2x2"],
     "--grid applies to head+pipeline, data+head, data+pipeline, data+pipeline+head, not "
     "--strategy head"),
    (["--strategy", "hidden", "--chips", "4", "--grid", "2x2"],
     "--grid applies to head+pipeline, data+head, data+pipeline, data+pipeline+head, not "
     "--strategy hidden"),
    (["--strategy", "hidden", "--chips", "2", "--microbatches", "2"],
     "--microbatches applies to strategies with a pipeline"),
])
def test_grids_are_checked(capsys, argv, needle):
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", TINY_MODEL, "--backend",
                           "iss", *argv)
    assert status == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_a_grid_gives_the_chip_count(capsys, tmp_path):
    """Without --chips, --grid AxB runs on A x B chips (and --chips, if given, must agree)."""
    out_json = tmp_path / "r.json"
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", TINY_MODEL, "--backend",
                           "iss", "--strategy", "data+head", "--grid", "2x3", "--batch", "2",
                           "--json", str(out_json))
    assert status == 0, err
    report = json.loads(out_json.read_text())
    assert report["chips"] == 6 and report["golden_match"], report["chips"]


def test_data_parallelism_refuses_a_model_one_chip_cannot_hold(capsys, tmp_path):
    model = write_model(tmp_path, n_layers=8, d_model=32, n_heads=8, d_head=4, d_ff=32,
                        seq_len=4)
    status, out, err = run(capsys, "sim", "--strategy", "data", "--chips", "2", "--npu", TINY_NPU,
                           "--model", model, "--backend", "iss", "--batch", "4")
    assert status == 2, err
    assert "sram_bytes=65536 is too small: the model needs 66," in err and "weights 64,000" in err
