"""Sequence parallelism: speed-up over one chip, the K/V halo's and ring's bytes and cycles.

Every point simulates the compiled programs cycle by cycle and the same model on one chip in
the same run (the reference), with Amaranth's simulator (the Verilator backend runs one chip
only). Quick mode runs one small model on 2 chips; the full run:

- causal window 4 over 16 tokens on 2 and 4 chips, a bidirectional window on 4 chips, full
  attention (the K/V ring) on 4 chips;
- one chip in passes: 80 tokens on the tiny preset (max_seq_len 64) in two passes of 40,
  against 40 tokens in one pass (cycles per token);
- ring attention (full attention beyond one chip's K/V ring, partial softmaxes merged): the
  4-layer tiny model over 64 tokens = 4 x attn_window, causal and bidirectional, on 2, 4 and 8
  chips against one chip in passes over key chunks, timed by the ISS's cycle model (equal to
  the RTL's cycles: Verilator on 4 chips in tests/sim/timing/test_cycle.py), with the merge's
  share of the cycles and the causal imbalance; causal in the order ``auto`` picks (zig-zag
  on 2 and 4 chips, plain on 8) and, where that is zig-zag, in the plain order too.
"""

from __future__ import annotations

from dataclasses import replace

from hw.spec import ModelConfig, model_preset, npu_preset
from sim.flows.simulate import simulate
from sim.report.timeline import COMM_UNITS, COMPUTE_UNITS, busy_union

_SEQ = ModelConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_ff=32, seq_len=16,
                   window=4, name="seq16")


def _exposed(report) -> float:
    """Mean share of the cycles in which a chip moved K/V rows and computed nothing."""
    only = [busy_union(span, COMPUTE_UNITS + COMM_UNITS) - busy_union(span, COMPUTE_UNITS)
            for span in report.spans]
    return sum(only) / len(only) / report.cycles


def _rows(label, r):
    q = r.sequence
    rows = [{"bench": f"{label}: cycles", "value": r.cycles, "unit": "cycles",
             "ref": r.reference["cycles"] if r.reference else None,
             "ratio": (r.cycles / r.reference["cycles"]) if r.speedup else None,
             "note": f"one chip = ref; chunks {q['chunk_tokens']}; golden match "
                     f"{r.golden_match}"}]
    if r.speedup is not None:
        rows.append({"bench": f"{label}: speed-up over one chip", "value": r.speedup,
                     "unit": "x", "ref": r.chips, "ratio": r.scaling_efficiency,
                     "note": "ratio = scaling efficiency (speed-up / chips)"})
    sends = [c for c in r.collectives if c["kind"] == "send"]
    if sends:
        bound = sum(c["bound_cycles"] for c in sends)
        rows.append({"bench": f"{label}: K/V {q['mode']} bytes", "value": q["halo_bytes"],
                     "unit": "bytes", "note": f"{q['transfers_per_layer']} transfers in "
                     f"{q['phases_per_layer']} phases per layer, {r.model.n_layers} layers"})
        rows.append({"bench": f"{label}: {len(sends)} K/V sends vs one-hop bound",
                     "value": q["halo_cycles"], "unit": "cycles", "ref": bound,
                     "ratio": q["halo_cycles"] / bound,
                     "note": "each send's busy interval; bound ceil(bytes / B) + a"})
        rows.append({"bench": f"{label}: K/V transfer only", "value": _exposed(r),
                     "unit": "of cycles", "note": "mean over chips: moving K/V, not computing"})
    return rows


def _ring_attention(tiny) -> list[dict]:
    rows = []
    for causal in (True, False):
        cfg = replace(model_preset("tiny"), seq_len=4 * tiny.attn_window, causal=causal,
                      name="tiny-long")
        kind = "causal" if causal else "bidirectional"
        points = [(chips, None) for chips in (2, 4, 8)]
        if causal:
            points += [(2, "plain"), (4, "plain")]
        for chips, order in points:
            r = simulate(tiny, cfg, strategy="sequence", chips=chips, backend="iss",
                         reference="same", order=order)
            q = r.sequence
            label = f"ring attention, {kind}, {q['order']} order, 64 tokens on {chips} tiny " \
                "(iss timing)"
            rows.append({"bench": f"{label}: speed-up over one chip in passes",
                         "value": r.speedup, "unit": "x", "ref": chips,
                         "ratio": r.scaling_efficiency,
                         "note": f"{r.cycles:,} cycles, one chip {r.reference['cycles']:,}; "
                                 f"ratio = scaling efficiency; golden match {r.golden_match}"})
            rows.append({"bench": f"{label}: merge share", "value": max(q["merge_share"]),
                         "unit": "of cycles",
                         "note": f"the busiest chip's; transfer cycles hidden "
                                 f"{sum(q['transfer_hidden_cycles']):,}, exposed "
                                 f"{sum(q['halo_exposed_cycles']):,} (all chips); attention "
                                 f"imbalance {q['attention_imbalance']}"})
    return rows


def run(quick: bool):
    tiny = npu_preset("tiny")
    if quick:
        cfg = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, d_ff=32, seq_len=8,
                          window=3, name="seq8")
        r = simulate(tiny, cfg, strategy="sequence", chips=2, backend="pysim",
                     reference="same")
        return _rows("sequence, seq8 w3 on 2 tiny (pysim)", r)
    backend = "pysim"
    rows = []
    points = [(_SEQ, 2, "causal w4"), (_SEQ, 4, "causal w4"),
              (replace(_SEQ, causal=False), 4, "bidirectional w4"),
              (replace(_SEQ, window=0), 4, "full attention (ring)")]
    for cfg, chips, what in points:
        r = simulate(tiny, cfg, strategy="sequence", chips=chips, backend=backend,
                     reference="same")
        rows += _rows(f"sequence, {what}, 16 tokens on {chips} tiny ({backend})", r)
    long = replace(_SEQ, seq_len=80, name="seq80")
    one = replace(_SEQ, seq_len=40, name="seq40")
    passes = simulate(tiny, long, strategy="sequence", chips=1, backend=backend)
    single = simulate(tiny, one, strategy="single", chips=1, backend=backend)
    per_token, ref = passes.cycles / 80, single.cycles / 40
    rows.append({"bench": f"sequence, 80 tokens on one tiny in passes ({backend})",
                 "value": per_token, "unit": "cycles/token", "ref": ref,
                 "ratio": per_token / ref,
                 "note": f"passes {[b - a for a, b in passes.sequence['passes'][0]]}, K/V "
                         f"halo copies {passes.sequence['halo_copy_bytes']:,} bytes; ref = 40 "
                         f"tokens in one pass; golden match {passes.golden_match}"})
    rows += _ring_attention(tiny)
    return rows
