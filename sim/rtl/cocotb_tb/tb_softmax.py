"""cocotb 2.x testbench for the exported SoftmaxUnit (``npu export --top softmax``).

Drives the flattened ports (``i__payload`` = data lanes, then ``last``, then mask lanes;
``o__payload`` = probability lanes, then ``last``) with the deterministic idle/stall gaps that
``tests/hw/test_softmax.py`` passes in, checks every row against the golden model and reports the
cycle of every transfer so that the caller can compare them with Amaranth's simulator.
"""

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from hw.tile.softmax import SoftmaxUnit
from sim.golden.softmax import softmax
from sim.rtl.cocotb_tb import tb_data, tb_report
from sim.rtl.cocotb_tb.streams import reset


class TB:
    def __init__(self, dut, length: int):
        self.dut = dut
        self.length = length
        self.cycle = 0
        # The payload layouts pack and unpack the flattened ports, as in the Amaranth benches.
        unit = SoftmaxUnit(length=length)
        self.i_layout = unit.i.payload.shape()
        self.o_layout = unit.o.payload.shape()

    def pack(self, scores, mask, last) -> int:
        return self.i_layout.const({"data": [int(x) for x in scores],
                                    "mask": [int(x) for x in mask],
                                    "last": int(last)}).as_bits()

    def unpack(self, word: int):
        view = self.o_layout.from_bits(word)
        return [int(x) for x in view.data], int(view.last)

    async def reset(self):
        self.dut.i__valid.value = 0
        self.dut.o__ready.value = 0
        await reset(self.dut, cycles=3)

    async def run(self, stim, max_cycles: int = 20_000) -> dict:
        """One loop drives both streams: gaps count cycles with valid/ready low before each row
        is offered/accepted, exactly like ``stream_put``/``stream_get`` after ``tick().repeat``."""
        dut = self.dut
        n = len(stim["scores"])
        sent = got = 0
        idle, stall = int(stim["idle"][0]), int(stim["stall"][0])
        t_in, t_out, rows, lasts = [], [], [], []
        while got < n:
            if self.cycle > max_cycles:
                raise AssertionError(f"watchdog: {got} of {n} rows after {self.cycle} cycles")
            offer = sent < n and idle == 0
            dut.i__valid.value = int(offer)
            if offer:
                dut.i__payload.value = self.pack(stim["scores"][sent], stim["mask"][sent],
                                                 stim["last"][sent])
            dut.o__ready.value = int(stall == 0)
            await ReadOnly()
            took_in = offer and int(dut.i__ready.value)
            took_out = stall == 0 and int(dut.o__valid.value)
            word = dut.o__payload.value.to_unsigned() if took_out else None
            await RisingEdge(dut.clk)
            self.cycle += 1
            if took_in:
                t_in.append(self.cycle)
                sent += 1
                idle = int(stim["idle"][sent]) if sent < n else 0
            elif sent < n and idle:
                idle -= 1
            if took_out:
                data, last = self.unpack(word)
                rows.append(data)
                lasts.append(last)
                t_out.append(self.cycle)
                got += 1
                stall = int(stim["stall"][got]) if got < n else 0
            elif stall:
                stall -= 1
        return {"rows": rows, "last": lasts, "t_in": t_in, "t_out": t_out,
                "cycles": t_out[-1] - t_in[0] + 1}


@cocotb.test()
async def softmax_rows(dut):
    stim = tb_data()
    length = stim["scores"].shape[1]
    Clock(dut.clk, 10, unit="ns").start()
    tb = TB(dut, length)
    await tb.reset()
    result = await tb.run(stim)
    want = softmax(stim["scores"], stim["mask"]).astype(np.int64)
    for r, row in enumerate(result["rows"]):
        for j, (a, b) in enumerate(zip(row, want[r], strict=True)):
            assert a == b, f"row {r} lane {j}: got {a}, expected {b}"
        assert result["last"][r] == stim["last"][r], f"row {r}: last {result['last'][r]}"
    tb_report(result)
