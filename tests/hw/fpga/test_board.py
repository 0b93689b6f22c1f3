"""The board top (hw.fpga.board) and the ULX3S facts it uses (hw.fpga.ulx3s)."""

import pytest
from amaranth.back import rtlil

from hw.fpga import ulx3s
from hw.fpga.board import BoardTop, baud_divisor
from hw.spec import npu_preset


@pytest.mark.parametrize("f_out, dividers", [
    # What prjtrellis' ecppll chooses for 25 MHz in (CLKI_DIV, CLKFB_DIV, CLKOP_DIV).
    (75.0, (1, 3, 8)), (100.0, (1, 4, 6)), (50.0, (1, 2, 12))])
def test_pll_dividers_are_ecppll_s(f_out, dividers):
    p = ulx3s.pll_params(25.0, f_out)
    assert (p["CLKI_DIV"], p["CLKFB_DIV"], p["CLKOP_DIV"]) == dividers
    assert p["f_out"] == f_out and 400 <= p["f_vco"] <= 800


def test_pll_refuses_an_impossible_clock():
    with pytest.raises(ValueError, match=r"clock 500 MHz is outside the PLL's 3.125..400 MHz"):
        ulx3s.pll_params(25.0, 500.0)


def test_pin_file_places_every_port():
    text = ulx3s.lpf()
    assert 'LOCATE COMP "clk25" SITE "G2";' in text
    assert 'LOCATE COMP "uart_rx" SITE "M1";' in text and 'LOCATE COMP "uart_tx" SITE "L4";' in text
    assert 'LOCATE COMP "led[7]" SITE "H3";' in text
    assert 'FREQUENCY PORT "clk25" 25 MHZ;' in text
    assert text.count("LOCATE") == 11


def test_baud_divisor():
    assert baud_divisor(75.0, 1_000_000) == 75
    assert baud_divisor(75.0, 115_200) == 651
    with pytest.raises(ValueError, match=r"baud 30000000 is not within 2% of 75 MHz"):
        baud_divisor(75.0, 30_000_000)


def test_board_top_ports_and_pll():
    """On the tiny preset: the ports and the PLL do not depend on the chip inside, whose
    RTLIL for the fpga preset takes twice as long."""
    npu = npu_preset("tiny")
    top = BoardTop(npu=npu, divisor=75)
    assert set(top.signature.members) == {"clk25", "uart_rx", "uart_tx", "led"}
    assert set(BoardTop(npu=npu, divisor=75, sim=True).signature.members) == \
        {"uart_rx", "uart_tx", "led"}
    text = rtlil.convert(top, name="npu_board")
    assert "EHXPLLL" in text and "CLKFB_DIV" in text


def test_board_top_rejects_a_non_config():
    with pytest.raises(TypeError, match=r"npu must be an NpuConfig, not 'fpga'"):
        BoardTop(npu="fpga", divisor=75)
