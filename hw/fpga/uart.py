"""UART receiver and transmitter, and the host link that drives a chip's host port over them.

The link's protocol (framing, commands, replies) is :mod:`hw.spec.hostlink`; the host side is
``sim/flows/board.py``. 8 data bits, no parity, one stop bit, least significant bit first; the baud
rate is the clock divided by ``divisor`` (clocks per bit).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from ..spec import NpuConfig
from ..spec.hostlink import (
    INFO_BYTES,
    INFO_MAGIC,
    STATUS_BYTES,
    SYNC,
    TRACE_ENTRY_BYTES,
    Cmd,
    Status,
)
from ..spec.isa import BUSY_COUNTERS, INSN_BITS, UNIT_BITS
from ..tile.ports import HostSignature, trace_depth

__all__ = ["rx_layout", "UartRx", "UartTx", "HostLink", "MIN_DIVISOR"]

#: The smallest divisor: the receiver samples each bit in its middle, ``divisor // 2`` clocks
#: after the start bit's edge, and needs a few clocks of margin either side.
MIN_DIVISOR = 4


def _check_divisor(divisor):
    if not isinstance(divisor, int) or isinstance(divisor, bool) or divisor < MIN_DIVISOR:
        raise ValueError(f"divisor must be an integer of at least {MIN_DIVISOR} clocks per bit, "
                         f"not {divisor!r}")


def rx_layout():
    """A received byte; ``error``: its stop bit was low, or the previous byte was not taken in
    time (an overrun: that byte is lost)."""
    return data.StructLayout({"data": 8, "error": 1})


class UartRx(wiring.Component):
    """Receive bytes from the ``rx`` pin (idle high) into a stream.

    The pin passes a two-flip-flop synchroniser; a low level starts a byte, which is sampled in
    the middle of each bit. A start bit that is high again at its middle is a glitch and is
    ignored. After a low stop bit (a framing error, or a break) the receiver waits for the line
    to go high before it looks for the next start bit.

    Timing: a byte is on ``o`` about ``9.5 * divisor + 3`` clocks after its start bit's edge;
    ``o`` holds one byte, which must be taken before the next byte's stop bit.

    Members
    -------
    rx : ``In(1)``, the pin
    o : ``Out(stream.Signature(rx_layout()))``
    """

    def __init__(self, *, divisor):
        _check_divisor(divisor)
        self._divisor = divisor
        super().__init__({"rx": In(1, init=1), "o": Out(stream.Signature(rx_layout()))})

    def elaborate(self, platform):
        m = Module()
        d = self._divisor
        rx = Signal(init=1)
        m.submodules.sync_rx = FFSynchronizer(self.rx, rx, init=1)
        timer = Signal(range(d))
        bits = Signal(range(10))
        shreg = Signal(8)
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~rx):
                    m.d.sync += timer.eq(d // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Elif(rx):
                    m.next = "IDLE"           # a glitch, not a start bit
                with m.Else():
                    m.d.sync += [timer.eq(d - 1), bits.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    m.d.sync += [timer.eq(d - 1), shreg.eq(Cat(shreg[1:], rx)),
                                 bits.eq(bits + 1)]
                    with m.If(bits == 7):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(timer != 0):
                    m.d.sync += timer.eq(timer - 1)
                with m.Else():
                    m.d.sync += [self.o.valid.eq(1), self.o.payload.data.eq(shreg),
                                 self.o.payload.error.eq(~rx | (self.o.valid & ~self.o.ready))]
                    m.next = "IDLE"
                    with m.If(~rx):
                        m.next = "BREAK"
            with m.State("BREAK"):
                with m.If(rx):
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """Send the bytes of a stream on the ``tx`` pin (idle high): start bit, 8 data bits least
    significant first, stop bit, ``divisor`` clocks each; a byte is taken when the previous
    one's stop bit has been sent.

    Members
    -------
    i : ``In(stream.Signature(8))``
    tx : ``Out(1)``, the pin
    """

    def __init__(self, *, divisor):
        _check_divisor(divisor)
        self._divisor = divisor
        super().__init__({"i": In(stream.Signature(8)), "tx": Out(1, init=1)})

    def elaborate(self, platform):
        m = Module()
        d = self._divisor
        timer = Signal(range(d))
        left = Signal(range(11))          # bits still to send, start and stop included
        frame = Signal(10, init=0x3FF)
        m.d.comb += [self.tx.eq(frame[0]), self.i.ready.eq(left == 0)]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [frame.eq(Cat(Const(0, 1), self.i.payload, Const(1, 1))),
                         left.eq(10), timer.eq(d - 1)]
        with m.Elif(left != 0):
            with m.If(timer != 0):
                m.d.sync += timer.eq(timer - 1)
            with m.Else():
                m.d.sync += [frame.eq(Cat(frame[1:], Const(1, 1))), left.eq(left - 1),
                             timer.eq(d - 1)]
        return m


def _pad(value, nbytes):
    """``value`` zero-extended to ``nbytes`` bytes (as it goes on the wire)."""
    value = value.as_value() if hasattr(value, "as_value") else value
    assert len(value) <= 8 * nbytes
    return Cat(value, Const(0, 8 * nbytes - len(value))) if len(value) < 8 * nbytes else value


class HostLink(wiring.Component):
    """The protocol of :mod:`hw.spec.hostlink` on a byte stream, driving one chip.

    Requests come in on ``i_rx`` (from :class:`UartRx`), replies leave on ``o_tx`` (to
    :class:`UartTx`). The link writes instructions and scratchpad words through ``host`` (the
    chip's :class:`~hw.tile.ports.HostSignature`), reads words and trace entries back, pulses
    ``start`` and ``chip_reset``, and reports ``done``, ``error``, ``busy``, ``pc``, ``cycles``
    and ``busy_cycles``. It refuses writes, reads and a start while the chip runs
    (``running``: started, and ``done`` not yet raised); after a refused request it drops every
    byte until the line has been quiet for ``32 * divisor`` clocks, so that the rest of a
    refused request is not read as a new one.

    Parameters (keyword-only): ``npu``; ``divisor`` (clocks per bit of the UART, reported by
    ``INFO`` and used for the quiet time).

    Members
    -------
    i_rx : ``In(stream.Signature(rx_layout()))``, o_tx : ``Out(stream.Signature(8))``
    host : ``Out(HostSignature(npu))``
    start, chip_reset : ``Out(1)`` one-cycle pulses
    running : ``Out(1)``
    done, error : ``In(1)``; busy : ``In(UNIT_BITS)``; pc : ``In(32)``; cycles : ``In(32)``
    busy_cycles : ``In(32).array(len(BUSY_COUNTERS))``
    """

    def __init__(self, *, npu: NpuConfig, divisor: int):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        _check_divisor(divisor)
        self._npu, self._divisor = npu, divisor
        super().__init__({
            "i_rx": In(stream.Signature(rx_layout())),
            "o_tx": Out(stream.Signature(8)),
            "host": Out(HostSignature(npu)),
            "start": Out(1),
            "chip_reset": Out(1),
            "running": Out(1),
            "done": In(1),
            "error": In(1),
            "busy": In(UNIT_BITS),
            "pc": In(32),
            "cycles": In(32),
            "busy_cycles": In(32).array(len(BUSY_COUNTERS)),
        })

    def elaborate(self, platform):
        m = Module()
        npu = self._npu
        wb = npu.word_bytes
        host = self.host
        rx = self.i_rx
        depth = trace_depth(npu)

        # Header: cmd, addr (u32), count (u16), shifted in from the top.
        hdr = Signal(56)
        hdr_left = Signal(range(8))
        cmd, addr, count = hdr[0:8], Signal(32), Signal(16)
        status = Signal(8)
        # Payload word being assembled (bytes shifted in from the top) and the reply's bytes.
        wbits = 8 * max(INSN_BITS // 8, wb)
        word = Signal(wbits)
        word_left = Signal(range(max(INSN_BITS // 8, wb) + 1))
        txbuf = Signal(8 * max(STATUS_BYTES, INFO_BYTES, wb, TRACE_ENTRY_BYTES))
        tx_left = Signal(range(len(txbuf) // 8 + 1))
        started = Signal()
        quiet = Signal(range(32 * self._divisor + 1))
        trace_addr = Signal(range(depth))
        wait = Signal(2)

        m.d.comb += [
            self.running.eq(started & ~self.done),
            host.trace_addr.eq(trace_addr),
            host.imem.payload.addr.eq(addr),
            host.imem.payload.data.eq(word[wbits - INSN_BITS:]),
            host.wr.payload.addr.eq(addr),
            host.wr.payload.data.eq(word[wbits - 8 * wb:]),
            host.rd_addr.payload.addr.eq(addr),
            host.rd_addr.payload.last.eq(0),
            self.o_tx.payload.eq(txbuf[:8]),
        ]
        byte_in = rx.valid & rx.ready

        limit = {Cmd.WRITE_IMEM: npu.imem_words, Cmd.WRITE_SPAD: npu.sram_words,
                 Cmd.READ_SPAD: npu.sram_words, Cmd.READ_TRACE: depth}
        # The header's checks, registered in CHECK (the cycle after its last byte) so that
        # DECODE's choice of reply starts at flip-flops: a known command, one refused while
        # the chip runs, a range outside its memory (addr + count past the end, or count 0).
        # `is_[c]`: the command is c, one flip-flop each, for the states after DECODE too.
        end = Signal(33)
        known = Signal()
        busy_cmd = Signal()
        bad_range = Signal()
        is_ = {c: Signal(name=f"is_{c.name.lower()}") for c in Cmd}
        m.d.comb += end.eq(hdr[8:40] + hdr[40:56])

        def reply(m, code):
            # Only the status byte: a reply's further bytes are loaded after it is sent.
            m.d.sync += [status.eq(code), txbuf[:8].eq(code), tx_left.eq(1)]
            m.next = "REPLY"

        with m.FSM():
            with m.State("HUNT"):
                m.d.comb += rx.ready.eq(1)
                with m.If(byte_in & ~rx.payload.error & (rx.payload.data == SYNC)):
                    m.d.sync += hdr_left.eq(7)
                    m.next = "HEADER"
            with m.State("HEADER"):
                m.d.comb += rx.ready.eq(1)
                with m.If(byte_in):
                    m.d.sync += [hdr.eq(Cat(hdr[8:], rx.payload.data)), hdr_left.eq(hdr_left - 1)]
                    with m.If(rx.payload.error):
                        reply(m, Status.NAK_FRAMING)
                    with m.Elif(hdr_left == 1):
                        m.next = "CHECK"
            with m.State("CHECK"):
                ranged = Cat(*[cmd == c for c in limit]).any()
                over = Cat(*[(cmd == c) & (end > n) for c, n in limit.items()]).any()
                m.d.sync += [
                    addr.eq(hdr[8:40]), count.eq(hdr[40:56]),
                    known.eq(Cat(*[cmd == c for c in Cmd]).any()),
                    busy_cmd.eq((cmd != Cmd.INFO) & (cmd != Cmd.STATUS) & (cmd != Cmd.RESET)),
                    bad_range.eq(ranged & ((hdr[40:56] == 0) | over)),
                    *(is_[c].eq(cmd == c) for c in Cmd),
                ]
                m.next = "DECODE"
            with m.State("DECODE"):
                with m.If(~known):
                    reply(m, Status.NAK_COMMAND)
                with m.Elif(self.running & busy_cmd):
                    reply(m, Status.NAK_BUSY)
                with m.Else():
                    with m.If(bad_range):
                        reply(m, Status.NAK_RANGE)
                    with m.Elif(is_[Cmd.WRITE_IMEM] | is_[Cmd.WRITE_SPAD]):
                        m.d.sync += word_left.eq(Mux(is_[Cmd.WRITE_IMEM], INSN_BITS // 8, wb))
                        m.next = "PAYLOAD"
                    with m.Elif(is_[Cmd.START]):
                        m.d.comb += self.start.eq(1)
                        m.d.sync += started.eq(1)
                        m.next = "STARTED"
                    with m.Elif(is_[Cmd.RESET]):
                        m.d.comb += self.chip_reset.eq(1)
                        m.d.sync += started.eq(0)
                        reply(m, Status.ACK)
                    with m.Else():
                        reply(m, Status.ACK)
            with m.State("STARTED"):
                # `done` of the previous run falls the cycle after `start`: reply then.
                reply(m, Status.ACK)
            with m.State("PAYLOAD"):
                m.d.comb += rx.ready.eq(1)
                with m.If(byte_in):
                    m.d.sync += [word.eq(Cat(word[8:], rx.payload.data)),
                                 word_left.eq(word_left - 1)]
                    with m.If(rx.payload.error):
                        reply(m, Status.NAK_FRAMING)
                    with m.Elif(word_left == 1):
                        m.next = "WRITE"
            with m.State("WRITE"):
                stream_ = {Cmd.WRITE_IMEM: host.imem, Cmd.WRITE_SPAD: host.wr}
                taken = Signal()
                for c, s in stream_.items():
                    m.d.comb += s.valid.eq(is_[c])
                    with m.If(is_[c] & s.ready):
                        m.d.comb += taken.eq(1)
                with m.If(taken):
                    m.d.sync += [addr.eq(addr + 1), count.eq(count - 1),
                                 word_left.eq(Mux(is_[Cmd.WRITE_IMEM], INSN_BITS // 8, wb))]
                    with m.If(count == 1):
                        reply(m, Status.ACK)
                    with m.Else():
                        m.next = "PAYLOAD"
            with m.State("REPLY"):
                # The status byte; then the command's reply, or the quiet time after a refusal.
                m.d.comb += self.o_tx.valid.eq(1)
                with m.If(self.o_tx.ready):
                    with m.If(status != Status.ACK):
                        m.d.sync += quiet.eq(0)
                        m.next = "DRAIN"
                    with m.Elif(is_[Cmd.STATUS]):
                        m.d.sync += [txbuf.eq(self._status_block()), tx_left.eq(STATUS_BYTES)]
                        m.next = "SEND"
                    with m.Elif(is_[Cmd.INFO]):
                        m.d.sync += [txbuf.eq(self._info_block()), tx_left.eq(INFO_BYTES)]
                        m.next = "SEND"
                    with m.Elif(is_[Cmd.READ_SPAD]):
                        m.next = "READ"
                    with m.Elif(is_[Cmd.READ_TRACE]):
                        m.next = "TRACE"
                    with m.Else():
                        m.next = "HUNT"
            with m.State("SEND"):
                m.d.comb += self.o_tx.valid.eq(1)
                with m.If(self.o_tx.ready):
                    m.d.sync += [txbuf.eq(txbuf[8:]), tx_left.eq(tx_left - 1)]
                    with m.If(tx_left == 1):
                        with m.If(is_[Cmd.READ_SPAD] & (count != 0)):
                            m.next = "READ"
                        with m.Elif(is_[Cmd.READ_TRACE] & (count != 0)):
                            m.next = "TRACE"
                        with m.Else():
                            m.next = "HUNT"
            with m.State("READ"):
                m.d.comb += host.rd_addr.valid.eq(1)
                with m.If(host.rd_addr.ready):
                    m.next = "READ_WAIT"
            with m.State("READ_WAIT"):
                m.d.comb += host.rd_data.ready.eq(1)
                with m.If(host.rd_data.valid):
                    m.d.sync += [txbuf.eq(host.rd_data.payload.data), tx_left.eq(wb),
                                 addr.eq(addr + 1), count.eq(count - 1)]
                    m.next = "SEND"
            with m.State("TRACE"):
                # The trace buffer's read port has one cycle of latency; wait two.
                m.d.sync += [trace_addr.eq(addr), wait.eq(2)]
                m.next = "TRACE_WAIT"
            with m.State("TRACE_WAIT"):
                m.d.sync += wait.eq(wait - 1)
                with m.If(wait == 0):
                    entry = host.trace_data
                    m.d.sync += [txbuf.eq(Cat(_pad(entry.cycle, 4), _pad(entry.busy, 1))),
                                 tx_left.eq(TRACE_ENTRY_BYTES),
                                 addr.eq(addr + 1), count.eq(count - 1)]
                    m.next = "SEND"
            with m.State("DRAIN"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid):
                    m.d.sync += quiet.eq(0)
                with m.Elif(quiet == 32 * self._divisor):
                    m.next = "HUNT"
                with m.Else():
                    m.d.sync += quiet.eq(quiet + 1)
        return m

    def _status_block(self):
        host = self.host
        flags = Cat(self.done, self.error, self.running, host.trace_overflow)
        return Cat(_pad(flags, 1), _pad(self.busy, 1), _pad(self.pc, 4), _pad(self.cycles, 4),
                   _pad(host.trace_count, 4), *[_pad(c, 4) for c in self.busy_cycles])

    def _info_block(self):
        npu = self._npu
        return Cat(Const(int.from_bytes(INFO_MAGIC, "little"), 32), Const(npu.word_bytes, 8),
                   Const(npu.sram_words, 32), Const(npu.imem_words, 32),
                   Const(trace_depth(npu), 32), Const(self._divisor, 32))
