"""Run one program per chip on a ring or a torus of Verilated :class:`hw.system.ChipNode` models
from the C++ harness (the chips and links of :class:`hw.system.ChipSystem`, one model per
chip): the contract of :func:`sim.rtl.system_runner.run_system_pysim`, with no Python per
cycle.

The job goes to the harness as a binary file and the results come back as one (both
little-endian, 8-byte fields; ``harness.cpp`` reads and writes them):

- job: ``b"NPUJOB03"``, chips, word_bytes, max_cycles, seed, bare_cycles, flags (bit 0: test
  at every settle that the links' signals need no second pass, ``check_cut``), the chips of a
  row (a ring: all of them; a torus: X), link-stall probability (float64); then per chip:
  the program (count, 64-bit words), the images (count; per image base, words, ``words *
  word_bytes`` bytes) and the reads (count; base, words).
- result: ``b"NPURES03"``, status (0 done, 1 watchdog, 2 bare loop). Bare: cycles, wall s.
  Otherwise: cycles, run cycles, load cycles, then per chip its cycles, done, error, pc, busy
  vector and ``len(BUSY_COUNTERS)`` counters; when done, per chip the trace (count, overflow,
  ``(cycle, busy)`` pairs), then every read's bytes; last the total cycles clocked and the
  load, run and read-back wall seconds (float64).

Link stalls come from the harness's own seeded generator (xoshiro256**), not NumPy's: the
results are the same integers as pysim's, the cycle counts those of another stall pattern
(in each cycle, the bits of ChipSystem's ``link_stall`` are drawn in order: on a torus the
row links' bits first, then the column links').
"""

from __future__ import annotations

import dataclasses
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from hw.spec import NpuConfig
from hw.spec.isa import BUSY_COUNTERS
from hw.spec.topology import Topology

from ..chip_runner import busy_units
from ..pysim import SimulationTimeout
from ..system_runner import check_system_inputs
from .build import Build, ensure_build

__all__ = ["run_system_verilator", "run_bare_loop", "HarnessFailed"]


class HarnessFailed(RuntimeError):
    """The harness executable failed (a bad job file, a crash); the message has its stderr."""


def _job(npu: NpuConfig, programs, images, reads, *, max_cycles: int, seed: int,
         link_stalls: float, bare: int = 0, check_cut: bool = False,
         row: int | None = None) -> bytes:
    n = npu.word_bytes
    parts = [b"NPUJOB03", struct.pack("<7Qd", len(programs), n, max_cycles,
                                      seed % (1 << 64), bare, int(check_cut),
                                      row or len(programs), link_stalls)]
    for program, image, read in zip(programs, images, reads, strict=True):
        parts += [struct.pack("<Q", len(program)),
                  np.asarray(program, dtype=np.uint64).astype("<u8").tobytes()]
        parts.append(struct.pack("<Q", len(image)))
        for base, words in image.items():
            words = np.ascontiguousarray(words, dtype=np.uint8).reshape(-1, n)
            parts += [struct.pack("<2Q", base, len(words)), words.tobytes()]
        parts.append(struct.pack("<Q", len(read)))
        parts += [struct.pack("<2Q", base, count) for base, count in read]
    return b"".join(parts)


class _Cursor:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise HarnessFailed("the harness's result file is truncated")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u64(self, count: int | None = None):
        if count is None:
            return struct.unpack("<Q", self.take(8))[0]
        return [int(v) for v in np.frombuffer(self.take(8 * count), "<u8")]

    def f64(self) -> float:
        return struct.unpack("<d", self.take(8))[0]


def _execute(build: Build, job: bytes, timeout: float | None) -> _Cursor:
    with tempfile.TemporaryDirectory(prefix="npu-fast-") as tmp:
        job_path, out_path = Path(tmp) / "job.bin", Path(tmp) / "result.bin"
        job_path.write_bytes(job)
        try:
            proc = subprocess.run([str(build.binary), str(job_path), str(out_path)],
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HarnessFailed(f"{build.binary} ran past {timeout} s") from None
        if proc.returncode != 0 or not out_path.exists():
            raise HarnessFailed(f"{build.binary} exited {proc.returncode}: "
                                f"{(proc.stdout + proc.stderr)[-2000:]}")
        cur = _Cursor(out_path.read_bytes())
    if cur.take(8) != b"NPURES03":
        raise HarnessFailed("the harness's result file has a bad magic")
    return cur


def run_system_verilator(npu: NpuConfig, programs: list[list[int]],
                         images: list[dict[int, np.ndarray]],
                         reads: list[list[tuple[int, int]]], *, max_cycles: int = 1_000_000,
                         link_stalls: float = 0.0, seed: int = 0, check_cut: bool = False,
                         timeout: float | None = None, topology: Topology | None = None) -> dict:
    """Chip ``i`` runs ``programs[i]`` on ``images[i]``; ``reads[i]`` are read back from it.
    The chips are a ring, or ``topology`` (a ring, or a torus: a torus's node, built once for
    every shape, joined along rows and columns).

    The contract of :func:`sim.rtl.system_runner.run_system_pysim` (the same keys, types, and
    for the same job the same integers, cycles, counters and traces), plus ``load_cycles``
    (words written through the host ports), ``build_s`` and ``build_cached`` (the harness's
    build: :func:`sim.rtl.verilator.build.ensure_build`), ``run_wall_s`` and ``run_cycles_per_s``
    (the clock loop from ``start`` to ``done`` alone), ``load_wall_s`` and ``load_clocked``
    (the harness loads every chip at once: the cycles that took) and ``process_s`` (the
    harness process, start to exit). ``wall_s`` and ``cycles_per_s`` cover loading, running
    and reading back, as pysim's do. ``check_cut`` has the harness test, at every settle, that
    the ring's signals between the models need no second pass (why one pass is enough:
    :class:`hw.system.ChipNode`); a path would end the run with :class:`HarnessFailed`. Raises
    :class:`SimulationTimeout` when not every chip is done within ``max_cycles`` cycles, naming
    each unfinished chip's pc and busy units.
    """
    chips = check_system_inputs(npu, programs, images, reads)
    if not 0.0 <= link_stalls < 1.0:
        raise ValueError(f"link_stalls {link_stalls} is outside [0, 1)")
    topology = topology or npu.topology or Topology.ring(chips)
    if topology.chips != chips:
        raise ValueError(f"{chips} programs for the {topology.chips} chips of the {topology}")
    build = ensure_build(dataclasses.replace(npu, topology=topology))
    job = _job(npu, programs, images, reads, max_cycles=max_cycles, seed=seed,
               link_stalls=link_stalls, check_cut=check_cut, row=topology.dims[0])
    start = time.perf_counter()
    cur = _execute(build, job, timeout)
    process_s = time.perf_counter() - start
    status = cur.u64()
    k = len(BUSY_COUNTERS)
    out = {"cycles": cur.u64()}
    ran, load = cur.u64(), cur.u64()
    per_chip = []
    for _ in range(chips):
        cycles, done, error, pc, busy = cur.u64(5)
        per_chip.append({"cycles": cycles, "done": bool(done), "error": bool(error), "pc": pc,
                         "busy": busy, "counters": cur.u64(k)})
    if status == 1:
        waiting = [f"chip {i} at pc {c['pc']} busy with {busy_units(c['busy'])}"
                   for i, c in enumerate(per_chip) if not c["done"]]
        raise SimulationTimeout(f"the chips did not all halt within max_cycles={max_cycles}: "
                                + "; ".join(waiting))
    out["chip_cycles"] = [c["cycles"] for c in per_chip]
    out["busy_cycles"] = [c["counters"] for c in per_chip]
    out["errors"] = [c["error"] for c in per_chip]
    traces = []
    for _ in range(chips):
        count, overflow = cur.u64(2)
        flat = cur.u64(2 * count)
        traces.append({"entries": list(zip(flat[::2], flat[1::2], strict=True)),
                       "overflow": bool(overflow)})
    out["traces"] = traces
    n = npu.word_bytes
    out["regions"] = [[np.frombuffer(cur.take(count * n), np.uint8).reshape(count, n).copy()
                       for _, count in reads[i]] for i in range(chips)]
    ticks = cur.u64()
    load_s, run_s, read_s = cur.f64(), cur.f64(), cur.f64()
    wall = load_s + run_s + read_s
    out.update(
        load_cycles=sum(len(p) for p in programs)
        + sum(len(w) for img in images for w in img.values()),
        wall_s=wall, cycles_per_s=ticks / wall if wall > 0 else 0.0,
        run_wall_s=run_s, run_cycles_per_s=ran / run_s if run_s > 0 else 0.0,
        load_wall_s=load_s, load_clocked=load, process_s=process_s,
        build_s=build.build_s, build_cached=build.cached)
    return out


def run_bare_loop(npu: NpuConfig, chips: int, cycles: int) -> dict:
    """The speed limit: the same ring of ``chips`` Verilated models clocked ``cycles`` times
    from reset by the harness's clock loop, every host input at 0 (no host traffic, no ``done``
    test): the cost of a cycle at a chip count. Returns
    ``{"cycles", "wall_s", "cycles_per_s", "build_s", "build_cached"}``."""
    if not isinstance(chips, int) or isinstance(chips, bool) or chips < 1:
        raise ValueError(f"chips must be a positive integer, not {chips!r}")
    build = ensure_build(dataclasses.replace(npu, topology=None))
    empty = [[] for _ in range(chips)]
    cur = _execute(build, _job(npu, empty, [{} for _ in range(chips)], empty, max_cycles=0,
                               seed=0, link_stalls=0.0, bare=cycles), None)
    if cur.u64() != 2:
        raise HarnessFailed("the harness did not run the bare loop")
    ran, wall = cur.u64(), cur.f64()
    return {"cycles": ran, "wall_s": wall, "cycles_per_s": ran / wall if wall > 0 else 0.0,
            "build_s": build.build_s, "build_cached": build.cached}
