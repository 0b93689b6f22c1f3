"""One collective, checked against the golden model: ``npu collective``.

:func:`run_collective` validates the request and the chips' input buffers, simulates the
collective and compares every chip's output with :func:`sim.golden.collectives.collective` in
MPI rank order, and returns a :class:`CollectiveReport` (its JSON form is documented in
``docs/formats.md``). On a ring it runs on :class:`hw.ring.testbed.RingTestbed`
(:func:`sim.rtl.ring_runner.simulate_collective`: the engines alone). On a torus it runs the
2-D collective's programs (:mod:`sim.compiler.torus_collective`) on the chips of the system,
on the ISS (timed by its cycle model) or the RTL (pysim or Verilator), and reports the
collective's cycles against its algorithm's alpha-beta bound.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from hw.spec import NpuConfig
from hw.spec.collective import CollectiveRequest, word_bytes
from hw.spec.isa import Unit
from hw.spec.ring import check_rtl_chips
from hw.spec.timing.collective import ring_bound_cycles, system_cycles
from hw.spec.topology import Topology

from ..compiler.assembler import Assembler
from ..compiler.torus_collective import Rect, torus_collective
from ..errors import BadInput, Watchdog
from ..golden import collectives as golden
from ..planner.training import parameter_count, plan_training, section_elements
from ..rtl.pysim import SimulationTimeout
from ..rtl.ring_runner import simulate_collective
from ..timing.cycle import time_programs, trace_entries
from .simulate import BACKENDS, run_backend

__all__ = ["CollectiveReport", "run_collective", "run_gradients", "DEFAULT_MAX_CYCLES"]

DEFAULT_MAX_CYCLES = 2_000_000


@dataclass
class CollectiveReport:
    """What one ``npu collective`` run measured (``to_json()`` is the ``--json`` report). On a
    torus (``topology``): ``first``, ``count`` are the rectangle's first chip and chips,
    ``rect`` its ``(x0, y0, w, h)``, ``cycles`` the collective's (the first COLL's launch to the
    last member's engine idle), ``model_cycles`` the ISS's cycle model's."""

    kind: str
    op: str
    chips: int
    width: int
    first: int
    count: int
    length: int
    seed: int
    npu: NpuConfig
    cycles: int
    model_cycles: int
    bound_cycles: int
    mismatches: list[str]
    wall_s: float
    cycles_per_s: float
    outputs: list[np.ndarray] = field(repr=False)
    topology: str | None = None
    rect: tuple | None = None
    algorithm: str | None = None
    backend: str = "pysim"
    #: A model's gradient all-reduce (:func:`run_gradients`): its sections' lengths, and the
    #: planner's prediction (:func:`sim.planner.training.plan_training`).
    sections: list[int] = field(default_factory=list)
    predicted_cycles: int | None = None

    @property
    def golden_match(self) -> bool:
        return not self.mismatches

    @property
    def bytes(self) -> int:
        length = self.length * self.count if self.kind == "all_gather" else self.length
        return length * self.width // 8

    @property
    def ratio(self) -> float | None:
        return self.cycles / self.bound_cycles if self.bound_cycles else None

    def to_json(self) -> dict:
        npu = self.npu
        return {
            "kind": self.kind, "op": self.op, "chips": self.chips, "width": self.width,
            "group": {"first": self.first, "count": self.count}, "length": self.length,
            "seed": self.seed, "npu": npu.name, "cycles": self.cycles, "bytes": self.bytes,
            "link_bytes_per_cycle": npu.link_bytes_per_cycle,
            "link_latency_cycles": npu.link_latency_cycles,
            "link_bidirectional": npu.link_bidirectional,
            "model_cycles": self.model_cycles, "bound_cycles": self.bound_cycles,
            "ratio": self.ratio, "golden_match": self.golden_match,
            "mismatches": self.mismatches[:10],
            "sim": {"wall_s": self.wall_s, "cycles_per_s": self.cycles_per_s},
            "backend": self.backend, "topology": self.topology,
            "rect": list(self.rect) if self.rect else None, "algorithm": self.algorithm,
            "sections": list(self.sections), "predicted_cycles": self.predicted_cycles,
        }

    def summary(self) -> str:
        ratio = f"{self.ratio:.3f}" if self.bound_cycles else "n/a"
        where = f" of the {self.topology} torus ({self.algorithm})" if self.topology else ""
        lines = [f"{self.kind} {self.op} int{self.width} on {self.count}{where} of {self.chips} "
                 "chips, "
                 f"{self.length} elements ({self.bytes} B): {self.cycles} cycles, bound "
                 f"{self.bound_cycles}, ratio {ratio}, golden "
                 f"{'match' if self.golden_match else 'MISMATCH'}"]
        if self.sections:
            lines.append(f"  in {len(self.sections)} section(s) of {max(self.sections):,} "
                         f"elements or fewer; the planner predicted "
                         f"{self.predicted_cycles:,} cycles")
        lines += [f"  {line}" for line in self.mismatches[:10]]
        return "\n".join(lines)


def random_buffers(chips: int, length: int, width: int, seed: int) -> np.ndarray:
    """[chips, length] random int32 or int64 buffers over the whole range, from ``seed``."""
    dtype = np.int32 if width == 32 else np.int64
    info = np.iinfo(dtype)
    return np.random.default_rng(seed).integers(info.min, info.max, size=(chips, length),
                                                dtype=dtype, endpoint=True)


def run_collective(npu: NpuConfig, *, kind: str, op: str = "sum", chips: int, width: int = 32,
                   first: int = 0, count: int | None = None, x=None, seed: int = 0,
                   max_cycles: int = DEFAULT_MAX_CYCLES, backend: str | None = None,
                   rect=None, algorithm: str = "auto") -> CollectiveReport:
    """Simulate one collective on ``chips`` chips and compare it with the golden model.

    ``x`` is [chips, length] integers, row i chip i's buffer (for all-gather its block, so the
    result has ``length * count`` elements); without it the buffers are random from ``seed``
    (``4 * chips + 3`` elements). The group is ``count`` consecutive chips from ``first``
    (default: the whole ring). Raises :class:`~sim.errors.BadInput` for a request or buffers
    the ring cannot run and :class:`~sim.errors.Watchdog` past ``max_cycles``.

    On a torus (``npu.topology``): the 2-D collective over ``rect`` (``(x0, y0, w, h)``,
    default the whole torus; ``algorithm`` as :func:`sim.compiler.torus_collective
    .torus_collective`'s) on ``backend`` (``iss``, ``pysim`` or ``verilator``; default ``iss``);
    row ``i`` of ``x`` is chip ``i``'s buffer (chips outside the rectangle: ignored).
    """
    if not isinstance(npu, NpuConfig):
        raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
    if npu.topology is not None and npu.topology.is_torus:
        return _run_chips(npu, npu.topology, kind=kind, op=op, width=width, x=x, seed=seed,
                          max_cycles=max_cycles, backend=backend or "iss", rect=rect,
                          algorithm=algorithm)
    if backend in ("iss", "verilator"):
        # A ring's collective on its chips: every chip of the ring, in chunks.
        if first != 0 or count not in (None, chips):
            raise BadInput("--group runs on the ring testbed (pysim); on the chips "
                           "(--backend iss|verilator) the collective takes every chip")
        try:
            topo = Topology.ring(chips)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        return _run_chips(dataclasses.replace(npu, topology=topo), topo, kind=kind, op=op,
                          width=width, x=x, seed=seed, max_cycles=max_cycles, backend=backend,
                          rect=None, algorithm=algorithm)
    try:
        word_bytes(npu.link_bytes_per_cycle)
    except ValueError as exc:
        raise BadInput(f"{exc} ({npu.path})") from None
    count = chips if count is None else count
    try:
        check_rtl_chips(chips, "the ring testbed")
    except (TypeError, ValueError) as exc:
        raise BadInput(str(exc)) from None
    x = random_buffers(chips, 4 * chips + 3, width, seed) if x is None else np.asarray(x)
    dtype = np.int32 if width == 32 else np.int64
    if x.ndim != 2 or x.shape[0] != chips:
        raise BadInput(f"input has shape {x.shape}; expected [{chips}, length] (one row per "
                       "chip, all rows the same length)")
    if x.shape[1] == 0:
        raise BadInput("input has zero length")
    if x.dtype.kind not in "iu":
        raise BadInput(f"input has dtype {x.dtype}; expected an integer array")
    info = np.iinfo(dtype)
    if x.size and (x.min() < info.min or x.max() > info.max):
        raise BadInput(f"input has values outside int{width} [{x.min()}, {x.max()}]; "
                       "use 64-bit elements (width=64, --width 64)")
    x = x.astype(dtype)
    length = x.shape[1]
    req_length = length * count if kind == "all_gather" else length
    try:
        req = CollectiveRequest(kind=kind, op=op, width=width, length=req_length, chips=chips,
                                first=first, count=count)
    except (TypeError, ValueError) as exc:
        raise BadInput(str(exc)) from None
    inputs = [np.asarray(row) for row in x]
    try:
        run = simulate_collective(npu, req, inputs, max_cycles=max_cycles)
    except SimulationTimeout as exc:
        raise Watchdog(str(exc)) from None
    except ValueError as exc:       # a block larger than the engine's buffers
        raise BadInput(str(exc)) from None
    expected = golden.collective(req, inputs)
    mismatches = []
    for chip, (got, want) in enumerate(zip(run["outputs"], expected, strict=True)):
        if got.shape != want.shape:
            mismatches.append(f"chip {chip}: {got.shape[0]} elements, expected {want.shape[0]}")
        elif not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            mismatches.append(f"chip {chip} element {bad}: {got[bad]} != golden {want[bad]}")
    link, latency = npu.link_bytes_per_cycle, npu.link_latency_cycles
    message_bytes = req.length * width // 8
    bound = ring_bound_cycles(req.kind, message_bytes, count, link, latency) if count > 1 else 0
    return CollectiveReport(
        kind=kind, op=op, chips=chips, width=width, first=first, count=count, length=length,
        seed=seed, npu=npu, cycles=run["cycles"],
        model_cycles=system_cycles(req, link, latency, npu.link_bidirectional),
        bound_cycles=bound, mismatches=mismatches, wall_s=run["sim"]["wall_s"],
        cycles_per_s=run["sim"]["cycles_per_s"], outputs=run["outputs"])


def _span(chips_timing) -> int:
    """Cycles from the first cycle any chip's collective unit is busy to the last (the
    collective's, without the program's SETs before it)."""
    starts, ends = [], []
    for chip in chips_timing:
        entries = chip["trace"]["entries"]
        on = [c for c, busy in entries if busy & 8]
        off = [c for (c, busy), (_, prev) in zip(entries[1:], entries, strict=False)
               if prev & 8 and not busy & 8]
        if on:
            starts.append(on[0])
            ends.append(off[-1] if off else chip["cycles"])
    return max(ends) - min(starts) if starts else 0


def _run_chips(npu, topo, *, kind, op, width, x, seed, max_cycles, backend, rect, algorithm):
    """The collective's programs (:mod:`sim.compiler.torus_collective`) on the chips of
    ``topo`` (a torus, or a ring) on ``backend``."""
    if backend not in BACKENDS:
        raise BadInput(f"--backend {backend!r} is not one of {', '.join(BACKENDS)}")
    chips = topo.chips
    try:
        rect = Rect.whole(topo) if rect is None else Rect(*rect)
        rect.check(topo)
    except (TypeError, ValueError) as exc:
        raise BadInput(f"--rect {exc}") from None
    n = rect.count
    dtype = np.int32 if width == 32 else np.int64
    x = random_buffers(chips, 4 * n + 3, width, seed) if x is None else np.asarray(x)
    if x.ndim != 2 or x.shape[0] != chips or x.shape[1] == 0:
        raise BadInput(f"input has shape {x.shape}; expected [{chips}, length] (one row per "
                       "chip, all rows the same length)")
    info = np.iinfo(dtype)
    if x.dtype.kind not in "iu" or (x.min() < info.min or x.max() > info.max):
        raise BadInput(f"input must be integers within int{width}")
    members = rect.members(topo)
    length = x.shape[1] * n if kind == "all_gather" else x.shape[1]
    size, link = npu.array_size, npu.link_bytes_per_cycle
    try:
        plan = torus_collective(kind, op, width, length, topo, rect=rect, base=0, size=size,
                                link_bytes=link, algorithm=algorithm)
        if len(plan.halves) == 2:
            # The second half in its own bank, when it fits: the two engines' streams then do
            # not share a bank's ports.
            bank = npu.bank_words
            start = -(-plan.half_words // bank) * bank
            if start + plan.buffer_words - plan.half_words <= npu.sram_words:
                plan = torus_collective(kind, op, width, length, topo, rect=rect, base=0,
                                        size=size, link_bytes=link, algorithm=algorithm,
                                        half_base=start)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if plan.buffer_words > npu.sram_words:
        raise BadInput(f"the collective's buffer of {plan.buffer_words} words exceeds the "
                       f"scratchpad's {npu.sram_words} words (sram_bytes={npu.sram_bytes})")
    sizes = [len(b) for b in np.array_split(np.zeros(length), n)]
    vectors = []
    for rank, c in enumerate(members):
        row = x[c].astype(dtype)
        vectors.append(row[:sizes[rank]] if kind == "all_gather" else row)
    programs, images, reads = [], [], []
    for c in range(chips):
        asm = Assembler()
        rank = plan.rank(c)
        if rank is not None:
            plan.emit(asm, c, link)
            asm.wait(Unit.ALL)
        asm.halt()
        programs.append(asm.words())
        images.append({} if rank is None else {0: plan.pack_input(c, vectors[rank])})
        reads.append([] if rank is None else [(0, plan.buffer_words)])
    run = run_backend(backend, npu, programs, images, reads, max_cycles=max_cycles)
    outputs, mismatches = [], []
    req = CollectiveRequest(kind=kind, op=op, width=width, length=length, chips=n)
    expected = golden.collective(req, vectors)
    for c in range(chips):
        rank = plan.rank(c)
        if rank is None:
            outputs.append(np.zeros(0, dtype))
            continue
        got = plan.unpack_output(c, run["regions"][c][0])
        outputs.append(got)
        want = expected[rank]
        if got.shape != want.shape:
            mismatches.append(f"chip {c} (rank {rank}): {got.shape[0]} elements, expected "
                              f"{want.shape[0]}")
        elif not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            mismatches.append(f"chip {c} (rank {rank}) element {bad}: {got[bad]} != golden "
                              f"{want[bad]}")
    cycles = _span(run["chips"])
    if backend == "iss":
        model = cycles
    else:
        timed = time_programs(npu, programs, topology=topo, max_cycles=max_cycles)
        model = _span([{"cycles": t.cycles, "trace": trace_entries(npu, t.trace)}
                       for t in timed.chips])
    wall = run["wall_s"]
    return CollectiveReport(
        kind=kind, op=op, chips=chips, width=width, first=members[0], count=n,
        length=x.shape[1], seed=seed, npu=npu, cycles=cycles, model_cycles=model,
        bound_cycles=plan.bound_cycles(npu), mismatches=mismatches, wall_s=wall,
        cycles_per_s=run["cycles"] / wall if wall else 0.0, outputs=outputs,
        topology=str(topo) if topo.is_torus else None,
        rect=(rect.x0, rect.y0, rect.w, rect.h) if topo.is_torus else None,
        algorithm=plan.algorithm, backend=backend)


def run_gradients(npu: NpuConfig, model, *, chips: int, seed: int = 0,
                  max_cycles: int = DEFAULT_MAX_CYCLES, backend: str = "iss",
                  algorithm: str = "auto") -> CollectiveReport:
    """Training's gradient all-reduce of ``model``: int32 SUM of one element per parameter
    (:func:`sim.planner.training.parameter_count`) over every chip (the NPU's torus, or a ring
    of ``chips``), on the chips of ``backend``, in the planner's sections (each as much of the
    gradients as the scratchpad holds: the host loads each section and reads it back, load
    cycles excluded as everywhere). The report's ``cycles`` are the sections' collectives'
    added up, its ``predicted_cycles`` the planner's for the same algorithm."""
    topo = npu.topology if npu.topology is not None else Topology.ring(chips)
    params = parameter_count(model)
    section = section_elements(npu)
    lengths = [section] * (params // section) + ([params % section] if params % section else [])
    if not topo.is_torus:
        npu = dataclasses.replace(npu, topology=topo)
    runs = [_run_chips(npu, topo, kind="all_reduce", op="sum", width=32, x=random_buffers(
        topo.chips, n, 32, seed + k), seed=seed + k, max_cycles=max_cycles, backend=backend,
        rect=None, algorithm=algorithm) for k, n in enumerate(lengths)]
    label = "1-D ring" if not topo.is_torus else f"2-D {runs[0].algorithm}"
    predicted = next((p.cycles for p in plan_training(npu, model, topo)
                      if p.algorithm == label), None)
    first = runs[0]
    return dataclasses.replace(
        first, length=params, cycles=sum(r.cycles for r in runs),
        model_cycles=sum(r.model_cycles for r in runs),
        bound_cycles=sum(r.bound_cycles for r in runs),
        mismatches=[f"section {k}: {m}" for k, r in enumerate(runs) for m in r.mismatches],
        wall_s=sum(r.wall_s for r in runs), outputs=[], sections=lengths,
        predicted_cycles=predicted)
