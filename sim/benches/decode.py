"""Generation on chip (``sim.flows.generate``): a decode step's cycles against the chip's
bound, the aggregate tokens/s of a batch of sequences, the speed-up of head parallelism.

The model is a d_model 128 decoder (the tiny preset's shape otherwise: pre-norm LayerNorm,
GELU MLP, biases, tied embeddings, vocabulary 256) of 2 layers, 8 heads of 16 lanes (8 K/V
heads) and d_ff 256, with learned positions (``d128``) and with RoPE (``d128-rope``). The
NPU is the tiny preset with an 8x8 array (8 vector lanes), ``d_model_max`` 128 and a 512 KiB
scratchpad (``tiny-d128``; the tiny preset's 4096 instruction words hold a batch of 8). Every
run is on the ISS timed by the cycle model and must be bit-exact against the golden
incremental decode (:func:`_run` raises otherwise):

- **the bound** of a step (:func:`step_bound`): the larger of the weight bytes its matmuls
  read over the bytes the weight stream delivers per cycle, and its multiply-accumulates over
  the array's. A ``MATMUL`` streams its B operand (the weights) through one scratchpad read
  port at one word of ``N`` bytes per cycle (``docs/isa.md``, MATMUL timing: a fold takes its
  K beats), and a step's ``B <= N`` token rows are one fold, so each weight is read once per
  step: the blocks' matrices (QKV, with RoPE's rotated Q' and K' columns; O; FFN1, the gate
  if any, FFN2), the one-hot embedding matmul's whole table ``[vocab, d_model]`` and the LM
  head ``[d_model, vocab]``, all as the compiler stores them (unpadded, the last column block
  packed: ``hw.spec.memory.weight_words``; heads packed, ``sim.compiler.blocks.QkvLayout``;
  the LM head in whole blocks of the vocabulary). The array does ``N * N``
  MACs per cycle; the step's are those ``B`` tokens' of the same matrices. Not counted: the
  per-fold parameter words (another port, in parallel), the attention (its own engine), the
  vector launches (norms, GELU, residuals, ONEHOT, ARGMAX) and every matmul's fill and drain.
  The note gives the last step's busy cycles per unit (:func:`step_units`) to say where the
  rest goes;
- **batching**: aggregate tokens/s of 1, 2, 4 and 8 sequences against one sequence's;
- **head parallelism**: one chip's step cycles over those of 4 chips (2 heads each).

Quick mode: ``d128`` only, batches 1 and 2, no RoPE and no head run.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from hw.spec import ModelConfig, NpuConfig, model_preset, npu_preset
from hw.spec.memory import weight_words

from ..compiler.blocks import QkvLayout, pad_to
from ..flows.generate import generate
from ..report.timeline import COMPUTE_UNITS

__all__ = ["NPU", "D128", "D128_ROPE", "step_bound", "run"]

#: The tiny NPU with an 8x8 array, room for a d_model 128 decoder and its head on one chip.
NPU = dataclasses.replace(npu_preset("tiny"), array_size=8, vector_lanes=8, d_model_max=128,
                          sram_bytes=512 * 1024, name="tiny-d128")
D128 = dataclasses.replace(model_preset("tiny"), n_layers=2, d_model=128, n_heads=8, n_kv_heads=8,
                           d_head=16, d_ff=256, name="d128")
D128_ROPE = dataclasses.replace(D128, rope_theta=10000.0, name="d128-rope")
PROMPT_LEN = 3
GENERATE = 4
SEED = 0


def step_bound(npu: NpuConfig, cfg: ModelConfig, batch: int = 1) -> dict:
    """A decode step's lower bound in cycles on one chip (module docstring): ``weights``
    (bytes per part: ``blocks``, ``embedding``, ``lm_head``), ``read_bytes_per_cycle``,
    ``weight_cycles``, ``macs``, ``macs_per_cycle``, ``mac_cycles`` and ``cycles`` (the
    larger)."""
    if cfg.quant != "int8":
        raise ValueError(f"the bound counts one int8 pass per matrix: quant must be int8, not "
                         f"{cfg.quant!r}")
    n = npu.array_size
    if not 1 <= batch <= n:
        raise ValueError(f"the bound reads each weight once per step: batch must be 1.."
                         f"{n} (one fold of array_size rows), not {batch}")
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    lay = QkvLayout(cfg.d_head, cfg.n_heads, cfg.n_kv_heads, n, cfg.rope)
    qkv = [(d, lay.main + (lay.qk if cfg.rope else 0))] if lay.fused else \
        [(d, lay.main), (d, lay.qk)]
    mats = qkv + [(cfg.n_heads * cfg.d_head, d), (d, f), (f, d)] + \
        ([(d, f)] if cfg.ffn == "gated" else [])

    def stored(rows, cols):
        return weight_words(rows, cols, n, packed=True) * n
    block = sum(stored(r, c) for r, c in mats)
    weights = {"blocks": cfg.n_layers * block, "embedding": stored(v, d),
               "lm_head": stored(d, pad_to(v, n))}
    total = sum(weights.values())
    read = npu.word_bytes                # RD1: one word of the weight stream per cycle
    macs = batch * total                 # each weight element once per token row
    out = {"weights": weights, "weight_bytes": total, "read_bytes_per_cycle": read,
           "weight_cycles": -(-total // read), "macs": macs,
           "macs_per_cycle": npu.peak_macs_per_cycle,
           "mac_cycles": -(-macs // npu.peak_macs_per_cycle)}
    out["cycles"] = max(out["weight_cycles"], out["mac_cycles"])
    return out


def _run(cfg: ModelConfig, batch: int, strategy: str = "single", chips: int = 1) -> dict:
    """One generation on the ISS; raises unless it is bit-exact against the golden."""
    prompt = np.random.default_rng(SEED).integers(0, cfg.vocab_size, (batch, PROMPT_LEN))
    out = generate(NPU, cfg, prompt=prompt, n=GENERATE, backend="iss", strategy=strategy,
                   chips=chips, seed=SEED)
    if not out["golden_match"]:
        raise AssertionError(f"{cfg.name}, batch {batch}, {strategy} on {chips} chip(s), seed "
                             f"{SEED}: not bit-exact against the golden incremental decode: "
                             f"{out['first_mismatch']}")
    return out


def step_units(out: dict) -> dict:
    """Chip 0's (single and head: the picker's) busy cycles per compute unit and in
    collectives (``launches``: how many MATMULs began) in the last decode step of the run
    ``out``, from the previous step's ARGMAX end to its own (the run's own trace: a unit's
    k-th busy interval is its k-th launch)."""
    spans = out["spans"][0]
    lo, hi = out["picks"][-2], out["picks"][-1]
    busy = {u: sum(max(0, min(e, hi) - max(s, lo)) for s, e in spans[u])
            for u in COMPUTE_UNITS + ("collective",)}
    busy["launches"] = sum(1 for s, _ in spans["matmul"] if lo <= s < hi)
    return busy


def _mean_step(out: dict) -> float:
    return sum(out["step_cycles"]) / len(out["step_cycles"])


def _bound_row(cfg: ModelConfig, batch: int, out: dict) -> dict:
    b = step_bound(NPU, cfg, batch)
    w = b["weights"]
    step = _mean_step(out)
    u = step_units(out)
    which = "weights" if b["weight_cycles"] >= b["mac_cycles"] else "MACs"
    return {"bench": f"decode step vs bound, {cfg.name} on 1 {NPU.name}, batch {batch}",
            "value": step, "unit": "cycles", "ref": b["cycles"], "ratio": step / b["cycles"],
            "note": f"bound = {which}: {b['weight_bytes']:,} weight bytes (blocks "
                    f"{w['blocks']:,}, one-hot embedding table {w['embedding']:,}, LM head "
                    f"{w['lm_head']:,}) / {b['read_bytes_per_cycle']} bytes per cycle = "
                    f"{b['weight_cycles']:,}; {b['macs']:,} MACs / {b['macs_per_cycle']} = "
                    f"{b['mac_cycles']:,}; steps {out['step_cycles']}; the last step's busy "
                    f"cycles: {u['launches']} matmuls {u['matmul']:,} (bound + "
                    f"{u['matmul'] - b['cycles']:,} fill, drain, stalls), attention "
                    f"{u['attention']:,}, vector {u['vector']:,}; SRAM "
                    f"{max(out['sram_bytes']):,} bytes, {max(out['instructions'])} "
                    f"instructions; {NPU.name} = tiny with array_size 8, 512 KiB"}


def _batch_rows(cfg: ModelConfig, runs: dict) -> list[dict]:
    one = runs[1]["tokens_per_s_aggregate"]
    return [{"bench": f"aggregate tokens/s, {cfg.name} on 1 {NPU.name}, batch {b}",
             "value": out["tokens_per_s_aggregate"], "unit": "tokens/s", "ref": one,
             "ratio": out["tokens_per_s_aggregate"] / one,
             "note": f"ref = batch 1; mean step {_mean_step(out):,.0f} cycles at "
                     f"{NPU.clock_mhz:g} MHz; prompt {PROMPT_LEN}, {GENERATE} generated; "
                     f"ratio <= batch (one fold of {NPU.array_size} rows)"}
            for b, out in runs.items()]


def run(quick: bool):
    batches = (1, 2) if quick else (1, 2, 4, 8)
    runs = {b: _run(D128, b) for b in batches}
    rows = [_bound_row(D128, 1, runs[1])]
    if not quick:
        rows.append(_bound_row(D128, 8, runs[8]))
        rope = _run(D128_ROPE, 1)
        rows.append(_bound_row(D128_ROPE, 1, rope))
    rows += _batch_rows(D128, runs)
    if quick:
        return rows
    head = _run(D128, 1, "head", 4)
    single, split = _mean_step(runs[1]), _mean_step(head)
    u = step_units(head)
    rows.append({"bench": f"head parallelism, {D128.name} on 4 {NPU.name}, batch 1",
                 "value": split, "unit": "cycles", "ref": single, "ratio": single / split,
                 "note": "ratio = speed-up of a decode step over one chip (mean step cycles): "
                         "each chip its 2 heads' blocks and a quarter of the LM head and of "
                         "the embedding table; all-reduces and the argmax records' "
                         "all-gather; "
                         f"chip 0's last step busy: {u['launches']} matmuls {u['matmul']:,}, "
                         f"attention {u['attention']:,}, vector {u['vector']:,}, collectives "
                         f"{u['collective']:,} cycles; SRAM {max(head['sram_bytes']):,} bytes "
                         "per chip"})
    return rows
