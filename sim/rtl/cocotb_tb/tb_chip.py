"""cocotb testbench for the exported chip: load through the host port, run on the clock alone,
read back. The chip runs from its own sequencer, so no Python runs per cycle while it computes."""

import time

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge, with_timeout
from cocotb.utils import get_sim_time

from hw.spec.isa import BUSY_COUNTERS, UNIT_BITS
from sim.rtl.cocotb_tb import tb_data, tb_report
from sim.rtl.cocotb_tb.streams import reset


def _words_to_int(row):
    return int.from_bytes(bytes(int(b) for b in row), "little")


@cocotb.test()
async def run_program(dut):
    d = tb_data()
    n = int(d["word_bytes"])
    imem_bits = int(d["imem_addr_bits"])
    addr_bits = int(d["addr_bits"])
    Clock(dut.clk, 10, unit="ns").start()
    await reset(dut)
    load = 0
    dut.host__imem__valid.value = 1
    for i, word in enumerate(d["program"].tolist()):
        dut.host__imem__payload.value = i | (int(word) << imem_bits)
        await RisingEdge(dut.clk)
        load += 1
    dut.host__imem__valid.value = 0
    dut.host__wr__valid.value = 1
    bases = d["image_bases"].tolist()
    chunks = np.split(d["image_words"], np.cumsum(d["image_sizes"])[:-1]) if bases else []
    for base, words in zip(bases, chunks, strict=True):
        for i, row in enumerate(words):
            dut.host__wr__payload.value = (base + i) | (_words_to_int(row) << addr_bits)
            await RisingEdge(dut.clk)
            load += 1
    dut.host__wr__valid.value = 0
    dut.start.value = 1
    await RisingEdge(dut.clk)
    dut.start.value = 0
    start = time.perf_counter()
    t0 = get_sim_time("ns")
    timeout = False
    try:
        if not int(dut.done.value):
            await with_timeout(RisingEdge(dut.done), int(d["max_cycles"]) * 10, "ns")
    except cocotb.triggers.SimTimeoutError:
        timeout = True
    wall = time.perf_counter() - start
    ran = int((get_sim_time("ns") - t0) / 10)
    await ReadOnly()
    result = {"timeout": timeout, "cycles": int(dut.cycles.value), "load_cycles": load,
              "error": bool(int(dut.error.value)),
              "busy_cycles": [int(getattr(dut, f"busy_cycles__{u}").value)
                              for u in range(len(BUSY_COUNTERS))],
              "wall_s": wall, "cycles_per_s": ran / wall if wall > 0 else 0.0, "regions": []}
    if not timeout:
        entries = []
        for k in range(int(dut.host__trace_count.value)):
            await RisingEdge(dut.clk)
            dut.host__trace_addr.value = k
            await RisingEdge(dut.clk)
            await ReadOnly()
            value = dut.host__trace_data.value.to_unsigned()
            entries.append([value & 0xFFFF_FFFF, value >> 32 & ((1 << UNIT_BITS) - 1)])
        result["trace"] = {"entries": entries,
                           "overflow": bool(int(dut.host__trace_overflow.value))}
        await RisingEdge(dut.clk)
        dut.host__rd_data__ready.value = 1
        for base, count in d["reads"].tolist():
            words = []
            for i in range(count):
                await RisingEdge(dut.clk)
                dut.host__rd_addr__payload.value = base + i
                dut.host__rd_addr__valid.value = 1
                while True:
                    await ReadOnly()
                    if int(dut.host__rd_addr__ready.value):
                        break
                    await RisingEdge(dut.clk)
                await RisingEdge(dut.clk)
                dut.host__rd_addr__valid.value = 0
                while True:
                    await ReadOnly()
                    if int(dut.host__rd_data__valid.value):
                        value = dut.host__rd_data__payload.value.to_unsigned() & ((1 << 8 * n) - 1)
                        break
                    await RisingEdge(dut.clk)
                words.append(list(value.to_bytes(n, "little")))
            result["regions"].append(words)
    tb_report(result)
