"""cocotb testbench for the exported vector unit (``npu export --top vector``).

Replays a program prepared by ``tests/hw/test_vector.py`` (commands and input beats as arrays),
with every sink ready, and hands the received beats back for the golden comparison.
"""

import cocotb
from cocotb.clock import Clock

from hw.tile.vector import cmd_layout, out_layout, stats_layout, vec_layout
from sim.rtl.cocotb_tb import tb_data, tb_report
from sim.rtl.cocotb_tb.streams import reset, run_streams

FIELDS = ("op", "length", "n", "mult", "shift", "gshift", "out16", "per_channel")


def _beats(rows, width):
    return [{"data": [int(v) for v in row[:width]], "last": int(row[width])} for row in rows]


@cocotb.test()
async def vector_program(dut):
    d = tb_data()
    lanes = int(d["lanes"])
    Clock(dut.clk, 10, unit="ns").start()
    await reset(dut)
    run = await run_streams(dut, sources={
        "i_cmd": (cmd_layout(), [dict(zip(FIELDS, map(int, row), strict=True))
                                 for row in d["cmds"]]),
        "i_a": (vec_layout(lanes), _beats(d["a"], lanes)),
        "i_b": (vec_layout(lanes), _beats(d["b"], lanes)),
        "i_stats": (stats_layout(), _beats(d["stats"], 2)),
    }, sinks={"o_data": (out_layout(lanes), int(d["n_data"])),
              "o_stats": (stats_layout(), int(d["n_stats"]))}, max_cycles=100_000)
    received = run["received"]
    tb_report({
        "data": [[[int(p.data[j]) for j in range(lanes)], [int(p.q[j]) for j in range(lanes)],
                  int(p.last)] for p in received["o_data"]],
        "stats": [[int(p.data[0]), int(p.data[1]), int(p.last)] for p in received["o_stats"]],
        "cycles": run["last_out"].get("o_data", run["last_out"].get("o_stats", 0))
        - run["first_in"]["i_cmd"],
    })
