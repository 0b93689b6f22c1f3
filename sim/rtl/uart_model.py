"""The board top in Amaranth's simulator behind a bit-level UART model: a transport for
:class:`sim.flows.board.BoardDriver` that needs no board.

:class:`SimTransport` owns a :class:`~amaranth.sim.Simulator` of
:class:`hw.fpga.board.BoardTop` (``sim=True``: the simulator's clock instead of the PLL). A
background testbench plays the host's UART: it shifts queued bytes onto ``uart_rx`` one bit per
``divisor`` cycles (8N1) and decodes ``uart_tx`` into received bytes, sampling each bit in its
middle. Simulated time advances only while the driver waits for a reply (:meth:`read`) or keeps
the line quiet (:meth:`pause`), so the driver's own Python time costs no cycles.
"""

from __future__ import annotations

from collections import deque

from amaranth.sim import Simulator

from hw.fpga.board import BoardTop
from hw.spec import NpuConfig

from ..errors import TransportTimeout
from .pysim import CLOCK_PERIOD

__all__ = ["SimTransport", "uart_frame"]


def uart_frame(byte: int, *, stop: int = 1) -> list[int]:
    """The line levels of one 8N1 character: start bit, data bits LSB first, stop bit."""
    return [0] + [(byte >> k) & 1 for k in range(8)] + [stop]


class SimTransport:
    """Parameters: ``npu``; ``divisor`` (clocks per bit, small to keep the simulation short);
    ``timeout_cycles``: a read that gets no byte for this many cycles raises
    :class:`~sim.flows.board.TransportTimeout`. ``cycles`` counts the simulated cycles so far.

    :meth:`write_levels` puts raw line levels on ``uart_rx`` (a test's malformed character).
    """

    def __init__(self, npu: NpuConfig, *, divisor: int = 4, timeout_cycles: int = 200_000):
        self.top = BoardTop(npu=npu, divisor=divisor, sim=True)
        self.divisor = divisor
        self.timeout_cycles = timeout_cycles
        self.cycles = 0
        self._levels = deque()       # line levels still to put on uart_rx, one per bit
        self._received = bytearray()
        self._sim = Simulator(self.top)
        self._sim.add_clock(CLOCK_PERIOD)
        self._sim.add_testbench(self._line, background=True)
        self._now = 0

    async def _line(self, ctx):
        top, d = self.top, self.divisor
        rx_left = 0                  # cycles the current rx level still lasts
        tx_phase = None              # cycles since the start bit's edge, or None when idle
        tx_bits = 0
        async for _ in ctx.tick():
            self.cycles += 1
            if rx_left == 0:
                if self._levels:
                    ctx.set(top.uart_rx, self._levels.popleft())
                    rx_left = d
                else:
                    ctx.set(top.uart_rx, 1)
            if rx_left:
                rx_left -= 1
            tx = ctx.get(top.uart_tx)
            if tx_phase is None:
                if not tx:
                    tx_phase, tx_bits = 0, 0
            else:
                tx_phase += 1
                # Bit k's middle is (k + 0.5) * d cycles after the start edge; k = 1..8 data.
                k, at = divmod(tx_phase - d // 2, d)
                if at == 0 and 1 <= k <= 8:
                    tx_bits |= tx << (k - 1)
                elif at == 0 and k == 9:
                    if tx:
                        self._received.append(tx_bits)
                    tx_phase = None   # a low stop bit: the model drops the character

    def _advance(self, cycles: int) -> None:
        self._now += cycles
        self._sim.run_until(self._now * CLOCK_PERIOD)

    def write(self, data: bytes) -> None:
        for byte in data:
            self._levels.extend(uart_frame(byte))

    def write_levels(self, levels) -> None:
        self._levels.extend(int(v) for v in levels)

    def read(self, n: int) -> bytes:
        quiet = 0
        step = 10 * self.divisor
        while len(self._received) < n:
            have = len(self._received)
            self._advance(step)
            quiet = 0 if len(self._received) > have or self._levels else quiet + step
            if quiet > self.timeout_cycles:
                raise TransportTimeout(f"simulated board: {len(self._received)} of {n} bytes "
                                       f"within {self.timeout_cycles} cycles")
        out = bytes(self._received[:n])
        del self._received[:n]
        return out

    def pause(self, bit_times: int) -> None:
        """Let every queued character go out, then keep the line idle for ``bit_times``."""
        while self._levels:
            self._advance(len(self._levels) * self.divisor)
        self._advance(bit_times * self.divisor)

    def pending(self) -> int:
        """Bytes received and not read yet."""
        return len(self._received)
