"""cocotb testbench for the exported ring (``npu export --top ring``): one collective.

Loads every chip's input words through the host port, pulses ``start`` with the command, waits
for ``busy`` to fall, reads the ``cycles`` counter and every chip's output words back. No stalls,
so the cycle count must equal Amaranth's simulator's for the same command.
"""

import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from sim.rtl.cocotb_tb import tb_data, tb_report


@cocotb.test()
async def ring_collective(dut):
    d = tb_data()
    chips = int(d["chips"])
    cmd = int(d["cmd"])
    max_cycles = int(d["max_cycles"])
    loads = [[int.from_bytes(bytes(row), "little") for row in d[f"in{i}"]]
             for i in range(chips)]
    out_counts = [int(x) for x in d["out_counts"]]

    for name in ("start", "start_chip", "host_we", "stall", "dma_stall", "host_ring", "host_chip",
                 "host_addr", "host_wdata", "cmd"):
        getattr(dut, name).value = 0
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 1
    for _ in range(2):
        await RisingEdge(dut.clk)
    dut.rst.value = 0

    for chip, words in enumerate(loads):
        for addr, word in enumerate(words):
            dut.host_chip.value = chip
            dut.host_addr.value = addr
            dut.host_wdata.value = word
            dut.host_we.value = 1
            await RisingEdge(dut.clk)
    dut.host_we.value = 0

    dut.cmd.value = cmd
    dut.start.value = 1
    await RisingEdge(dut.clk)
    dut.start.value = 0
    start = time.perf_counter()
    waited = 0
    while True:
        await RisingEdge(dut.clk)
        await ReadOnly()
        if not int(dut.busy.value):
            break
        waited += 1
        assert waited < max_cycles, f"ring still busy after {max_cycles} cycles"
    wall = time.perf_counter() - start
    cycles = int(dut.cycles.value)
    await RisingEdge(dut.clk)

    outputs = []
    for chip in range(chips):
        words = []
        for addr in range(out_counts[chip]):
            dut.host_chip.value = chip
            dut.host_addr.value = addr
            await RisingEdge(dut.clk)
            await ReadOnly()
            words.append(hex(dut.host_rdata.value.to_unsigned()))
            await RisingEdge(dut.clk)
        outputs.append(words)
    tb_report({"cycles": cycles, "words": outputs, "wall_s": wall})
