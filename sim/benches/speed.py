"""Simulation speed: simulated cycles per wall second of Amaranth's simulator (pysim), the
Verilator backend (ChipSystem's chips and links as one Verilated node per chip under its C++
harness, ``sim.rtl.verilator``) and the bare C++ clock loop of the same models, on one tiny chip
and on four, and the harness's build time (one build for every chip count).

The jobs are the tiny model on the tiny NPU: ``--strategy single`` on one chip (one sample) and
``--strategy pipeline --chips 4 --batch 4``, both on ChipSystem. The rates are of the clock
loop from ``start`` to ``done`` (loading and elaboration excluded) over the whole job, for pysim
too (~40 s on one chip, ~4 min on four). Quick mode runs one chip only and pysim only for its
first ``QUICK_PYSIM_CYCLES`` cycles: pysim is event-driven, so a window where few units work
flatters it. The bare loop clocks the models with every host input at 0: the limit the harness
can approach.
"""

from __future__ import annotations

import json
import time

import numpy as np

from hw.spec import NpuConfig, model_preset, npu_preset
from hw.system import ChipSystem

from ..compiler.quantize import quantize_input, quantize_model
from ..flows.simulate import simulate
from ..golden.float_model import random_weights
from ..rtl.chip_runner import host_load
from ..rtl.pysim import run_sim
from ..rtl.toolchain import ToolchainMissing
from ..rtl.verilator.build import ensure_build
from ..rtl.verilator.runner import run_bare_loop, run_system_verilator
from ..strategies import compile_program

#: Cycles after ``start`` that pysim runs in quick mode.
QUICK_PYSIM_CYCLES = 4000
BARE_CYCLES = 200_000


def _job(npu: NpuConfig, chips: int):
    cfg = model_preset("tiny")
    samples = 1 if chips == 1 else 4
    x = np.random.default_rng(0).standard_normal((samples, cfg.seq_len, cfg.d_model))
    qm = quantize_model(cfg, random_weights(cfg, 0), x)
    prog = compile_program("single" if chips == 1 else "pipeline", npu, qm, chips,
                           seq=cfg.seq_len, samples=samples)
    images = prog.images([quantize_input(qm, s) for s in x])
    return [c.program for c in prog.chips], images, prog.reads()


def pysim_rate(npu: NpuConfig, programs, images, cycles: int | None = None) -> float:
    """pysim's cycles per second from ``start`` to ``done`` on ChipSystem (or over the first
    ``cycles`` cycles), loading and elaboration excluded."""
    dut = ChipSystem(npu=npu, chips=len(programs))
    ran = {}

    async def bench(ctx):
        for i, (program, image) in enumerate(zip(programs, images, strict=True)):
            await host_load(ctx, dut.host[i], program, image)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        start, n = time.perf_counter(), 0
        while not ctx.get(dut.done) and n != cycles:
            await ctx.tick()
            n += 1
        ran.update(cycles=n, wall=time.perf_counter() - start)

    load = sum(len(p) for p in programs) + sum(len(w) for i in images for w in i.values())
    run_sim(dut, [bench], max_cycles=load + (cycles or 10_000_000) + 100)
    return ran["cycles"] / ran["wall"]


def _rows(label: str, npu: NpuConfig, chips: int, quick: bool) -> list[dict]:
    programs, images, reads = _job(npu, chips)
    fast = run_system_verilator(npu, programs, images, reads)
    bare = run_bare_loop(npu, chips, BARE_CYCLES)
    slow = pysim_rate(npu, programs, images, QUICK_PYSIM_CYCLES if quick else None)
    build = json.loads((ensure_build(npu).directory / "build.json").read_text())
    rate = fast["run_cycles_per_s"]
    return [
        {"bench": f"sim speed, {label}, pysim", "value": slow, "unit": "cycles/s",
         "note": f"first {QUICK_PYSIM_CYCLES} cycles after start" if quick
         else "whole job"},
        {"bench": f"sim speed, {label}, verilator (C++ harness)", "value": rate,
         "unit": "cycles/s", "ref": slow, "ratio": rate / slow,
         "note": f"{fast['cycles']} cycles in {fast['run_wall_s']:.2f} s; with load and read "
                 f"back {fast['cycles_per_s']:.0f} cycles/s; target >= 500x pysim on 4 chips"},
        {"bench": f"sim speed, {label}, bare C++ clock loop", "value": bare["cycles_per_s"],
         "unit": "cycles/s", "ref": rate, "ratio": bare["cycles_per_s"] / rate,
         "note": "the same model clocked with every input at 0; ratio = bare / harness"},
        {"bench": f"verilator build, {label}", "value": build["build_s"], "unit": "s",
         "note": f"cold: export {build['verilog_s']} s + Verilator and g++ "
                 f"({build['verilog_lines']} lines of Verilog); this run found it in "
                 f"{fast['build_s']:.3f} s"},
    ]


def run(quick: bool):
    npu = npu_preset("tiny")
    try:
        rows = _rows("1 tiny chip (tiny model, single)", npu, 1, quick)
        if quick:
            return rows
        rows += _rows("4 tiny chips (tiny model, pipeline, batch 4)", npu, 4, quick)
    except ToolchainMissing as exc:
        return [{"bench": "sim speed, verilator", "value": None, "note": f"skipped: {exc}"}]
    start = time.perf_counter()
    report = simulate(npu, model_preset("tiny"), strategy="pipeline", chips=4, batch=4,
                      backend="verilator")
    rows.append({"bench": "npu sim --strategy pipeline --chips 4 --batch 4, verilator",
                 "value": time.perf_counter() - start, "unit": "s",
                 "note": f"whole simulate() with a cached build; golden match "
                         f"{report.golden_match}; {report.cycles} cycles"})
    return rows
