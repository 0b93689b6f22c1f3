"""UART receiver and transmitter, and the host link (hw.fpga.uart) in Amaranth's simulator.

The link is tested on the board top (hw.fpga.board, ``sim=True``) through the same bit-level
UART model and driver (sim.rtl.uart_model, sim.flows.board) that ``npu board``'s tests use.
"""

import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring

from hw.fpga.uart import HostLink, UartRx, UartTx
from hw.spec import npu_preset
from hw.spec.hostlink import SYNC, Cmd, Status
from hw.spec.isa import Op, Unit
from sim.compiler.assembler import Assembler
from sim.flows.board import BoardDriver, BoardError
from sim.rtl.pysim import SimulationTimeout, run_sim
from sim.rtl.uart_model import SimTransport, uart_frame
from tests.helpers import seeded, small_npu


class _Loop(wiring.Component):
    """A transmitter's pin wired to a receiver's pin."""

    def __init__(self, divisor):
        self.tx, self.rx = UartTx(divisor=divisor), UartRx(divisor=divisor)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx, m.submodules.rx = self.tx, self.rx
        m.d.comb += self.rx.rx.eq(self.tx.tx)
        return m


@pytest.mark.parametrize("divisor", [4, 7])
def test_loopback_every_byte_value(divisor):
    rng = seeded(divisor)
    data = list(range(256)) + [int(v) for v in rng.integers(0, 256, 32)]
    loop = _Loop(divisor)
    got = []

    async def send(ctx):
        for byte in data:
            ctx.set(loop.tx.i.payload, byte)
            ctx.set(loop.tx.i.valid, 1)
            await ctx.tick().until(loop.tx.i.ready)
            ctx.set(loop.tx.i.valid, 0)
            # Random gaps between characters (the line idles high).
            await ctx.tick().repeat(int(rng.integers(1, 3 * divisor)))

    async def receive(ctx):
        ctx.set(loop.rx.o.ready, 1)
        for _ in data:
            (payload,) = await ctx.tick().sample(loop.rx.o.payload).until(loop.rx.o.valid)
            got.append((int(payload.data), int(payload.error)))

    run_sim(loop, [send, receive], max_cycles=len(data) * 14 * divisor + 1000)
    assert got == [(b, 0) for b in data]


def _drive_levels(rx_pin, levels, divisor):
    async def bench(ctx):
        for level in levels:
            ctx.set(rx_pin, level)
            await ctx.tick().repeat(divisor)
        ctx.set(rx_pin, 1)
        await ctx.tick().repeat(4 * divisor)
    return bench


def test_receiver_flags_a_low_stop_bit_and_ignores_a_glitch():
    d = 4
    rx = UartRx(divisor=d)
    got = []
    # A glitch (start bit high again at its middle), a byte with a low stop bit held low (a
    # break), then a good byte once the line has gone high.
    levels = [1, 1] + uart_frame(0x3C, stop=0) + [0, 0, 1, 1] + uart_frame(0xA5)

    async def glitch_then_levels(ctx):
        ctx.set(rx.rx, 0)
        await ctx.tick()
        ctx.set(rx.rx, 1)
        await ctx.tick().repeat(3 * d)
        await _drive_levels(rx.rx, levels, d)(ctx)

    async def receive(ctx):
        ctx.set(rx.o.ready, 1)
        for _ in range(2):
            (payload,) = await ctx.tick().sample(rx.o.payload).until(rx.o.valid)
            got.append((int(payload.data), int(payload.error)))

    run_sim(rx, [glitch_then_levels, receive], max_cycles=2000)
    assert got == [(0x3C, 1), (0xA5, 0)]


def test_receiver_flags_an_overrun():
    d = 4
    rx = UartRx(divisor=d)
    got = []

    async def receive(ctx):
        # Nobody takes the first byte before the second arrives: the second carries `error`.
        await ctx.tick().repeat(25 * d)
        ctx.set(rx.o.ready, 1)
        (payload,) = await ctx.tick().sample(rx.o.payload).until(rx.o.valid)
        got.append((int(payload.data), int(payload.error)))

    run_sim(rx, [_drive_levels(rx.rx, uart_frame(1) + uart_frame(2), d), receive],
            max_cycles=2000)
    assert got == [(2, 1)]


@pytest.mark.parametrize("cls", [UartRx, UartTx])
def test_rejects_a_small_divisor(cls):
    with pytest.raises(ValueError, match=r"divisor must be an integer of at least 4 clocks per "
                                         r"bit, not 3"):
        cls(divisor=3)


def test_link_rejects_bad_parameters():
    with pytest.raises(TypeError, match=r"npu must be an NpuConfig, not 'tiny'"):
        HostLink(npu="tiny", divisor=4)
    with pytest.raises(ValueError, match=r"not True"):
        HostLink(npu=npu_preset("tiny"), divisor=True)


# --- the host link on the board top -------------------------------------------------------------

@pytest.fixture
def board():
    transport = SimTransport(small_npu(), divisor=4, timeout_cycles=5000)
    return transport, BoardDriver(transport)


def _header(cmd, addr=0, count=0):
    return bytes([SYNC, cmd]) + addr.to_bytes(4, "little") + count.to_bytes(2, "little")


def test_link_answers_info_and_round_trips_words(board):
    transport, drv = board
    npu = small_npu()
    info = drv.check(npu)
    assert info == {"magic": b"NPU1", "word_bytes": 4, "sram_words": npu.sram_words,
                    "imem_words": npu.imem_words, "trace_depth": 2 * npu.imem_words,
                    "divisor": 4}
    rng = seeded(5)
    words = rng.integers(0, 256, (5, 4)).astype("uint8")
    drv.write_spad(npu.sram_words - 5, words)       # the last words: the range is inclusive
    assert (drv.read_spad(npu.sram_words - 5, 5) == words).all()
    st = drv.status()
    assert (st["done"], st["running"], st["cycles"]) == (False, False, 0)


def test_link_refuses_bad_requests_and_recovers(board):
    transport, drv = board
    npu = small_npu()
    # Bytes before SYNC are dropped; an unknown command is refused.
    transport.write(b"\x00\x13" + _header(0x77))
    assert transport.read(1) == bytes([Status.NAK_COMMAND])
    transport.pause(drv.DRAIN_BITS)
    # Out of range: one word past the end, and a count of 0.
    for addr, count in ((npu.sram_words - 1, 2), (0, 0)):
        with pytest.raises(BoardError, match="refused READ_SPAD") as exc:
            drv._request(Cmd.READ_SPAD, addr, count, word_bytes=4)
        assert exc.value.status == Status.NAK_RANGE
    with pytest.raises(BoardError, match="NAK_RANGE"):
        drv.write_imem(npu.imem_words, [0])
    # A framing error inside a header: the request ends there, the rest is drained.
    transport.write(bytes([SYNC, Cmd.READ_SPAD]))
    transport.write_levels(uart_frame(0, stop=0) + [1])
    transport.write(bytes(5))
    assert transport.read(1) == bytes([Status.NAK_FRAMING])
    transport.pause(drv.DRAIN_BITS)
    # A refused write leaves memory alone; after the drain the link answers again.
    with pytest.raises(BoardError, match="NAK_RANGE"):
        drv.write_spad(npu.sram_words - 1, bytes(8))
    drv.write_spad(3, bytes([1, 2, 3, 4]))
    assert drv.read_spad(3, 1).tolist() == [[1, 2, 3, 4]]
    assert transport.pending() == 0


def test_link_refuses_writes_while_running_and_resets(board):
    transport, drv = board
    # A receive from a chip that never sends: the chip runs until reset.
    asm = Assembler()
    asm.set("SR_SRC", 1)
    asm.launch(Op.RECV)
    asm.halt()
    drv.write_imem(0, asm.words())
    drv.start()
    st = drv.status()
    assert st["running"] and not st["done"] and st["busy"] == Unit.RECV and st["cycles"] > 0
    for request in (lambda: drv.write_spad(0, bytes(4)), drv.start,
                    lambda: drv.read_spad(0, 1), lambda: drv.write_imem(0, [0])):
        with pytest.raises(BoardError, match="NAK_BUSY"):
            request()
    drv.reset()
    st = drv.status()
    assert not st["running"] and st["busy"] == 0 and st["pc"] == 0
    with pytest.raises(SimulationTimeout, match="max_cycles=500"):
        drv.run_chip(small_npu(), asm.words(), {}, [], max_cycles=500)
    assert not drv.status()["running"]
