"""Attention buffer: cycles per query vs the ideal of its datapath (Amaranth's simulator).

The unit has two D-wide MAC datapaths (Q.K and P.V), each sweeping one ring slot per cycle, so a
query needs W cycles on each; the ideal is W cycles per query when the two sweeps of consecutive
queries overlap, and 2W when they cannot. The softmax is a zero-wait stand-in (probabilities
offered the cycle after the score row), so the figures are the unit's own cost.

- **causal prefill** (write token t, then query t): the write of t+1 must wait for query t's
  P.V (it overwrites a key that query t sees), so the sweeps serialise: ideal 2W;
- **back-to-back queries** (keys already written: bidirectional attention or a chunk of
  queries over loaded K/V): the next query's score sweep overlaps this one's P.V: ideal W;
- **split-score**: the scores of a query whose d_head is split across chips, from ``i_q`` to
  ``o_scores`` with a zero-wait all-reduce: two sweeps (dot products, then requantisation of
  the reduced row) vs the one sweep of the unsplit query.
"""

import numpy as np

from hw.tile.attention import AttentionBuffer
from sim.golden.attention import KV, Query, run_sequence
from sim.rtl.attention_driver import run_attention


def _measure(window, d_head, rng):
    L = window  # the presets' softmax_len equals attn_window

    def rand(*shape):
        return rng.integers(-128, 128, size=shape)

    n = 8
    prefill = []
    for t in range(n):
        prefill += [KV(rand(d_head), rand(d_head), t, first=t == 0),
                    Query(rand(d_head), t, 40000, 20)]
    loaded = [KV(rand(d_head), rand(d_head), t, first=t == 0) for t in range(window)]
    loaded += [Query(rand(d_head), window - 1, 40000, 20, bidirectional=True) for _ in range(n)]
    split = []
    for t in range(n):
        split += [KV(rand(d_head), rand(d_head), t, first=t == 0),
                  Query(rand(d_head), t, 40000, 20, split=True)]
    probs = rng.integers(0, 256, size=(n, L))
    out = {}
    for name, cmds in (("prefill", prefill), ("loaded", loaded), ("split", split)):
        exp = run_sequence(cmds, window=window, d_head=d_head, length=L,
                           probs_fn=lambda i, s, m: probs[i])
        got, stats = run_attention(AttentionBuffer(window=window, d_head=d_head, length=L), cmds,
                                   probs_fn=lambda i, s, m: probs[i],
                                   reduced_fn=lambda i, raw: raw)
        ok = all(np.array_equal(g["out"], e["out"]) and np.array_equal(g["scores"], e["scores"])
                 for g, e in zip(got, exp, strict=True))
        out[name] = (got, stats, ok)
    return out


def run(quick: bool):
    rows = []
    configs = [(16, 16)] if quick else [(16, 16), (64, 64)]
    rng = np.random.default_rng(0)
    for window, d_head in configs:
        res = _measure(window, d_head, rng)
        tag = f"W={window} D={d_head}"
        got, stats, ok = res["prefill"]
        period = (got[-1]["t_q"] - got[0]["t_q"]) / (len(got) - 1)
        rows.append({"bench": f"attention causal prefill, cycles/query, {tag}", "value": period,
                     "unit": "cycles", "ref": 2 * window, "ratio": period / (2 * window),
                     "note": f"write t then query t; ideal 2W (sweeps serialise); golden "
                             f"match {ok}"})
        got, stats, ok = res["loaded"]
        period = (got[-1]["t_q"] - got[0]["t_q"]) / (len(got) - 1)
        rows.append({"bench": f"attention back-to-back queries, cycles/query, {tag}",
                     "value": period, "unit": "cycles", "ref": window, "ratio": period / window,
                     "note": f"score sweep overlaps the previous P.V; ideal W; golden match {ok}"})
        got, stats, ok = res["split"]
        latency = float(np.mean([g["t_scores"] - g["t_q"] for g in got]))
        rows.append({"bench": f"attention split-score q->scores latency, {tag}",
                     "value": latency, "unit": "cycles", "ref": window,
                     "ratio": latency / window,
                     "note": f"zero-wait all-reduce; dot sweep + requant sweep vs one sweep; "
                             f"golden match {ok}"})
        rows.append({"bench": f"pysim speed, attention {tag}", "value": stats["cycles_per_s"],
                     "unit": "cycles/s", "note": "Amaranth simulator, testbenches on 3 streams"})
    return rows
