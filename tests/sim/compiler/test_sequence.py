"""sim.compiler.sequence: sequence parallelism equals the single-chip golden bit for bit.

The broad matrix (1..8 chips, causal and bidirectional windows, full attention, chunks shorter
and longer than the window, uneven chunks, one chip in passes) runs on the ISS; the RTL runs 4
chips on Verilator (the build every Verilator test shares), and 3 and 4 chips on pysim in the
slow suite.
"""

import dataclasses
import json

import numpy as np
import pytest

from hw.spec import ConfigError, ModelConfig, npu_preset
from sim.compiler.sequence import key_span, plan_transfers, split_tokens
from sim.flows.simulate import simulate
from sim.report.chrome_trace import trace_events
from tests.helpers import TINY_NPU, check_report, one_each, run, write_model

TINY = npu_preset("tiny")
#: Ten tokens: uneven on 3, 4, 6, 7 and 8 chips.
SEQ10 = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_ff=32, seq_len=10,
                    window=3, name="seq10")
#: A ring of 8 keys and passes of at most 8 tokens.
SHORT = dataclasses.replace(TINY, max_seq_len=8, attn_window=8, softmax_len=8, name="short")


def model(**kw):
    return dataclasses.replace(SEQ10, **kw)


def test_split_tokens_is_array_split():
    assert split_tokens(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_tokens(10, 8)[-1] == (9, 10)
    assert key_span((4, 7), 10, 3, True) == (2, 7)
    assert key_span((4, 7), 10, 3, False) == (2, 9)
    assert key_span((4, 7), 10, 0, True) == (0, 7)
    assert key_span((4, 7), 10, 0, False) == (0, 10)


@pytest.mark.parametrize("window, causal", [(3, True), (5, True), (5, False), (0, True),
                                            (0, False)])
@pytest.mark.parametrize("chips", [2, 3, 5, 8])
def test_transfers_bring_each_chip_exactly_its_keys(window, causal, chips):
    chunks = split_tokens(10, chips)
    phases = plan_transfers(chunks, 10, window, causal)
    got = [set(range(*c)) for c in chunks]
    for phase in phases:
        for c in range(chips):
            assert sum(t.src == c for t in phase) <= 1 and sum(t.dst == c for t in phase) <= 1
        for t in phase:
            held = got[t.src]
            assert set(range(t.start, t.stop)) <= held, f"{t} sends rows it does not hold"
            assert not set(range(t.start, t.stop)) & got[t.dst], f"{t} sends held rows"
        for t in phase:
            got[t.dst] |= set(range(t.start, t.stop))
    for c, chunk in enumerate(chunks):
        assert got[c] == set(range(*key_span(chunk, 10, window, causal))), c


# Every chip count with one of the masks in turn; the whole product in the slow suite.
@pytest.mark.parametrize("chips, window, causal", one_each(
    list(range(1, 9)), [(3, True), (3, False), (0, True), (0, False)]))
def test_on_the_iss(chips, window, causal):
    r = simulate(TINY, model(window=window, causal=causal), strategy="sequence", chips=chips,
                 backend="iss", seed=chips)
    check_report(r, f"sequence on {chips} chips, window {window}, causal {causal}")
    q = r.sequence
    assert q["chunk_tokens"] == [len(a) for a in np.array_split(np.arange(10), chips)]
    assert (q["halo_bytes"] > 0) == (chips > 1)
    assert len(r.collectives) == q["transfers_per_layer"] * SEQ10.n_layers


@pytest.mark.parametrize("chips, window", [(8, 5), (8, 8), (5, 6), (2, 3), (3, 2)])
def test_chunks_shorter_and_longer_than_the_window(chips, window):
    """8 chips of 1-2 tokens with a window of 5: halos from up to four preceding chips."""
    for causal in (True, False):
        if not causal and 2 * window - 1 > TINY.attn_window:
            continue
        cfg = model(window=window, causal=causal)
        r = simulate(TINY, cfg, strategy="sequence", chips=chips, backend="iss", seed=window)
        check_report(r, f"{chips} chips, window {window}, causal {causal}")
        chunks = split_tokens(10, chips)
        lo, hi = key_span(chunks[-1], 10, window, causal)
        want = {c for c, (a, b) in enumerate(chunks[:-1]) if b > lo}
        assert {c["from"] for c in r.collectives if c["to"] == chips - 1} == want


@pytest.mark.parametrize("norm, batch", [("post", 1), ("pre", 3), ("post", 2)])
def test_post_norm_and_batches(norm, batch):
    for window, causal in ((4, True), (0, False)):
        r = simulate(TINY, model(norm=norm, window=window, causal=causal), strategy="sequence",
                     chips=3, backend="iss", batch=batch, seed=batch)
        check_report(r, f"{norm}-norm, batch {batch}, window {window}")
        assert r.samples == batch


def test_interleaved_keys_beyond_the_ring():
    """23 tokens on 2 chips: chunks of 12 and 11 plus halos exceed the ring of 8 keys, so the
    interleaved schedule with HALO runs (causal and bidirectional)."""
    for causal, window in ((True, 8), (False, 4)):
        cfg = model(seq_len=23, window=window, causal=causal)
        r = simulate(dataclasses.replace(SHORT, max_seq_len=16), cfg, strategy="sequence",
                     chips=2, backend="iss")
        check_report(r, f"23 tokens on 2 chips, window {window}, causal {causal}")


@pytest.mark.parametrize("seq, window, batch", [(30, 5, 1), (20, 8, 1), (17, 3, 2), (9, 8, 1),
                                                (40, 2, 1)])
def test_one_chip_in_passes(seq, window, batch):
    """A sequence longer than max_seq_len on one chip: passes of at most 8 tokens, the last
    window - 1 K/V rows of every layer carried (also from passes shorter than the window)."""
    cfg = model(seq_len=seq, window=window)
    r = simulate(SHORT, cfg, strategy="sequence", chips=1, backend="iss", batch=batch)
    check_report(r, f"{seq} tokens in passes, window {window}")
    passes = r.sequence["passes"][0]
    assert len(passes) == -(-seq // 8) and max(b - a for a, b in passes) <= 8
    assert r.sequence["mode"] == "passes" and r.per_chip[0].role["passes"] == len(passes)
    with pytest.raises(ConfigError, match=r"seq_len=.* exceeds max_seq_len=8"):
        simulate(SHORT, cfg, strategy="single", backend="iss")


def test_passes_with_post_norm():
    r = simulate(SHORT, model(seq_len=19, window=4, norm="post"), strategy="sequence",
                 chips=1, backend="iss")
    check_report(r, "post-norm in passes")


#: Four query heads of 4 lanes on 2 K/V heads, rotated by RoPE.
LLAMA10 = model(n_heads=4, d_head=4, n_kv_heads=2, rope_theta=10000.0, norm_kind="rmsnorm",
                name="seq10-llama")


@pytest.mark.parametrize("window, causal, chips", one_each(
    [(3, True), (3, False), (0, True), (0, False)], [2, 3, 8]))
def test_rope_and_grouped_query_attention(chips, window, causal):
    """Every chip's tables at its chunk's positions, K rotated before it is sent, K/V rows of
    the K/V heads only (halos, both sides, the ring); grouped-query attention alone too."""
    cfg = dataclasses.replace(LLAMA10, window=window, causal=causal)
    mha = simulate(TINY, dataclasses.replace(cfg, n_kv_heads=4, rope_theta=0.0),
                   strategy="sequence", chips=chips, backend="iss", seed=chips)
    for c in (cfg, dataclasses.replace(cfg, rope_theta=0.0)):
        r = simulate(TINY, c, strategy="sequence", chips=chips, backend="iss", seed=chips)
        check_report(r, f"{c.name} on {chips} chips, window {window}, causal {causal}")
        # The K/V rows are two K/V heads, half the bytes of four.
        assert 2 * sum(e["bytes"] for e in r.collectives) == \
            sum(e["bytes"] for e in mha.collectives)


@pytest.mark.parametrize("seq, window", [(30, 5), (17, 3), (20, 8)])
def test_rope_in_passes(seq, window):
    """One chip in passes: each pass's Q and K rotated at its positions (the tables hold every
    pass's), the halo store carries rotated K rows of the K/V heads."""
    cfg = dataclasses.replace(LLAMA10, seq_len=seq, window=window)
    r = simulate(SHORT, cfg, strategy="sequence", chips=1, backend="iss", batch=2)
    check_report(r, f"RoPE, {seq} tokens in passes, window {window}")
    assert r.sequence["mode"] == "passes"


def test_rope_keys_beyond_the_ring():
    """The interleaved schedule with HALO over rotated keys (23 tokens on 2 chips)."""
    for causal, window in ((True, 8), (False, 4)):
        cfg = dataclasses.replace(LLAMA10, seq_len=23, window=window, causal=causal)
        r = simulate(dataclasses.replace(SHORT, max_seq_len=16), cfg, strategy="sequence",
                     chips=2, backend="iss")
        check_report(r, f"RoPE, 23 tokens on 2 chips, window {window}, causal {causal}")


@pytest.mark.parametrize("npu, cfg, chips, match", [
    (SHORT, model(seq_len=20, window=0), 1,
     r"seq_len=20 exceeds max_seq_len=8: one chip runs longer sequences in passes only for "
     r"causal windowed attention \(full attention .*use at least 3 chips"),
    (SHORT, model(seq_len=20, window=3, causal=False), 1,
     r"in passes only for causal windowed attention \(a bidirectional window"),
    (SHORT, model(seq_len=20, window=3), 2,
     r"max_seq_len=8 is less than a chunk of 10 tokens \(20 tokens on 2 chips\): use at least "
     r"3 chips"),
    (SHORT, model(seq_len=20, window=5, causal=False), 3,
     r"window=5 does not fit attn_window=8: a bidirectional window needs 2 window - 1 <= 8"),
    (TINY, model(seq_len=4, window=3), 5, r"seq_len=4 is less than the 5 chips"),
])
def test_refusals_name_the_limit(npu, cfg, chips, match):
    with pytest.raises(ConfigError, match=match):
        simulate(npu, cfg, strategy="sequence", chips=chips, backend="iss")


def test_full_attention_ring_passes_each_chunk_once_per_link():
    """Causal full attention on 4 chips: chip c forwards chunks c, c-1, ..., 0 to c + 1."""
    r = simulate(TINY, model(window=0), strategy="sequence", chips=4, backend="iss")
    check_report(r, "ring on 4 chips")
    layer0 = [c for c in r.collectives if c["layer"] == 0]
    assert all(c["to"] == c["from"] + 1 for c in layer0)
    assert sorted(c["from"] for c in layer0) == [0, 1, 1, 2, 2, 2]
    assert r.sequence["mode"] == "ring" and r.sequence["phases_per_layer"] == 3


def test_report_json_has_the_sequence_section():
    r = simulate(TINY, model(window=3), strategy="sequence", chips=3, backend="iss")
    data = json.loads(json.dumps(r.to_json()))
    q = data["sequence"]
    assert q["mode"] == "halo" and q["chunks"] == [[0, 4], [4, 7], [7, 10]]
    assert q["key_spans"] == [[0, 4], [2, 7], [5, 10]] and q["halo_tokens"] == [0, 2, 2]
    # Two halo rows of K and V (2 heads x 8 lanes each) per receiving chip and layer.
    assert q["halo_bytes"] == 2 * SEQ10.n_layers * 2 * 2 * 16
    assert q["halo_cycles"] > 0                # the ISS's cycle model times the sends
    assert "sequence (halo)" in r.summary()
    assert data["per_chip"][1]["role"]["tokens"] == [4, 7]


def test_cli_runs_a_long_sequence_on_one_chip(capsys, tmp_path):
    """``npu sim --strategy sequence --chips 1``: 80 tokens on the tiny preset (max_seq_len 64)
    in two passes; without a window it is refused in one line naming the limit."""
    report = tmp_path / "r.json"
    status, out, err = run(capsys, "sim", "--strategy", "sequence", "--chips", "1", "--npu",
                           TINY_NPU, "--model", write_model(tmp_path, seq_len=80, window=4),
                           "--backend", "iss", "--json", str(report))
    assert status == 0, err
    data = json.loads(report.read_text())
    assert data["golden_match"] and data["sequence"]["passes"] == [[[0, 40], [40, 80]]]
    status, out, err = run(capsys, "sim", "--strategy", "sequence", "--chips", "1", "--npu",
                           TINY_NPU, "--model", write_model(tmp_path, "f.toml", seq_len=80),
                           "--backend", "iss")
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "seq_len=80 exceeds max_seq_len=64" in err and "use at least 2 chips" in err, err


@pytest.mark.parametrize("chips, seq, window, causal, backend", [
    pytest.param(4, 10, 3, True, "verilator", marks=pytest.mark.verilator),
    pytest.param(4, 8, 0, False, "verilator", marks=pytest.mark.verilator),
    pytest.param(3, 8, 3, True, "pysim", marks=pytest.mark.slow),
    pytest.param(4, 8, 0, False, "pysim", marks=pytest.mark.slow)])
def test_rtl_equals_the_iss(chips, seq, window, causal, backend, request):
    """The RTL: bit-exact, the ISS's outputs and cycles, the K/V sends timed (uneven chunks of
    3 and 2 tokens under a causal window of 3; full attention)."""
    if backend == "verilator":
        request.getfixturevalue("verilator_ok")
    cfg = dataclasses.replace(model(window=window, causal=causal), n_layers=1, seq_len=seq)
    iss = simulate(TINY, cfg, strategy="sequence", chips=chips, backend="iss", seed=3)
    rtl = simulate(TINY, cfg, strategy="sequence", chips=chips, backend=backend, seed=3)
    check_report(rtl, f"sequence on {chips} chips ({backend})")
    assert np.array_equal(rtl.output, iss.output)
    assert rtl.cycles == iss.cycles and rtl.collectives == iss.collectives
    q = rtl.sequence
    assert q["halo_cycles"] > 0 and len(q["halo_exposed_cycles"]) == chips
    assert all("cycles" in c for c in rtl.collectives)
    sends = [e for e in trace_events(rtl)["traceEvents"] if e.get("cat") == "send"]
    assert len(sends) == len(rtl.collectives) and all("K/V" in e["name"] for e in sends)
