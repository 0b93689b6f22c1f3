"""``npu sim`` as a function: quantise, compile, simulate, compare with the golden model.

:func:`simulate` is what the CLI, the benchmarks and a notebook call. It refuses what the chip
cannot run with :class:`~sim.errors.BadInput` (or :class:`hw.spec.ConfigError` for a limit of a
configuration) before any work, and ends a run past its cycle budget with
:class:`~sim.errors.Watchdog`.
"""

from __future__ import annotations

import time

import numpy as np

from hw.spec import ConfigError, ModelConfig, NpuConfig
from hw.spec.isa import BUSY_COUNTERS
from hw.spec.memory import unpack_rows

from .compiler.quantize import dequantize_residual, quantize_input, quantize_model
from .compiler.single import check_single_chip, compile_single, input_image
from .errors import BadInput, Watchdog
from .golden.float_model import check_weights, model_forward, random_weights
from .golden.layer import model_int
from .iss import Iss, IssError
from .report import UNITS, ChipStats, SimReport
from .rtl.chip_runner import run_chip_pysim, run_chip_verilator
from .rtl.pysim import SimulationTimeout

__all__ = ["simulate", "STRATEGIES", "BACKENDS", "DEFAULT_MAX_CYCLES", "check_input"]

STRATEGIES = ("single", "head", "pipeline", "data", "hidden", "sequence", "head+pipeline",
              "data+head", "data+pipeline")
BACKENDS = ("pysim", "verilator", "iss")
DEFAULT_MAX_CYCLES = 5_000_000


def check_input(cfg: ModelConfig, x, what: str = "input") -> np.ndarray:
    """``x`` as float64 [seq, d_model] or [batch, seq, d_model]; :class:`BadInput` otherwise."""
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f":
        raise BadInput(f"{what}: expected float32 activations, got "
                       f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.ndim not in (2, 3) or x.shape[-1] != cfg.d_model or x.shape[-2] > cfg.seq_len:
        raise BadInput(f"{what}: shape {list(x.shape)} is not [seq, d_model] or [batch, seq, "
                       f"d_model] with d_model={cfg.d_model}, seq <= seq_len={cfg.seq_len}")
    if not np.isfinite(x).all():
        raise BadInput(f"{what}: has non-finite values")
    return np.asarray(x, np.float64)


def _run_chip(backend, npu, comp, x_int, max_cycles, vcd):
    base, words = input_image(comp, x_int)
    images = dict(comp.alloc.images)
    images[base] = words
    x = comp.x
    if backend == "iss":
        iss = Iss(npu)
        for b, w in images.items():
            iss.write_words(b, w)
        start = time.perf_counter()
        try:
            iss.run(comp.program)
        except IssError as exc:
            raise BadInput(f"the program failed on the ISS (compiler bug): {exc}") from None
        wall = time.perf_counter() - start
        out = iss.read_words(x.base, x.words)
        return out, {"cycles": None, "load_cycles": sum(len(w) for w in images.values()),
                     "busy": [0] * len(BUSY_COUNTERS), "wall_s": wall}
    if backend == "pysim":
        try:
            res = run_chip_pysim(npu, comp.program, images, [(x.base, x.words)],
                                 max_cycles=max_cycles, vcd=vcd)
        except SimulationTimeout as exc:
            raise Watchdog(str(exc)) from None
    else:
        res = run_chip_verilator(npu, comp.program, images, [(x.base, x.words)],
                                 max_cycles=max_cycles)
        if res.get("timeout"):
            raise Watchdog(f"chip did not halt within max_cycles={max_cycles}")
    if res["error"]:
        raise BadInput("the chip halted on an unknown instruction (compiler bug)")
    return res["regions"][0], {"cycles": res["cycles"], "load_cycles": res["load_cycles"],
                               "busy": res["busy_cycles"], "wall_s": res["wall_s"]}


def simulate(npu: NpuConfig, model: ModelConfig, *, strategy: str = "single", chips: int = 1,
             backend: str = "pysim", seed: int = 0, weights: dict | None = None, x=None,
             calib=None, batch: int | None = None, microbatches: int | None = None,
             max_cycles: int | None = None, vcd: str | None = None) -> SimReport:
    """Compile ``model`` for ``chips`` chips of ``npu`` with ``strategy`` and simulate it.

    ``weights``: float arrays by the names of ``docs/formats.md`` (default: random from
    ``seed``). ``x``: float [seq, d_model] or [batch, seq, d_model] (default: random from
    ``seed``, ``batch`` sequences). ``calib``: activations that calibrate the scales (default:
    ``x``). ``backend``: ``iss`` (no timing), ``pysim`` or ``verilator``. ``vcd`` writes a
    waveform (pysim only). Every output integer is compared with the integer golden model.
    """
    if not isinstance(npu, NpuConfig):
        raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
    if not isinstance(model, ModelConfig):
        raise TypeError(f"model must be a ModelConfig, not {model!r}")
    if strategy not in STRATEGIES:
        raise BadInput(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if backend not in BACKENDS:
        raise BadInput(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if strategy != "single" or chips != 1:
        raise BadInput(f"--strategy {strategy} --chips {chips} is not built yet: only "
                       "--strategy single --chips 1 runs today")
    if microbatches is not None:
        raise BadInput("--microbatches applies to --strategy pipeline")
    if vcd and backend != "pysim":
        raise BadInput(f"--vcd needs --backend pysim, not {backend}")
    max_cycles = max_cycles or DEFAULT_MAX_CYCLES
    # Refuse what one chip cannot run before any work (the compiler checks again).
    check_single_chip(npu, model)
    rng = np.random.default_rng(seed)
    if weights is None:
        weights = random_weights(model, seed)
    else:
        try:
            weights = check_weights(model, weights, "weights")
        except ValueError as exc:
            raise BadInput(f"weights: {exc}") from None
    if x is None:
        shape = (model.seq_len, model.d_model) if model.batch == 1 and not batch else \
            (batch or model.batch, model.seq_len, model.d_model)
        x = rng.standard_normal(shape)
    else:
        x = check_input(model, x)
    calib = x if calib is None else np.asarray(calib, np.float64)
    qm = quantize_model(model, weights, calib)
    samples = x if x.ndim == 3 else x[None]
    seq = samples.shape[1]
    try:
        comp = compile_single(npu, qm, seq=seq)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise BadInput(str(exc)) from None
    results, golden, floats, stats = [], [], [], []
    for sample in samples:
        x_int = quantize_input(qm, sample)
        golden.append(model_int(qm, x_int))
        words, st = _run_chip(backend, npu, comp, x_int, max_cycles, vcd)
        results.append(unpack_rows(words, comp.seq_pad, comp.x.cols, 2)[:seq, :model.d_model])
        floats.append(model_forward(model, weights, sample))
        stats.append(st)
    got, want, ref = np.stack(results), np.stack(golden), np.stack(floats)
    match = bool((got == want).all())
    deq = dequantize_residual(qm, got)
    cosine = float((deq * ref).sum() / (np.linalg.norm(deq) * np.linalg.norm(ref) or 1.0))
    timed = stats[0]["cycles"] is not None
    cycles = int(sum(s["cycles"] for s in stats)) if timed else None
    counts = dict(zip(BUSY_COUNTERS, (int(sum(s["busy"][k] for s in stats))
                                      for k in range(len(BUSY_COUNTERS))), strict=True))
    busy = {u: counts[u] for u in UNITS}
    busy["idle"] = cycles - counts["any"] if timed else 0
    chip = ChipStats(chip=0, busy=busy, overlap_cycles=sum(busy[u] for u in UNITS) - counts["any"],
                     sram_bytes_used=int(comp.alloc.next_word * npu.word_bytes),
                     sram_bytes={k: int(v) for k, v in comp.alloc.used.items()},
                     instructions=len(comp.program))
    first = None
    if not match:
        bad = np.argwhere(got != want)[0]
        first = {"index": [int(v) for v in bad], "got": int(got[tuple(bad)]),
                 "want": int(want[tuple(bad)])}
    out = deq.astype(np.float32)
    return SimReport(strategy=strategy, chips=chips, backend=backend, seed=seed, npu=npu,
                     model=model, cycles=cycles,
                     load_cycles=int(sum(s["load_cycles"] for s in stats)), golden_match=match,
                     max_abs=float(np.abs(deq - ref).max()), cosine=cosine, per_chip=[chip],
                     wall_s=sum(s["wall_s"] for s in stats), first_mismatch=first,
                     output=out if x.ndim == 3 else out[0])
