"""``npu sim`` as a function: quantise, compile for N chips, simulate, compare with the golden.

:func:`simulate` is what the CLI, the benchmarks and a notebook call. It refuses what the chips
cannot run with :class:`~sim.errors.BadInput` (or :class:`hw.spec.ConfigError` for a limit of a
configuration) before any work, and ends a run past its cycle budget with
:class:`~sim.errors.Watchdog` (a deadlock on the ISS: :class:`~sim.errors.BadInput` naming the
waiting chips, since the programs themselves cannot meet).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from hw.spec import QUANT_SCHEMES, ConfigError, ModelConfig, NpuConfig
from hw.spec.isa import BUSY_COUNTERS
from hw.spec.timing.collective import ring_bound_cycles
from hw.spec.topology import system_topology

from .. import strategies
from ..compiler.program import SystemProgram
from ..compiler.quantize import dequantize_residual, quantize_input, quantize_model
from ..errors import BadInput, Watchdog
from ..golden.float_model import check_weights, model_forward, random_weights
from ..golden.layer import model_int
from ..iss import IssError, IssSystem
from ..report.core import UNITS, ChipStats, SimReport
from ..report.timeline import intervals
from ..rtl.chip_runner import run_chip_pysim
from ..rtl.pysim import SimulationTimeout
from ..rtl.system_runner import run_system_pysim
from ..rtl.toolchain import ToolchainMissing
from ..rtl.verilator.runner import run_system_verilator
from ..timing.cycle import time_programs, trace_entries

__all__ = ["simulate", "run_backend", "read_outputs", "STRATEGIES", "BACKENDS",
           "DEFAULT_MAX_CYCLES", "check_input"]

#: The strategies' names (``sim.strategies``, the registry).
STRATEGIES = strategies.NAMES
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


def run_backend(backend, npu, programs, images, reads, *, max_cycles, vcd=None,
                link_stalls=0.0, seed=0, progress=None, board=None) -> dict:
    """Load ``images`` and ``programs`` (per chip), run them on ``backend`` and read
    ``reads`` back (per chip, ``(base, words)`` regions): ``{"regions"`` (per chip, per
    region), ``"cycles"``, ``"chips"`` (per chip its ``cycles``, ``busy`` counters and
    ``trace``), ``"wall_s"}``. The ISS is timed by its cycle model (the RTL's cycles)."""
    n_chips = len(programs)
    topo = system_topology(npu, n_chips)
    if backend == "iss":
        system = IssSystem(npu, n_chips, topo)
        for iss, img in zip(system.chip, images, strict=True):
            for base, words in img.items():
                iss.write_words(base, words)
        start = time.perf_counter()
        try:
            system.run(programs)
        except IssError as exc:
            raise BadInput(f"the programs cannot run: {exc}") from None
        # The same programs through the ISS's cycle model: the RTL's cycles, busy counters
        # and traces (one chip alone as chip_runner runs it, several on ChipSystem's ring or
        # torus).
        try:
            timed = time_programs(npu, programs, ring=n_chips > 1, max_cycles=max_cycles,
                                  topology=topo)
        except IssError as exc:
            raise Watchdog(str(exc)) from None
        wall = time.perf_counter() - start
        regions = [[system.chip[c].read_words(b, w) for b, w in reads[c]]
                   for c in range(n_chips)]
        chips = [{"cycles": t.cycles, "busy": t.busy, "trace": trace_entries(npu, t.trace)}
                 for t in timed.chips]
        return {"regions": regions, "cycles": timed.cycles, "chips": chips, "wall_s": wall}
    if n_chips == 1 and backend in ("pysim", "board"):
        try:
            if backend == "pysim":
                out = run_chip_pysim(npu, programs[0], images[0], reads[0],
                                     max_cycles=max_cycles, vcd=vcd, progress=progress)
            else:
                out = board.run_chip(npu, programs[0], images[0], reads[0],
                                     max_cycles=max_cycles)
        except SimulationTimeout as exc:
            raise Watchdog(str(exc)) from None
        if out["error"]:
            raise BadInput("the chip halted on an unknown instruction (compiler bug)")
        return {"regions": [out["regions"]], "cycles": out["cycles"], "wall_s": out["wall_s"],
                "chips": [{"cycles": out["cycles"], "busy": out["busy_cycles"],
                           "trace": out["trace"]}]}
    # pysim on several chips; verilator on any number (ChipSystem and its C++ harness).
    try:
        if backend == "pysim":
            out = run_system_pysim(npu, programs, images, reads, max_cycles=max_cycles,
                                   vcd=vcd, link_stalls=link_stalls, seed=seed,
                                   progress=progress, topology=topo)
        else:
            out = run_system_verilator(npu, programs, images, reads, max_cycles=max_cycles,
                                       link_stalls=link_stalls, seed=seed, topology=topo)
    except SimulationTimeout as exc:
        raise Watchdog(str(exc)) from None
    except ToolchainMissing as exc:
        raise BadInput(f"--backend verilator: {exc}") from None
    if any(out["errors"]):
        raise BadInput("a chip halted on an unknown instruction (compiler bug)")
    return {"regions": out["regions"], "cycles": out["cycles"], "wall_s": out["wall_s"],
            "chips": [{"cycles": c, "busy": b, "trace": t}
                      for c, b, t in zip(out["chip_cycles"], out["busy_cycles"],
                                         out["traces"], strict=True)]}


def read_outputs(prog: SystemProgram, regions) -> list[np.ndarray]:
    """Each sample's int16 output from the regions read back per chip (``prog.reads()``
    order): each chip's regions in the order they were asked for."""
    taken = [0] * len(prog.chips)
    outputs = []
    for sample, out in enumerate(prog.outputs):
        parts = []
        for place in out if isinstance(out, (list, tuple)) else [out]:
            parts.append(regions[place.chip][taken[place.chip]])
            taken[place.chip] += 1
        outputs.append(prog.read(sample, parts))
    return outputs


def _run(backend, prog: SystemProgram, x_ints, *, max_cycles, vcd, link_stalls, seed,
         progress=None, board=None):
    """Load, run and read back ``prog`` on ``backend``: the int16 outputs per sample and what
    the chips measured (``cycles`` None on the ISS)."""
    images = prog.images(x_ints)
    programs = [c.program for c in prog.chips]
    reads = prog.reads()
    load = sum(len(p) for p in programs) + sum(len(w) for img in images for w in img.values())
    res = run_backend(backend, prog.npu, programs, images, reads, max_cycles=max_cycles,
                      vcd=vcd, link_stalls=link_stalls, seed=seed, progress=progress,
                      board=board)
    res["outputs"] = read_outputs(prog, res.pop("regions"))
    res["load_cycles"] = load
    return res


def _chip_stats(prog: SystemProgram, res) -> list[ChipStats]:
    stats = []
    for c, (chip, measured) in enumerate(zip(prog.chips, res["chips"], strict=True)):
        counts = dict(zip(BUSY_COUNTERS, measured["busy"], strict=True))
        busy = {u: int(counts[u]) for u in UNITS}
        timed = res["cycles"] is not None
        busy["idle"] = int(res["cycles"] - counts["any"]) if timed else 0
        stats.append(ChipStats(
            chip=c, busy=busy, overlap_cycles=int(sum(busy[u] for u in UNITS) - counts["any"]),
            sram_bytes_used=int(chip.alloc.next_word * prog.npu.word_bytes),
            sram_bytes={k: int(v) for k, v in chip.alloc.used.items()},
            instructions=len(chip.program), compute_cycles=int(counts["compute"]),
            role=dict(chip.role)))
    return stats


#: The collectives a program's ``comms`` name (each one COLL on every chip of its group).
COLLECTIVE_KINDS = ("all_reduce", "reduce_scatter", "all_gather")


def _comms(prog: SystemProgram, res, spans) -> list[dict]:
    """The program's collectives and transfers with the cycles they took (from the traces)."""
    npu = prog.npu
    topo = system_topology(npu, len(prog.chips))

    def link_of(dim):
        """The links a collective or transfer along ``dim`` uses (a torus's own per
        dimension; None: the NPU's)."""
        if dim is None or not topo.is_torus:
            return npu.link_bytes_per_cycle, npu.link_latency_cycles
        one = topo.link(dim, npu)
        return one.bytes_per_cycle, one.latency_cycles
    # A chip's k-th collective interval is the k-th collective it is a member of (a chip
    # may be a member of several groups: hidden parallelism's head groups and whole ring).
    out, seen = [], {"coll": [0] * len(prog.chips), "send": {}}
    for comm in prog.comms:
        entry = dict(comm)
        if comm["kind"] in COLLECTIVE_KINDS:
            first, count = comm["group"]
            entry["links"] = topo.group_links((first + j) % len(prog.chips)
                                              for j in range(count))
        elif comm["kind"] == "send":
            entry["links"] = topo.route_links(comm["from"], comm["to"])
        if spans is not None and comm["kind"] in COLLECTIVE_KINDS:
            first, count = comm["group"]
            members = [(first + j) % len(prog.chips) for j in range(count)]
            ivs = []
            for m in members:
                ivs.append(spans[m]["collective"][seen["coll"][m]])
                seen["coll"][m] += 1
            entry["start"] = min(s for s, _ in ivs)
            entry["cycles"] = max(e for _, e in ivs) - entry["start"]
            link, lat = link_of(topo.ring_of(members) if topo.is_torus else None)
            entry["bound_cycles"] = ring_bound_cycles(comm["kind"], comm["bytes"], count, link,
                                                      lat)
            entry["ratio"] = entry["cycles"] / entry["bound_cycles"]
        elif spans is not None and comm["kind"] == "send":
            src = comm["from"]
            k = seen["send"].get(src, 0)
            seen["send"][src] = k + 1
            s, e = spans[src]["send"][k]
            entry["start"] = s
            entry["cycles"] = e - s
            # One hop: the bytes at the link's width plus its latency.
            hops = topo.hops(src, comm["to"])
            link, lat = link_of(next((d for d, h in enumerate(hops) if h), None))
            entry["bound_cycles"] = -(-comm["bytes"] // link) + lat
            entry["ratio"] = entry["cycles"] / entry["bound_cycles"]
        out.append(entry)
    return out


def simulate(npu: NpuConfig, model: ModelConfig, *, strategy: str = "single",
             chips: int | None = None,
             backend: str = "pysim", seed: int = 0, weights: dict | None = None, x=None,
             calib=None, batch: int | None = None, microbatches: int | None = None,
             max_cycles: int | None = None, vcd: str | None = None,
             link_stalls: float = 0.0, progress=None, reference: str = "auto",
             grid: str | None = None, quant: str | None = None, board=None,
             reduce: str | None = None, order: str | None = None) -> SimReport:
    """Compile ``model`` for ``chips`` chips of ``npu`` with ``strategy`` and simulate it
    (``chips`` defaults to the grid's A x B, or 1).

    ``weights``: float arrays by the names of ``docs/formats.md`` (default: random from ``seed``).
    ``x``: float [seq, d_model] or [batch, seq, d_model] (default: random from ``seed``, ``batch``
    sequences). ``calib``: activations that calibrate the scales (default: ``x``). ``backend``:
    ``iss`` (timed by its cycle model), ``pysim`` or ``verilator``. ``grid``: ``"AxB"`` for the 2-D
    strategies (the first part A chips, the second B). ``microbatches``: strategies with a pipeline
    (default ``min(batch, stages)`` per data replica). ``link_stalls``: the probability per cycle of
    a stall on each link register (pysim or verilator, several chips), from ``seed`` (each backend
    draws its own pattern: the same integers, other cycle counts). ``vcd`` writes a waveform (pysim
    only). ``progress(cycles)`` is called while a simulation runs (and its ``close()`` after, if it
    has one). Every output integer is compared with the integer golden model.

    ``quant``: the quantisation scheme (``int8``, ``smooth16`` or ``llm16``, ``docs/formats.md``)
    instead of the model's ``quant``.

    ``reference``: how a multi-chip run measures one chip's cycles for the same model and
    batch (its ``speedup``): ``"same"`` simulates the single-chip program on ``backend`` too,
    ``"none"`` skips it, ``"auto"`` is ``"same"`` except on pysim, where one chip takes as
    long as the whole multi-chip run again. A model that does not fit one chip has none.

    ``backend="board"`` runs the one chip on an FPGA board: ``board`` is a
    :class:`sim.flows.board.BoardDriver` (``npu board``, :func:`sim.flows.board.run_board`).

    ``reduce``: hidden parallelism only, how the projections' partial sums are reduced
    (``"reduce_scatter"``, the default, or ``"all_reduce"``; ``sim.compiler.hidden``).
    ``order``: sequence parallelism only, the tokens' order over the chips (``auto``,
    ``plain`` or ``zigzag``; ``sim.compiler.sequence.compile_sequence``).
    """
    if not isinstance(npu, NpuConfig):
        raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
    if not isinstance(model, ModelConfig):
        raise TypeError(f"model must be a ModelConfig, not {model!r}")
    try:
        strat = strategies.get(strategy)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if backend == "board":
        if board is None or not strat.one_chip or chips not in (None, 1):
            raise BadInput("backend board runs strategy single on one chip, with a board "
                           "driver")
    elif backend not in BACKENDS:
        raise BadInput(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if vcd and backend != "pysim":
        raise BadInput(f"--vcd needs --backend pysim, not {backend}")
    if chips is None:
        try:
            chips = strat.chips_of(grid)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
    try:
        system_topology(npu, chips)        # a topology that does not fit: bad input
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if not 0.0 <= link_stalls < 1.0:
        raise BadInput(f"--link-stalls {link_stalls} is outside [0, 1)")
    if link_stalls and (chips == 1 or backend == "iss"):
        raise BadInput("--link-stalls applies to --backend pysim with --chips > 1 (and to "
                       "verilator)")
    max_cycles = max_cycles or DEFAULT_MAX_CYCLES
    if quant is not None:
        if quant not in QUANT_SCHEMES:
            raise BadInput(f"--quant {quant!r} is not one of {', '.join(QUANT_SCHEMES)}")
        model = dataclasses.replace(model, quant=quant)
    # Refuse what a chip cannot run before any work (the compiler checks again): the options
    # the strategy takes, and each chip's share of the model.
    try:
        strat.check_options(chips=chips, microbatches=microbatches, grid=grid, reduce=reduce,
                            order=order)
        strat.check_quant(model.quant)
        strat.check(npu, model, chips, grid)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise BadInput(str(exc)) from None
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
    calib = x if calib is None else check_input(model, calib, "calib")
    qm = quantize_model(model, weights, calib)
    samples = x if x.ndim == 3 else x[None]
    try:
        prog = strat.compile(npu, qm, chips, seq=samples.shape[1], samples=len(samples),
                             microbatches=microbatches, grid=grid, reduce=reduce,
                             order=order)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise BadInput(str(exc)) from None
    x_ints = [quantize_input(qm, s) for s in samples]
    try:
        res = _run(backend, prog, x_ints, max_cycles=max_cycles, vcd=vcd,
                   link_stalls=link_stalls, seed=seed, progress=progress, board=board)
    finally:
        if hasattr(progress, "close"):
            progress.close()
    got = np.stack(res["outputs"])
    # Long context in passes: the golden merges the key chunks in the program's order.
    kv_order = prog.meta.get("kv_order")
    want = np.stack([model_int(qm, xi, kv_order=kv_order) for xi in x_ints])
    ref = np.stack([model_forward(model, weights, s) for s in samples])
    match = bool((got == want).all())
    deq = dequantize_residual(qm, got)
    cosine = float((deq * ref).sum() / (np.linalg.norm(deq) * np.linalg.norm(ref) or 1.0))
    stats = _chip_stats(prog, res)
    spans = None
    if res["cycles"] is not None:
        spans = [intervals(c["trace"]["entries"], c["cycles"]) for c in res["chips"]]
    first = None
    if not match:
        bad = np.argwhere(got != want)[0]
        first = {"index": [int(v) for v in bad], "got": int(got[tuple(bad)]),
                 "want": int(want[tuple(bad)])}
    out = deq.astype(np.float32)
    report = SimReport(
        strategy=strategy, chips=chips, backend=backend, seed=seed, npu=npu, model=model,
        cycles=res["cycles"], load_cycles=res["load_cycles"], golden_match=match,
        max_abs=float(np.abs(deq - ref).max()), cosine=cosine, per_chip=stats,
        wall_s=res["wall_s"], first_mismatch=first, output=out if x.ndim == 3 else out[0],
        collectives=_comms(prog, res, spans), spans=spans, samples=len(samples))
    grid_meta = prog.meta.get("grid")         # the strategies of sim.compiler.grid
    report.grid = dict(grid_meta) if grid_meta else None
    for section, info in strat.sections(prog, report.collectives, res, spans).items():
        setattr(report, section, info)
    if reference not in ("auto", "same", "none"):
        raise BadInput(f"reference {reference!r} is not one of auto, same, none")
    if chips > 1 and res["cycles"] is not None and (
            reference == "same" or (reference == "auto" and backend != "pysim")):
        report.reference = _reference(strat, npu, qm, samples.shape[1], x_ints, backend,
                                      max_cycles)
    return report


def _reference(strat, npu, qm, seq, x_ints, backend, max_cycles) -> dict:
    """One chip's cycles for the same model and batch, simulated on ``backend`` (the program
    the strategy measures its speed-up against: sequence parallelism's runs in passes on one
    chip when the sequence exceeds ``max_seq_len``)."""
    # One chip alone: the system's topology is not its.
    npu = dataclasses.replace(npu, topology=None)
    prog, how = strat.reference_program(npu, qm, seq=seq, samples=len(x_ints))
    if prog is None:
        return {"cycles": None, "source": how}
    res = _run(backend, prog, x_ints, max_cycles=max_cycles, vcd=None, link_stalls=0.0, seed=0)
    return {"cycles": res["cycles"],
            "source": f"one chip simulated on {backend} in the same run{how}"}
