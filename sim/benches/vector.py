"""Vector unit: cycles per vector op vs the ideal of one beat per cycle (Amaranth simulator).

The ideal for a vector of d_model elements on ``lanes`` lanes is B = ceil(d_model / lanes)
cycles: the vector streamed once. A full LayerNorm needs two passes over its buffer plus the
rsqrt, so its ratio approaches 2 for long vectors; element-wise ops approach (B + 1) / B
back to back (one cycle per command to accept it).
"""

import numpy as np

from hw.spec import npu_preset
from hw.spec.timing.vector import op_cycles
from hw.spec.vector import VectorCmd, VectorOp, beats, pack_gamma_beta
from sim.golden.vector import ln_stats
from sim.rtl.vector_driver import simulate_pysim


def run(quick: bool):
    npu = npu_preset("tiny" if quick else "fpga")
    lanes, d, pipe = npu.vector_lanes, npu.d_model_max, npu.vector_pipeline
    rng = np.random.default_rng(0)
    x = rng.integers(-(1 << 15), 1 << 15, d)
    params = pack_gamma_beta(rng.integers(-(1 << 15), 1 << 15, d), rng.integers(-99, 99, d))
    knobs = {"gshift": 18, "mult": 1 << 15, "shift": 23}
    half = d // 2
    stats = [ln_stats(x[:half]), ln_stats(x[half:])]
    total = (stats[0][0] + stats[1][0], stats[0][1] + stats[1][1])
    count = 4
    cases = [
        ("LayerNorm (full)", [(VectorCmd(VectorOp.LN, d, **knobs), x, params, None)]),
        ("LN_STATS + LN_APPLY (one chip's half)",
         [(VectorCmd(VectorOp.LN_STATS, half), x[:half], None, None),
          (VectorCmd(VectorOp.LN_APPLY, half, n=d, **knobs), x[:half], params[:half], total)]),
        (f"residual add x{count} back to back",
         [(VectorCmd(VectorOp.ADD, d), x, x[::-1], None)] * count),
    ]
    rows = []
    speed = []
    for name, program in cases:
        try:
            run_ = simulate_pysim(program, lanes=lanes, d_model_max=d, pipeline=pipe)
            ok, cycles = True, run_["cycles"]
            speed.append(run_["sim"]["cycles_per_s"])
        except AssertionError as exc:
            ok, cycles = False, None
            print(f"vector bench {name}: {exc}")
        ideal = sum(beats(cmd.length, lanes) for cmd, *_ in program)
        if name.startswith("LN_STATS"):
            formula = op_cycles(VectorOp.LN_STATS, half, lanes, pipeline=pipe) + 1 + op_cycles(
                VectorOp.LN_APPLY, half, lanes, pipeline=pipe)
        elif name.startswith("residual"):
            formula = op_cycles(VectorOp.ADD, d, lanes, pipeline=pipe) + (count - 1) * (
                beats(d, lanes) + 1)
        else:
            formula = op_cycles(VectorOp.LN, d, lanes, pipeline=pipe)
        rows.append({"bench": f"vector {name}, d_model {d} on {lanes} lanes", "value": cycles,
                     "unit": "cycles", "ref": ideal,
                     "ratio": None if cycles is None else cycles / ideal,
                     "note": f"ideal = beats streamed once; formula {formula}; golden match {ok}"})
    if speed:
        rows.append({"bench": f"pysim speed, vector unit {lanes} lanes",
                     "value": float(np.mean(speed)), "unit": "cycles/s",
                     "note": "Amaranth simulator, testbench drives every stream"})
    return rows
