"""Softmax unit: cycles per row (back-to-back rows, no stalls) vs the datapath's ideal.

The unit's lane-serial stages handle ``P`` lanes per cycle, so a row cannot go faster than
``L / P`` cycles: that is the ideal. The reciprocal's long division computes as many quotient
bits per cycle as it needs to finish within ``L / P`` cycles, so the ratio should be 1.
"""

import numpy as np

from hw.spec import npu_preset
from hw.tile.softmax import SoftmaxUnit
from sim.golden.softmax import softmax
from sim.rtl.softmax_driver import simulate_rows


def _measure(length: int, lanes: int, rows: int) -> dict:
    dut = SoftmaxUnit(length=length, lanes_per_cycle=lanes)
    rng = np.random.default_rng(0)
    scores = rng.integers(-2048, 2048, size=(rows, length))
    mask = rng.random((rows, length)) < 0.9
    res = simulate_rows(dut, scores, mask)
    ok = bool((res["rows"] == softmax(scores, mask)).all())
    t_out = res["t_out"]
    period = (t_out[-1] - t_out[0]) / (rows - 1)
    latency = t_out[0] - res["t_in"][0]
    return {"dut": dut, "period": period, "latency": latency, "ok": ok, "sim": res["sim"]}


def run(quick: bool):
    configs = [("tiny", 16, 1), ("tiny", 16, 4)]
    if not quick:
        configs += [("fpga", 64, 1), ("fpga", 64, 4)]
    rows = []
    for preset, length, lanes in configs:
        assert npu_preset(preset).softmax_len == length
        m = _measure(length, lanes, rows=6 if quick else 10)
        dut = m["dut"]
        ideal = length / lanes
        rows.append({
            "bench": f"softmax cycles/row L={length} P={lanes} ({preset})",
            "value": m["period"], "unit": "cycles/row", "ref": ideal,
            "ratio": m["period"] / ideal,
            "note": f"ideal L/P = {dut.slot_cycles}; divider {dut.divide_bits} bit(s)/cycle; "
                    f"latency {m['latency']} (formula 5*L/P+1 = {dut.latency}); "
                    f"golden match {m['ok']}; "
                    f"pysim {m['sim']['cycles_per_s']:.0f} cycles/s",
        })
    return rows
