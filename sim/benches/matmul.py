"""Matmul array: utilisation and cycles vs SCALE-Sim's model; pysim vs Verilator speed.

SCALE-Sim v3's output-stationary model takes ``F*L - 1`` cycles for F folds with
``L = R + C + T - 2`` (R = C = array size, T = K); SCALE-Sim v3's model gives 4991 cycles for
64x64x64 on 8x8. Our array overlaps folds, so the ratio cycles / SCALE-Sim should be < 1.
"""

import numpy as np
from amaranth.back import verilog

from hw.spec.formats import OutMode
from hw.tile.matmul import MatmulUnit
from sim.golden.matmul import matmul_unit
from sim.rtl.cocotb_tb import run_cocotb
from sim.rtl.matmul_driver import MatmulJob, simulate_pysim
from sim.rtl.toolchain import ToolchainMissing


def scalesim_os_cycles(m, k, n, size):
    folds = -(-m // size) * -(-n // size)
    return folds * (size + size + k - 2) - 1


def run(quick: bool):
    m = k = n = 16 if quick else 64
    size = 4 if quick else 8
    rng = np.random.default_rng(0)
    job = MatmulJob(rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (k, n)), size,
                    mode=OutMode.RAW)
    want = matmul_unit(job.a, job.b, job.bias, job.mult, job.shift, job.mode)
    shape = f"{m}x{k}x{n} on {size}x{size}"
    pysim = simulate_pysim(job)
    ok = bool((pysim["result"] == want).all())
    ideal = m * k * n / size**2
    scalesim = scalesim_os_cycles(m, k, n, size)
    rows = [
        {"bench": f"matmul utilisation {shape}", "value": ideal / pysim["cycles"], "unit": "",
         "ref": 0.90, "ratio": ideal / pysim["cycles"] / 0.90,
         "note": f"useful MACs/(N^2 x {pysim['cycles']} cycles, first input to last output); "
                 f"target 0.90; golden match {ok}"},
        {"bench": f"matmul cycles {shape} vs SCALE-Sim OS", "value": pysim["cycles"],
         "unit": "cycles", "ref": scalesim, "ratio": pysim["cycles"] / scalesim,
         "note": "F*(2N+K-2)-1; < 1 means folds overlap"},
        {"bench": f"pysim speed, matmul {shape}", "value": pysim["cycles_per_s"],
         "unit": "cycles/s", "note": "Amaranth simulator, testbench drives every cycle"},
    ]
    try:
        text = verilog.convert(MatmulUnit(size=size), name="npu_matmul")
        data = {"a": job.a, "b": job.b, "bias": job.bias, "mult": job.mult, "shift": job.shift,
                "mode": int(job.mode), "size": size, "a_unsigned": 0}
        vl = run_cocotb(text, top="npu_matmul", test_module="tb_matmul", data=data)
    except ToolchainMissing as exc:
        rows.append({"bench": "verilator speed", "value": None, "note": f"skipped: {exc}"})
        return rows
    vl_speed = vl["sim_cycles"] / vl["wall_s"]
    rows.append({"bench": f"verilator speed, matmul {shape}", "value": vl_speed,
                 "unit": "cycles/s", "ref": pysim["cycles_per_s"],
                 "ratio": vl_speed / pysim["cycles_per_s"],
                 "note": f"cocotb drives every cycle; ratio = Verilator/pysim; same cycles: "
                         f"{vl['cycles'] == pysim['cycles']}"})
    return rows
