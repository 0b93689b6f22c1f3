"""``npu sim --generate N`` as a function: greedy generation on chip, against the golden.

:func:`generate` quantises a decoder once on the float prefill of the prompt, compiles the
prefill and ``n - 1`` decode steps into one program (:mod:`sim.compiler.decode`), runs it on
the ISS (timed by its cycle model) or pysim, and compares the generated ids and every step's
logits with the golden incremental decode (:func:`sim.golden.decode.generate_int`) and the
float64 reference's tokens (:func:`sim.golden.decode.generate_float`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hw.spec import ConfigError, ModelConfig, NpuConfig

from ..compiler.decode import (
    DECODE_STRATEGIES,
    GRID_STRATEGIES,
    check_generate,
    compile_decode,
)
from ..compiler.decode_quant import check_head_weights, quantize_decode
from ..errors import BadInput
from ..golden.decode import generate_float, generate_int, random_head_weights
from ..golden.float_model import check_weights, random_weights
from ..report.plot import plot_spans
from ..report.timeline import intervals, step_ends
from ..strategies.base import parse_grid
from .simulate import run_backend

__all__ = ["generate", "generate_summary", "plot_generation", "GENERATE_BACKENDS",
           "GENERATE_STRATEGIES"]

GENERATE_BACKENDS = ("iss", "pysim", "verilator")


#: The strategies generation runs with (``sim.compiler.decode``).
GENERATE_STRATEGIES = DECODE_STRATEGIES


def generate(npu: NpuConfig, model: ModelConfig, *, prompt, n: int, backend: str = "iss",
             strategy: str = "single", chips: int | None = None, grid: str | None = None,
             seed: int = 0,
             weights: dict | None = None, head_weights: dict | None = None,
             max_cycles: int = 5_000_000) -> dict:
    """Generate ``n`` tokens after ``prompt`` (token ids: ``[P]``, or ``[batch, P]`` for a
    batch of sequences that decode together) on ``chips`` chips of ``npu`` (``strategy``
    single: one; head: the heads split, default 2).

    ``weights`` / ``head_weights``: float arrays by the names of ``docs/formats.md``
    (default: random from ``seed``). Returns a dict: ``ids`` (generated on chip), ``golden_ids``,
    ``float_ids``, ``golden_match`` (ids and every step's int16 logits equal the golden's),
    ``first_mismatch``, ``cycles``, ``ttft_cycles`` (the prefill's token), ``step_cycles``
    (each decode step), ``tokens_per_s`` (after the first, at the NPU's clock),
    ``instructions``, ``kv_bytes`` and ``sram_bytes`` (per chip).
    """
    if backend not in GENERATE_BACKENDS:
        raise BadInput(f"--generate runs on backend {', '.join(GENERATE_BACKENDS)}, not "
                       f"{backend}")
    if strategy not in GENERATE_STRATEGIES:
        raise BadInput(f"--generate runs strategy {', '.join(GENERATE_STRATEGIES)}, not "
                       f"{strategy}")
    sizes = None
    if strategy in GRID_STRATEGIES:
        try:
            sizes = parse_grid(grid) if grid is not None else None
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        if sizes is None:
            raise BadInput(f"--strategy {strategy} needs --grid AxB (A chips of its first "
                           "part, B of its second)")
        chips = sizes[0] * sizes[1] if chips is None else chips
    elif grid is not None:
        raise BadInput(f"--grid applies to {', '.join(GRID_STRATEGIES)}, not {strategy}")
    chips = (1 if strategy == "single" else 2) if chips is None else chips
    if strategy == "single" and chips != 1:
        raise BadInput(f"strategy single runs on one chip, not {chips}")
    if strategy != "single" and chips < 2:
        raise BadInput(f"strategy {strategy} needs at least 2 chips, not {chips}")
    prompts = np.asarray(prompt)
    if prompts.ndim not in (1, 2) or prompts.size == 0 or prompts.dtype.kind not in "iu":
        raise BadInput(f"the prompt must be integer token ids, [P] or [batch, P], not "
                       f"{prompts.dtype} {list(prompts.shape)}")
    prompts = prompts.astype(np.int64).reshape(-1, prompts.shape[-1])
    batch = prompts.shape[0]
    try:
        check_generate(npu, model, int(prompts.shape[1]), n,
                       split_chips=chips if strategy == "sequence" else 0)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise BadInput(str(exc)) from None
    flat = prompts.reshape(-1)
    bad = np.flatnonzero((flat < 0) | (flat >= model.vocab_size))
    if bad.size:
        raise BadInput(f"prompt id {int(flat[bad[0]])} at index {int(bad[0])} is outside "
                       f"0..{model.vocab_size - 1} (vocab_size)")
    try:
        weights = random_weights(model, seed) if weights is None else \
            check_weights(model, weights, "weights")
        hw = random_head_weights(model, seed + 1) if head_weights is None else \
            check_head_weights(model, head_weights, "weights")
    except ValueError as exc:
        raise BadInput(f"weights: {exc}") from None
    # Calibrated once, on the first sequence's prompt.
    qm, head = quantize_decode(model, weights, hw, prompts[0])
    try:
        prog = compile_decode(npu, qm, head, prompt_len=int(prompts.shape[1]), generate=n,
                              batch=batch, chips=chips, strategy=strategy, grid=sizes)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise BadInput(str(exc)) from None
    programs = prog.programs
    images = prog.images(prompts)
    reads = prog.reads()
    res = run_backend(backend, npu, programs, images, reads, max_cycles=max_cycles)
    regions, cycles, wall = res["regions"], res["cycles"], res["wall_s"]
    got = prog.read(regions)
    # Split-KV decode merges partial softmaxes: the golden in the program's merge order.
    split = {} if prog.kv_chunks is None else {"ring": npu.attn_window,
                                                "kv_chunks": prog.kv_chunks}
    want = [generate_int(qm, head, p, n, **split) for p in prompts]
    want_ids = np.array([w["ids"] for w in want])
    want_logits = np.array([w["logits"] for w in want])
    ref_ids = [[int(t) for t in generate_float(model, weights, hw, p, n)["ids"]]
               for p in prompts]
    match = bool((got["ids"] == want_ids).all() and (got["logits"] == want_logits).all())
    first = None
    if not match:
        bad = np.argwhere(got["logits"] != want_logits)
        if bad.size:
            b, t, v = (int(i) for i in bad[0])
            first = {"sequence": b, "step": t, "vocab": v, "got": int(got["logits"][b, t, v]),
                     "want": int(want_logits[b, t, v])}
        else:
            b, t = (int(i) for i in np.argwhere(got["ids"] != want_ids)[0])
            first = {"sequence": b, "step": t, "got_id": int(got["ids"][b, t]),
                     "want_id": int(want_ids[b, t])}
    spans = [intervals(c["trace"]["entries"], cycles) for c in res["chips"]]
    ends = step_ends(programs[prog.picker], spans[prog.picker])
    ends = ends[::prog.picks_per_step]          # the first sequence's picks
    steps = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
    clock = npu.clock_mhz * 1e6
    return {
        "prompt": prompts.tolist(), "generate": n, "batch": batch, "backend": backend,
        "seed": seed, "ids": got["ids"].tolist(), "golden_ids": want_ids.tolist(),
        "float_ids": ref_ids, "golden_match": match,
        "first_mismatch": first, "logits": got["logits"], "cycles": int(cycles),
        "ttft_cycles": int(ends[0]), "step_cycles": [int(s) for s in steps],
        "tokens_per_s": (clock * len(steps) / sum(steps)) if steps else None,
        "tokens_per_s_aggregate": (batch * clock * len(steps) / sum(steps)) if steps else None,
        "strategy": strategy, "chips": chips,
        "instructions": [len(p) for p in programs], "kv_bytes": prog.kv_bytes,
        "cache_bytes": [sum(c.words for c in cs) * npu.word_bytes for cs in prog.caches],
        "sram_bytes": [int(c.alloc.next_word * npu.word_bytes) for c in prog.chips],
        "context": prog.context, "wall_s": wall, "kv_chunks": prog.kv_chunks,
        # Per chip, per unit its busy intervals, and the first sequence's picks (plots).
        "spans": spans, "picks": [int(e) for e in ends],
    }



def generate_summary(out: dict) -> str:
    """The run in a few lines (the CLI's output)."""
    verdict = "bit-exact" if out["golden_match"] else f"MISMATCH {out['first_mismatch']}"
    steps = out["step_cycles"]
    lines = [
        f"generate {out['generate']} tokens after {out['batch']} prompt(s) of "
        f"{len(out['prompt'][0])} tokens, "
        f"{out['strategy']} on {out['chips']} chip{'s' if out['chips'] > 1 else ''}, "
        f"{out['backend']}: {verdict} against the golden incremental decode",
        f"  ids {out['ids']} (float64 reference: {out['float_ids']})",
        f"  time to first token {out['ttft_cycles']:,} cycles; "
        + (f"decode steps {min(steps):,}..{max(steps):,} cycles, "
           f"{out['tokens_per_s']:,.0f} tokens/s per sequence, "
           f"{out['tokens_per_s_aggregate']:,.0f} in all" if steps else "no decode step"),
        f"  {out['cycles']:,} cycles in all; per chip: {max(out['instructions'])} instructions "
        f"at most, KV cache {max(out['kv_bytes']):,} bytes ({max(out['cache_bytes']):,} "
        f"allocated with Q), SRAM {max(out['sram_bytes']):,} bytes",
    ]
    return "\n".join(lines)


def plot_generation(out: dict, model: ModelConfig, npu: NpuConfig, path) -> Path:
    """The run's timeline (``npu sim --generate N --plot``): a row per chip, the prefill and
    each step between the first sequence's picks."""
    marks = [(out["picks"][0], "first token")] + [
        (c, f"step {k + 1}") for k, c in enumerate(out["picks"][1:])]
    title = (f"{model.name} on {out['chips']} x {npu.name}, {out['strategy']}, "
             f"{out['backend']}: {out['batch']} x {out['generate']} tokens, "
             f"{out['cycles']:,} cycles")
    return plot_spans(out["spans"], out["cycles"], title, path, marks)
