"""cocotb testbench for the exported matmul unit (``npu export --top matmul``)."""

import time

import cocotb
from cocotb.clock import Clock

from hw.spec.formats import OutMode
from hw.tile.matmul import a_layout, acc_layout, b_layout, param_layout
from sim.golden.matmul import matmul_unit
from sim.rtl.cocotb_tb import tb_data, tb_report
from sim.rtl.cocotb_tb.streams import reset, run_streams
from sim.rtl.matmul_driver import MatmulJob


@cocotb.test()
async def matmul_job(dut):
    d = tb_data()
    size = int(d["size"])
    job = MatmulJob(d["a"], d["b"], size, bias=d["bias"], mult=d["mult"], shift=d["shift"],
                    mode=OutMode(int(d["mode"])), a_unsigned=bool(d["a_unsigned"]))
    Clock(dut.clk, 10, unit="ns").start()
    await reset(dut)
    start = time.perf_counter()
    run = await run_streams(dut, sources={
        "i_a": (a_layout(size), job.a_beats()),
        "i_b": (b_layout(size), job.b_beats()),
        "i_param": (param_layout(size), job.param_beats()),
    }, sinks={"o": (acc_layout(size), job.out_rows)}, max_cycles=100_000)
    wall = time.perf_counter() - start
    rows = run["received"]["o"]
    result = job.assemble([list(r.data) for r in rows], [int(r.last) for r in rows])
    want = matmul_unit(job.a, job.b, job.bias, job.mult, job.shift, job.mode,
                       a_unsigned=job.a_unsigned)
    bad = (result != want).nonzero()
    assert not len(bad[0]), f"mismatch at row {bad[0][0]}, col {bad[1][0]}"
    tb_report({"result": result.tolist(),
               "cycles": run["last_out"]["o"] - run["first_in"]["i_a"] + 1,
               "sim_cycles": run["cycles"], "wall_s": wall})
