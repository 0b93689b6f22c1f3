"""One collective on the ring testbed, checked against the golden model: ``npu collective``.

:func:`run_collective` validates the request and the chips' input buffers, simulates the collective
on :class:`hw.ring.testbed.RingTestbed` (:func:`sim.rtl.ring_runner.simulate_collective`), compares
every chip's output with :func:`sim.golden.collectives.collective` and returns a
:class:`CollectiveReport` (its JSON form is documented in ``docs/formats.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hw.spec import NpuConfig
from hw.spec.collective import CollectiveRequest, word_bytes
from hw.spec.ring import check_rtl_chips
from hw.spec.timing.collective import ring_bound_cycles, system_cycles

from ..errors import BadInput, Watchdog
from ..golden import collectives as golden
from ..rtl.pysim import SimulationTimeout
from ..rtl.ring_runner import simulate_collective

__all__ = ["CollectiveReport", "run_collective", "DEFAULT_MAX_CYCLES"]

DEFAULT_MAX_CYCLES = 2_000_000


@dataclass
class CollectiveReport:
    """What one ``npu collective`` run measured (``to_json()`` is the ``--json`` report)."""

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
        }

    def summary(self) -> str:
        ratio = f"{self.ratio:.3f}" if self.bound_cycles else "n/a"
        lines = [f"{self.kind} {self.op} int{self.width} on {self.count} of {self.chips} chips, "
                 f"{self.length} elements ({self.bytes} B): {self.cycles} cycles, bound "
                 f"{self.bound_cycles}, ratio {ratio}, golden "
                 f"{'match' if self.golden_match else 'MISMATCH'}"]
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
                   max_cycles: int = DEFAULT_MAX_CYCLES) -> CollectiveReport:
    """Simulate one collective on ``chips`` chips and compare it with the golden model.

    ``x`` is [chips, length] integers, row i chip i's buffer (for all-gather its block, so the
    result has ``length * count`` elements); without it the buffers are random from ``seed``
    (``4 * chips + 3`` elements). The group is ``count`` consecutive chips from ``first``
    (default: the whole ring). Raises :class:`~sim.errors.BadInput` for a request or buffers
    the ring cannot run and :class:`~sim.errors.Watchdog` past ``max_cycles``.
    """
    if not isinstance(npu, NpuConfig):
        raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
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
