"""``npu sim --generate N`` (sim.cli.simulate, sim.flows.generate): the report, the refusals."""

import json

import numpy as np

from tests.helpers import TINY_MODEL, TINY_NPU, assert_one_line_error, run


def test_generate_on_two_chips_writes_the_report(capsys, tmp_path):
    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([5, 200, 31], np.int64))
    report = tmp_path / "g.json"
    status, out, err = run(capsys, "sim", "--npu", TINY_NPU, "--model", TINY_MODEL,
                           "--backend", "iss", "--strategy", "head", "--chips", "2",
                           "--generate", "3", "--prompt-ids", str(ids), "--json", str(report),
                           "--plot", str(tmp_path / "g.png"))
    assert status == 0, err
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bit-exact against the golden incremental decode" in out
    r = json.loads(report.read_text())
    assert r["prompt"] == [[5, 200, 31]] and len(r["ids"][0]) == 3 and r["ids"] == r["golden_ids"]
    assert r["golden_match"] is True and r["chips"] == 2 and len(r["step_cycles"]) == 2
    assert r["ttft_cycles"] < r["cycles"] and len(r["kv_bytes"]) == 2
    assert r["tokens_per_s"] > 0 and "spans" not in r
    assert r["picks"][0] == r["ttft_cycles"] and len(r["picks"]) == 3


def test_generate_refusals(capsys, tmp_path):
    base = ("sim", "--npu", TINY_NPU, "--model", TINY_MODEL, "--backend", "iss")
    for n in ("0", "-1"):
        status, out, err = run(capsys, *base, "--strategy", "head", "--generate", n)
        assert_one_line_error(status, out, err, f"--generate must be at least 1 token, not {n}")
    # The tiny decoder and its head (the table twice) need more than one 64 KiB chip.
    status, out, err = run(capsys, *base, "--generate", "2")
    assert_one_line_error(status, out, err, "sram_bytes=65536 is too small",
                          "kv_cache", "constraints/npu/tiny.toml")
    bad = tmp_path / "bad.npy"
    np.save(bad, np.array([1.5, 2.0]))
    status, out, err = run(capsys, *base, "--strategy", "head", "--generate", "2",
                           "--prompt-ids", str(bad))
    assert_one_line_error(status, out, err, "expected a .npy array of integer token ids")
    np.save(bad, np.array([1, 999]))
    status, out, err = run(capsys, *base, "--strategy", "head", "--generate", "2",
                           "--prompt-ids", str(bad))
    assert_one_line_error(status, out, err, "prompt id 999 at index 1 is outside 0..255")
    status, out, err = run(capsys, *base, "--strategy", "data+pipeline+head", "--generate",
                           "2")
    assert_one_line_error(status, out, err, "--generate runs strategy single, head, "
                                            "pipeline, data, hidden, sequence, head+pipeline, "
                                            "data+head, data+pipeline, not data+pipeline+head")
    # Split-KV decode holds every weight on every chip: the tiny decoder fits no tiny NPU.
    status, out, err = run(capsys, *base, "--strategy", "sequence", "--generate", "2")
    assert_one_line_error(status, out, err, "sram_bytes=65536 is too small")
    status, out, err = run(capsys, *base, "--strategy", "sequence", "--generate", "2",
                           "--order", "zigzag")
    assert_one_line_error(status, out, err, "--order does not apply to --generate")
    status, out, err = run(capsys, *base, "--strategy", "head", "--generate", "9",
                           "--prompt-ids", str(tmp_path / "missing.npy"))
    assert status == 2
