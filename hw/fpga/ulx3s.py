"""The few facts of the ULX3S board that the board top needs: pins, the oscillator, the PLL.

Pin locations and I/O standards are those of amaranth-boards' ULX3S platform
(``amaranth_boards/ulx3s.py``, ``ULX3S_85F_Platform``: ``clk25``, the FTDI ``uart`` with
``role="dce"`` — ``rx`` is the FPGA's input from the FTDI chip — and ``led`` 0..7), written
out here so that the flow needs no board package.
"""

from __future__ import annotations

__all__ = ["DEVICE", "PACKAGE", "CLK_MHZ", "PINS", "lpf", "pll_params"]

DEVICE = "LFE5U-85F"
PACKAGE = "CABGA381"
#: The board's oscillator, on pin ``clk25``.
CLK_MHZ = 25.0

#: Port name -> pin (a tuple for a bus, bit 0 first) and its I/O attributes.
PINS = {
    "clk25": ("G2", "IO_TYPE=LVCMOS33"),
    "uart_rx": ("M1", "IO_TYPE=LVCMOS33 PULLMODE=UP"),
    "uart_tx": ("L4", "IO_TYPE=LVCMOS33"),
    "led": (("B2", "C2", "C1", "D2", "D1", "E2", "E1", "H3"), "IO_TYPE=LVCMOS33 DRIVE=4"),
}


def lpf() -> str:
    """A Lattice preference file (nextpnr ``--lpf``) placing the board top's ports."""
    lines = []
    for port, (pins, attrs) in PINS.items():
        if isinstance(pins, str):
            names = [(port, pins)]
        else:
            names = [(f"{port}[{i}]", pin) for i, pin in enumerate(pins)]
        for name, pin in names:
            lines.append(f'LOCATE COMP "{name}" SITE "{pin}";')
            lines.append(f'IOBUF PORT "{name}" {attrs};')
    lines.append(f'FREQUENCY PORT "clk25" {CLK_MHZ:g} MHZ;')
    return "\n".join(lines) + "\n"


# ECP5 EHXPLLL limits (Lattice TN1263): phase detector input 8..400 MHz (after CLKI_DIV),
# VCO 400..800 MHz, outputs 3.125..400 MHz.
_PFD_MHZ = (8.0, 400.0)
_VCO_MHZ = (400.0, 800.0)
_OUT_MHZ = (3.125, 400.0)


def pll_params(f_in: float, f_out: float) -> dict:
    """EHXPLLL dividers for ``f_out`` MHz from ``f_in`` MHz with CLKOP as the feedback.

    The search of prjtrellis' ``ecppll``: the smallest error, then the VCO nearest 600 MHz.
    Returns ``{"CLKI_DIV", "CLKFB_DIV", "CLKOP_DIV", "CLKOP_CPHASE", "f_out", "f_vco"}``;
    raises ValueError for a frequency the PLL cannot make.
    """
    if not _OUT_MHZ[0] <= f_out <= _OUT_MHZ[1]:
        raise ValueError(f"clock {f_out:g} MHz is outside the PLL's {_OUT_MHZ[0]:g}.."
                         f"{_OUT_MHZ[1]:g} MHz")
    best = None
    for ref in range(1, 129):
        pfd = f_in / ref
        if not _PFD_MHZ[0] <= pfd <= _PFD_MHZ[1]:
            continue
        for fb in range(1, 81):
            for op in range(1, 129):
                vco = pfd * fb * op
                if not _VCO_MHZ[0] <= vco <= _VCO_MHZ[1]:
                    continue
                key = (abs(pfd * fb - f_out), abs(vco - 600.0))
                if best is None or key < best[0]:
                    best = (key, ref, fb, op, pfd * fb, vco)
    if best is None:
        raise ValueError(f"no PLL setting makes {f_out:g} MHz from {f_in:g} MHz")
    _, ref, fb, op, out, vco = best
    # The primary output shifted by 180 degrees, as ecppll and Lattice's tools do.
    return {"CLKI_DIV": ref, "CLKFB_DIV": fb, "CLKOP_DIV": op, "CLKOP_CPHASE": op // 2,
            "f_out": out, "f_vco": vco}
