"""``npu sim``: quantise, compile, simulate, compare with the golden model, report.

Exit status (DESIGN.md §5): 0 every output equals the integer golden model bit for bit, 1 a
mismatch, 2 bad input (one line), 3 the watchdog (``--max-cycles``) fired.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from hw.spec import load_model, load_npu
from hw.spec.memory import unpack_rows

from .compiler.quantize import dequantize_residual, quantize_input, quantize_model
from .compiler.single import check_single_chip, compile_single, input_image
from .golden.float_model import check_weights, model_forward, random_weights
from .golden.layer import model_int
from .iss import Iss

__all__ = ["SimError", "Watchdog", "run_sim_command", "DEFAULT_MAX_CYCLES"]

DEFAULT_MAX_CYCLES = 5_000_000
_UNITS = ("matmul", "attention", "vector", "collective")


class SimError(Exception):
    """Bad input for ``npu sim`` (exit status 2)."""


class Watchdog(Exception):
    """The simulation exceeded ``--max-cycles`` (exit status 3)."""


def _load_array(path, what):
    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise SimError(f"{what} {path}: file not found") from None
    except (OSError, ValueError) as exc:
        raise SimError(f"{what} {path}: not a NumPy file ({exc})") from None
    return arr


def _inputs(args, cfg, rng):
    if args.input:
        x = _load_array(args.input, "--input")
        if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
            raise SimError(f"--input {args.input}: expected float32 activations, got "
                           f"{getattr(x, 'dtype', type(x))}")
        if x.ndim not in (2, 3) or x.shape[-1] != cfg.d_model or x.shape[-2] > cfg.seq_len:
            raise SimError(f"--input {args.input}: shape {list(x.shape)} is not [seq, d_model] "
                           f"or [batch, seq, d_model] with d_model={cfg.d_model}, "
                           f"seq <= seq_len={cfg.seq_len}")
        if not np.isfinite(x).all():
            raise SimError(f"--input {args.input}: has non-finite values")
        return np.asarray(x, np.float64)
    shape = (cfg.seq_len, cfg.d_model) if cfg.batch == 1 and not args.batch else \
        (args.batch or cfg.batch, cfg.seq_len, cfg.d_model)
    return rng.standard_normal(shape)


def _weights(args, cfg):
    if not args.weights:
        return random_weights(cfg, args.seed)
    npz = _load_array(args.weights, "--weights")
    if not hasattr(npz, "files"):
        raise SimError(f"--weights {args.weights}: expected an .npz archive")
    try:
        return check_weights(cfg, {k: npz[k] for k in npz.files}, args.weights)
    except ValueError as exc:
        raise SimError(f"--weights: {exc}") from None


def _run_one(args, npu, comp, x_int):
    base, words = input_image(comp, x_int)
    images = dict(comp.alloc.images)
    images[base] = words
    x = comp.x
    if args.backend == "iss":
        iss = Iss(npu)
        for b, w in images.items():
            iss.write_words(b, w)
        start = time.perf_counter()
        iss.run(comp.program)
        wall = time.perf_counter() - start
        out = iss.read_words(x.base, x.words)
        busy = dict.fromkeys((*_UNITS, "any"), 0)
        return out, {"cycles": None, "load_cycles": sum(len(w) for w in images.values()),
                     "busy": busy, "wall_s": wall, "cycles_per_s": None}
    if args.backend == "pysim":
        from .rtl.chip_runner import run_chip_pysim
        from .rtl.pysim import SimulationTimeout
        try:
            res = run_chip_pysim(npu, comp.program, images, [(x.base, x.words)],
                                 max_cycles=args.max_cycles or DEFAULT_MAX_CYCLES,
                                 vcd=args.vcd)
        except SimulationTimeout as exc:
            raise Watchdog(str(exc)) from None
    else:
        from .rtl.chip_verilator import run_chip_verilator
        res = run_chip_verilator(npu, comp.program, images, [(x.base, x.words)],
                                 max_cycles=args.max_cycles or DEFAULT_MAX_CYCLES)
        if res.get("timeout"):
            raise Watchdog(f"chip did not halt within max_cycles={args.max_cycles}")
    if res["error"]:
        raise SimError("the chip halted on an unknown instruction (compiler bug)")
    busy = dict(zip(_UNITS, res["busy_cycles"][:4], strict=True))
    busy["any"] = res["busy_cycles"][4]
    return res["regions"][0], {"cycles": res["cycles"], "load_cycles": res["load_cycles"],
                               "busy": busy, "wall_s": res["wall_s"],
                               "cycles_per_s": res["cycles_per_s"]}


def run_sim_command(args) -> int:
    npu = load_npu(args.npu)
    cfg = load_model(args.model)
    if args.strategy != "single" or args.chips != 1:
        raise SimError(f"npu sim: --strategy {args.strategy} --chips {args.chips} is not built "
                       "yet: only --strategy single --chips 1 runs today")
    for option in ("trace", "plot"):
        if getattr(args, option, None):
            raise SimError(f"npu sim: --{option} is not built yet")
    if getattr(args, "microbatches", None):
        raise SimError("npu sim: --microbatches applies to --strategy pipeline")
    if args.vcd and args.backend != "pysim":
        raise SimError(f"npu sim: --vcd needs --backend pysim, not {args.backend}")
    # Refuse what one chip cannot run before any work (the compiler checks again).
    check_single_chip(npu, cfg)
    rng = np.random.default_rng(args.seed)
    weights = _weights(args, cfg)
    x = _inputs(args, cfg, rng)
    calib = _load_array(args.calib, "--calib") if args.calib else x
    qm = quantize_model(cfg, weights, calib)
    batch = x if x.ndim == 3 else x[None]
    seq = batch.shape[1]
    comp = compile_single(npu, qm, seq=seq)
    results, golden, floats, stats = [], [], [], []
    for sample in batch:
        x_int = quantize_input(qm, sample)
        want = model_int(qm, x_int)
        words, st = _run_one(args, npu, comp, x_int)
        got = unpack_rows(words, comp.seq_pad, comp.x.cols, 2)[:seq, :cfg.d_model]
        results.append(got)
        golden.append(want)
        floats.append(model_forward(cfg, weights, sample))
        stats.append(st)
    got, want, ref = np.stack(results), np.stack(golden), np.stack(floats)
    match = bool((got == want).all())
    deq = dequantize_residual(qm, got)
    cosine = float((deq * ref).sum() / (np.linalg.norm(deq) * np.linalg.norm(ref) or 1.0))
    cycles = None if stats[0]["cycles"] is None else int(sum(s["cycles"] for s in stats))
    wall = sum(s["wall_s"] for s in stats)
    busy = {u: int(sum(s["busy"][u] for s in stats)) for u in (*_UNITS, "any")}
    overlap = sum(busy[u] for u in _UNITS) - busy["any"]
    busy["idle"] = (cycles - busy.pop("any")) if cycles else 0
    report = {
        "strategy": args.strategy, "chips": args.chips, "backend": args.backend,
        "seed": args.seed, "npu": npu.name, "model": cfg.name,
        "cycles": cycles, "load_cycles": int(sum(s["load_cycles"] for s in stats)),
        "golden_match": match,
        "float_error": {"max_abs": float(np.abs(deq - ref).max()), "cosine": cosine},
        "per_chip": [{"chip": 0, "busy": busy, "overlap_cycles": int(overlap),
                      "sram_bytes_used": int(comp.alloc.next_word * npu.word_bytes),
                      "sram_bytes": {k: int(v) for k, v in comp.alloc.used.items()},
                      "instructions": len(comp.program)}],
        "collectives": [],
        "sim": {"wall_s": wall, "cycles_per_s": (cycles / wall) if cycles and wall else None},
    }
    if not match:
        bad = np.argwhere(got != want)[0]
        report["first_mismatch"] = {"index": [int(v) for v in bad],
                                    "got": int(got[tuple(bad)]), "want": int(want[tuple(bad)])}
    if args.output:
        out = deq.astype(np.float32)
        np.save(args.output, out if x.ndim == 3 else out[0])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    _summary(report, comp)
    return 0 if match else 1


def _summary(r, comp):
    cyc = "n/a (ISS is not cycle-accurate)" if r["cycles"] is None else f"{r['cycles']:,}"
    print(f"npu sim: {r['model']} on {r['npu']}, strategy {r['strategy']}, {r['chips']} chip(s), "
          f"backend {r['backend']}")
    print(f"  program {len(comp.program)} instructions, scratchpad "
          f"{r['per_chip'][0]['sram_bytes_used']:,} of {comp.npu.sram_bytes:,} bytes")
    print(f"  cycles {cyc} (+{r['load_cycles']:,} host load)")
    if r["cycles"]:
        chip = r["per_chip"][0]
        busy = ", ".join(f"{u} {v / r['cycles']:.0%}" for u, v in chip["busy"].items() if v)
        print(f"  busy: {busy}; units overlapped {chip['overlap_cycles'] / r['cycles']:.0%} "
              "of the cycles")
    print(f"  golden match: {'yes (bit-exact)' if r['golden_match'] else 'NO'}; vs float64: "
          f"cosine {r['float_error']['cosine']:.5f}, max abs {r['float_error']['max_abs']:.4g}")
    if not r["golden_match"]:
        print(f"  first mismatch {r['first_mismatch']}")

