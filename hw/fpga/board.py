"""The board top: one chip on a ULX3S-85F, loaded, run and read back over the FTDI UART.

``npu fpga --top board`` (``make fpga``) builds it into a bitstream; ``npu board`` drives it
from the host (``sim/flows/board.py``); ``docs/fpga.md`` describes both.
"""

from __future__ import annotations

from amaranth.hdl import (
    Cat,
    ClockDomain,
    ClockSignal,
    Const,
    DomainRenamer,
    Instance,
    Module,
    ResetInserter,
    ResetSignal,
    Signal,
)
from amaranth.lib import wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out, connect

from ..chip import Chip
from ..ring.link import RingLink
from ..spec import NpuConfig
from ..spec.ring import tag_bits
from . import ulx3s
from .uart import HostLink, UartRx, UartTx

__all__ = ["BoardTop", "COLL_AVG", "DEFAULT_BAUD", "PE_DSP", "baud_divisor"]

#: The FTDI FT231X of the ULX3S runs up to 3 Mbaud; 1 Mbaud leaves margin on any cable.
DEFAULT_BAUD = 1_000_000


def baud_divisor(clock_mhz: float, baud: int) -> int:
    """Clocks per UART bit for ``baud`` at ``clock_mhz``; ValueError when the rate it gives is
    more than 2% off (a UART tolerates about 4% between both ends)."""
    if not isinstance(baud, int) or isinstance(baud, bool) or baud <= 0:
        raise ValueError(f"baud must be a positive integer, not {baud!r}")
    divisor = round(clock_mhz * 1e6 / baud)
    if divisor < 4 or abs(clock_mhz * 1e6 / divisor - baud) > 0.02 * baud:
        raise ValueError(f"baud {baud} is not within 2% of {clock_mhz:g} MHz / an integer of "
                         "at least 4")
    return divisor


#: The board's chip has no AVG divider in its collective engine (``Chip``'s ``coll_avg``):
#: synth_ecp5 crashes on its 64-bit signed division, and a one-cycle divider would set the
#: clock. The board driver refuses programs that run a COLL AVG (``sim/flows/board.py``).
COLL_AVG = False


#: The board's chip takes its matmul array's products in DSPs (``Chip``'s ``pe_dsp``): one
#: MULT18X18D per PE instead of ~250 LUT4 slots (docs/fpga.md), while the other units leave
#: enough of the ECP5-85k's 156.
PE_DSP = True


class _ChipOnRing(wiring.Component):
    """The chip with its ring port looped back through a link (a ring of one chip), so that
    nothing of the chip is optimised away and a one-chip collective runs."""

    def __init__(self, npu, *, pe_dsp=PE_DSP, ecp5_dsp=True):
        # A ring of one chip: 1-bit chip ids.
        # On the ECP5 (not in simulation): the registered products in MULT18X18Ds.
        self.chip = Chip(npu=npu, coll_avg=COLL_AVG, pe_dsp=pe_dsp, chip_bits=1,
                         ecp5_dsp=ecp5_dsp)
        super().__init__(wiring.Signature({}))

    def elaborate(self, platform):
        m = Module()
        npu = self.chip.npu
        m.submodules.chip = chip = self.chip
        m.submodules.link = link = RingLink(
            width_bytes=npu.link_bytes_per_cycle, latency=npu.link_latency_cycles,
            word_bytes=chip.ring_word_bytes, tag_bits=tag_bits(chip.chip_bits))
        connect(m, chip.ring.tx, link.i)
        connect(m, link.o, chip.ring.rx)
        m.d.comb += [link.stall.eq(0), chip.chip_id.eq(0)]
        return m


class BoardTop(wiring.Component):
    """One :class:`~hw.chip.Chip` behind a UART :class:`~hw.fpga.uart.HostLink`.

    Parameters (keyword-only): ``npu``; ``divisor``, clocks per UART bit (the baud rate is the
    chip's clock over it: :func:`baud_divisor`); ``sim``: no PLL, the ``sync`` domain comes from
    outside (Amaranth's simulator), and no ``clk25`` port.

    On the board (``sim=False``) the 25 MHz oscillator feeds an EHXPLLL making the NPU's
    ``clock_mhz``; the logic is held in reset until the PLL locks. The ``RESET`` request resets
    the chip and its ring loopback (not the link). On the board the chip's reset (the PLL's
    lock or ``RESET``), which reaches about 26,000 flip-flops, is carried by a global clock
    network (a DCCA buffer: the ``chip`` domain, the ``sync`` clock with that reset) instead of
    the general routing; in simulation it is the same OR of the two (``ResetInserter``).

    Members
    -------
    clk25 : ``In(1)`` (board only); uart_rx : ``In(1)``; uart_tx : ``Out(1)``
    led : ``Out(8)``: 0 done, 1 error, 2 running, 3 toggles with each received byte,
        7 blinks (about 1 Hz at 75 MHz) while the clock runs

    ``link`` is the host link; ``ring.chip`` the chip (its MULT18X18D instances only on the
    board, ``sim=False``).
    """

    def __init__(self, *, npu: NpuConfig, divisor: int, sim: bool = False):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        self._npu, self._divisor, self._sim = npu, divisor, bool(sim)
        self.link = HostLink(npu=npu, divisor=divisor)
        # The chip on its loopback ring; the ECP5's DSP instances only where there is an ECP5.
        self.ring = _ChipOnRing(npu, ecp5_dsp=not self._sim)
        ports = {"uart_rx": In(1, init=1), "uart_tx": Out(1, init=1), "led": Out(8)}
        if not self._sim:
            ports = {"clk25": In(1), **ports}
        super().__init__(ports)

    @property
    def npu(self):
        return self._npu

    @property
    def divisor(self):
        return self._divisor

    def elaborate(self, platform):
        m = Module()
        if not self._sim:
            self._clock(m)

        m.submodules.rx = rx = UartRx(divisor=self._divisor)
        m.submodules.tx = tx = UartTx(divisor=self._divisor)
        m.submodules.link = link = self.link
        connect(m, rx.o, link.i_rx)
        connect(m, link.o_tx, tx.i)
        m.d.comb += [rx.rx.eq(self.uart_rx), self.uart_tx.eq(tx.tx)]

        ring = self.ring
        if self._sim:
            m.submodules.node = ResetInserter(link.chip_reset)(ring)
        else:
            m.domains.chip = ClockDomain("chip")
            chip_rst = Signal()
            m.d.comb += [ClockSignal("chip").eq(ClockSignal("sync")),
                         chip_rst.eq(ResetSignal("sync") | link.chip_reset)]
            m.submodules.chip_rst_global = Instance(
                "DCCA", i_CLKI=chip_rst, i_CE=Const(1), o_CLKO=ResetSignal("chip"))
            m.submodules.node = DomainRenamer("chip")(ring)
        chip = ring.chip
        connect(m, link.host, chip.host)
        m.d.comb += [
            chip.start.eq(link.start),
            link.done.eq(chip.done), link.error.eq(chip.error), link.busy.eq(chip.busy),
            link.pc.eq(chip.pc), link.cycles.eq(chip.cycles),
        ]
        for k, counter in enumerate(chip.busy_cycles):
            m.d.comb += link.busy_cycles[k].eq(counter)

        heartbeat = Signal(26)
        toggle = Signal()
        m.d.sync += heartbeat.eq(heartbeat + 1)
        with m.If(rx.o.valid & rx.o.ready):
            m.d.sync += toggle.eq(~toggle)
        m.d.comb += self.led.eq(Cat(chip.done, chip.error, link.running, toggle, Const(0, 3),
                                    heartbeat[-1]))
        return m

    def _clock(self, m):
        """25 MHz -> EHXPLLL -> ``sync`` at ``clock_mhz``; reset until the PLL locks."""
        pll = ulx3s.pll_params(ulx3s.CLK_MHZ, self._npu.clock_mhz)
        m.domains.sync = ClockDomain("sync")
        locked = Signal()
        m.submodules.pll = Instance(
            "EHXPLLL",
            a_FREQUENCY_PIN_CLKI=f"{ulx3s.CLK_MHZ:g}",
            a_FREQUENCY_PIN_CLKOP=f"{pll['f_out']:g}",
            a_ICP_CURRENT="12", a_LPF_RESISTOR="8", a_MFG_ENABLE_FILTEROPAMP="1",
            a_MFG_GMCREF_SEL="2",
            p_PLLRST_ENA="DISABLED", p_INTFB_WAKE="DISABLED", p_STDBY_ENABLE="DISABLED",
            p_DPHASE_SOURCE="DISABLED", p_OUTDIVIDER_MUXA="DIVA", p_OUTDIVIDER_MUXB="DIVB",
            p_OUTDIVIDER_MUXC="DIVC", p_OUTDIVIDER_MUXD="DIVD",
            p_CLKI_DIV=pll["CLKI_DIV"], p_CLKOP_ENABLE="ENABLED", p_CLKOP_DIV=pll["CLKOP_DIV"],
            p_CLKOP_CPHASE=pll["CLKOP_CPHASE"], p_CLKOP_FPHASE=0, p_FEEDBK_PATH="CLKOP",
            p_CLKFB_DIV=pll["CLKFB_DIV"],
            i_RST=0, i_STDBY=0, i_CLKI=self.clk25, o_CLKOP=ClockSignal("sync"),
            i_CLKFB=ClockSignal("sync"), i_PHASESEL0=0, i_PHASESEL1=0, i_PHASEDIR=1,
            i_PHASESTEP=1, i_PHASELOADREG=1, i_PLLWAKESYNC=0, i_ENCLKOP=0, o_LOCK=locked)
        m.submodules.reset_sync = ResetSynchronizer(~locked, domain="sync")
