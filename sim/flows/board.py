"""``npu board``: run a program on a real FPGA board through its UART host link.

:class:`BoardDriver` speaks the protocol of :mod:`hw.spec.hostlink` over any *transport*: an
object with ``write(data)``, ``read(n) -> bytes`` (raising :class:`TransportTimeout` when the
board does not answer) and ``pause(bit_times)`` (keep the line quiet). Two transports exist:
:class:`SerialTransport` (pyserial, a real board) and
:class:`sim.rtl.uart_model.SimTransport` (the board top in Amaranth's simulator behind a
bit-level UART model), so the driver that runs a real board is the one the tests run.

:func:`run_board` is ``npu board`` as a function: :func:`sim.flows.simulate.simulate` with the board
as its one-chip backend, so the report and the golden comparison are those of ``npu sim``.
"""

from __future__ import annotations

import time

import numpy as np

from hw.spec import ModelConfig, NpuConfig
from hw.spec.collective import ReduceOp
from hw.spec.hostlink import (
    FLAG_DONE,
    FLAG_ERROR,
    FLAG_RUNNING,
    FLAG_TRACE_OVERFLOW,
    HEADER_BYTES,
    INFO_FIELDS,
    INFO_MAGIC,
    STATUS_FIELDS,
    SYNC,
    TRACE_ENTRY_BYTES,
    Cmd,
    Status,
    reply_bytes,
    unpack_fields,
)
from hw.spec.isa import BUSY_COUNTERS, IsaError, Op, decode, reg

from ..errors import BadInput, TransportTimeout
from ..rtl.pysim import SimulationTimeout
from .simulate import simulate

__all__ = ["BoardDriver", "BoardError", "TransportTimeout", "SerialTransport", "run_board",
           "CHUNK_WORDS", "avg_collectives"]

#: Words per write or read request: a refused or garbled request costs at most this many.
CHUNK_WORDS = 256


def avg_collectives(program) -> list[int]:
    """The pcs of the ``COLL`` instructions of ``program`` that run AVG: ``CO_OP`` as the last
    ``SET`` before each left it (the registers are 0, SUM, after the reset that
    :meth:`BoardDriver.run_chip` issues, and a program runs straight through).

    Why: the board's chip has no AVG divider (``hw.fpga.board.COLL_AVG``); an AVG there would
    give the sum. Words that do not decode are left to the chip (it stops with ``error``).
    """
    co_op, op, found = reg("CO_OP"), int(ReduceOp.SUM), []
    for pc, word in enumerate(program):
        try:
            insn = decode(int(word))
        except IsaError:
            continue
        if insn.op is Op.SET and insn.reg == co_op:
            op = insn.value
        elif insn.op is Op.COLL and op == ReduceOp.AVG:
            found.append(pc)
    return found


class BoardError(RuntimeError):
    """The board refused a request (a ``NAK_*`` status) or answered out of protocol."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class BoardDriver:
    """Load, run and read back the chip on a board through ``transport``.

    Every method is one or a few requests of :mod:`hw.spec.hostlink`; a refusal raises
    :class:`BoardError` naming the request and the status (the driver then keeps the line
    quiet for the link's drain time, so that the next request is read).
    """

    #: Bit times of quiet after a refusal: the link drains for 32 (``HostLink``), plus margin.
    DRAIN_BITS = 64

    def __init__(self, transport):
        self.transport = transport
        self._info = None

    # --- requests ---------------------------------------------------------------------------

    def _request(self, cmd: Cmd, addr: int = 0, count: int = 0, payload: bytes = b"",
                 word_bytes: int = 0) -> bytes:
        header = bytes([SYNC, int(cmd)]) + addr.to_bytes(4, "little") + \
            count.to_bytes(2, "little")
        assert len(header) == HEADER_BYTES
        self.transport.write(header + payload)
        status = self.transport.read(1)[0]
        if status != Status.ACK:
            self.transport.pause(self.DRAIN_BITS)
            name = Status(status).name if status in Status._value2member_map_ else hex(status)
            raise BoardError(f"the board refused {cmd.name} (addr {addr}, count {count}): "
                             f"{name}", status)
        need = reply_bytes(cmd, count, word_bytes)
        return self.transport.read(need) if need else b""

    def info(self) -> dict:
        """The INFO block: what the bitstream was built for (checked by :meth:`check`)."""
        raw = self._request(Cmd.INFO)
        info = unpack_fields(INFO_FIELDS, raw)
        if info["magic"] != INFO_MAGIC:
            raise BoardError(f"the board answered INFO with magic {info['magic']!r}, not "
                             f"{INFO_MAGIC!r}: not an npu-scale board top")
        self._info = info
        return info

    def check(self, npu: NpuConfig) -> dict:
        """Refuse (:class:`~sim.errors.BadInput`) a board built for another NPU."""
        info = self.info()
        for key, want in (("word_bytes", npu.word_bytes), ("sram_words", npu.sram_words),
                          ("imem_words", npu.imem_words)):
            if info[key] != want:
                raise BadInput(f"the board's bitstream has {key}={info[key]}, the NPU "
                               f"{npu.name!r} needs {want}: rebuild it with make fpga "
                               f"FPGA_NPU={npu.path or npu.name}")
        return info

    @property
    def word_bytes(self) -> int:
        if self._info is None:
            self.info()
        return self._info["word_bytes"]

    def write_imem(self, addr: int, program) -> None:
        """Write 64-bit instructions from ``addr``."""
        program = [int(w) for w in program]
        for at in range(0, len(program), CHUNK_WORDS):
            chunk = program[at:at + CHUNK_WORDS]
            payload = b"".join(w.to_bytes(8, "little") for w in chunk)
            self._request(Cmd.WRITE_IMEM, addr + at, len(chunk), payload)

    def write_spad(self, addr: int, words: np.ndarray) -> None:
        """Write scratchpad words ([count, word_bytes] uint8, or raw bytes) from ``addr``."""
        if isinstance(words, (bytes, bytearray)):
            words = np.frombuffer(words, np.uint8)
        words = np.asarray(words, np.uint8).reshape(-1, self.word_bytes)
        for at in range(0, len(words), CHUNK_WORDS):
            chunk = words[at:at + CHUNK_WORDS]
            self._request(Cmd.WRITE_SPAD, addr + at, len(chunk), chunk.tobytes())

    def read_spad(self, addr: int, count: int) -> np.ndarray:
        """``count`` scratchpad words from ``addr``, [count, word_bytes] uint8."""
        wb = self.word_bytes
        parts = []
        for at in range(0, count, CHUNK_WORDS):
            n = min(CHUNK_WORDS, count - at)
            raw = self._request(Cmd.READ_SPAD, addr + at, n, word_bytes=wb)
            parts.append(np.frombuffer(raw, np.uint8).reshape(n, wb))
        return np.concatenate(parts) if parts else np.zeros((0, wb), np.uint8)

    def start(self) -> None:
        self._request(Cmd.START)

    def reset(self) -> None:
        """Reset the chip (a hung program ends; memories keep their contents)."""
        self._request(Cmd.RESET)

    def status(self) -> dict:
        """``{done, error, running, trace_overflow, busy, pc, cycles, trace_count,
        busy_cycles: [per hw.spec.isa.BUSY_COUNTERS]}``."""
        raw = self._request(Cmd.STATUS)
        st = unpack_fields(STATUS_FIELDS, raw)
        flags = st.pop("flags")
        counters = st.pop("busy_cycles").to_bytes(4 * len(BUSY_COUNTERS), "little")
        st["busy_cycles"] = [int.from_bytes(counters[4 * k:4 * k + 4], "little")
                             for k in range(len(BUSY_COUNTERS))]
        st.update(done=bool(flags & FLAG_DONE), error=bool(flags & FLAG_ERROR),
                  running=bool(flags & FLAG_RUNNING),
                  trace_overflow=bool(flags & FLAG_TRACE_OVERFLOW))
        return st

    def read_trace(self, count: int) -> list[tuple[int, int]]:
        """The first ``count`` trace entries as ``(cycle, busy)``."""
        entries = []
        for at in range(0, count, CHUNK_WORDS):
            n = min(CHUNK_WORDS, count - at)
            raw = self._request(Cmd.READ_TRACE, at, n)
            for k in range(n):
                e = raw[k * TRACE_ENTRY_BYTES:(k + 1) * TRACE_ENTRY_BYTES]
                entries.append((int.from_bytes(e[:4], "little"), e[4]))
        return entries

    # --- a whole run ------------------------------------------------------------------------

    def run_chip(self, npu: NpuConfig, program, images: dict[int, np.ndarray],
                 reads: list[tuple[int, int]], *, max_cycles: int = 1_000_000,
                 poll_bits: int = 0) -> dict:
        """Load ``images`` and ``program``, run, read ``reads`` back: the contract of
        :func:`sim.rtl.chip_runner.run_chip_pysim` (``load_cycles`` counts the words the host
        port took, one per cycle, as there; the UART's time is in ``load_wall_s``).

        Polls STATUS until ``done``, keeping the line quiet for ``poll_bits`` bit times between
        polls; raises :class:`~sim.rtl.pysim.SimulationTimeout` (after resetting the chip) when
        the chip has run ``max_cycles`` cycles without halting.
        """
        if len(program) > npu.imem_words:
            raise ValueError(f"program of {len(program)} instructions exceeds imem_words "
                             f"{npu.imem_words}")
        avg = avg_collectives(program)
        if avg:
            raise BadInput(f"the program runs a COLL AVG (pc {', '.join(map(str, avg))}): the "
                           "board's chip has no AVG divider (hw/fpga/board.py: COLL_AVG); "
                           "use SUM and divide on the host")
        self.check(npu)
        self.reset()
        t0 = time.perf_counter()
        self.write_imem(0, program)
        for base, words in images.items():
            self.write_spad(base, words)
        load_wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.start()
        while True:
            st = self.status()
            if st["done"]:
                break
            if st["cycles"] > max_cycles:
                self.reset()
                raise SimulationTimeout(f"chip did not halt within max_cycles={max_cycles}: "
                                        f"pc {st['pc']}, busy bits {st['busy']:#x}")
            if poll_bits:
                self.transport.pause(poll_bits)
        wall = time.perf_counter() - t0
        trace = {"entries": self.read_trace(st["trace_count"]),
                 "overflow": st["trace_overflow"]}
        regions = [self.read_spad(base, count) for base, count in reads]
        load = len(program) + sum(len(w) for w in images.values())
        return {"regions": regions, "cycles": st["cycles"], "load_cycles": load,
                "busy_cycles": st["busy_cycles"], "trace": trace, "error": st["error"],
                "wall_s": wall, "load_wall_s": load_wall,
                "cycles_per_s": st["cycles"] / wall if wall > 0 else 0.0}


class SerialTransport:
    """A real board's UART through pyserial (``port``, ``baud``; 8N1, no flow control)."""

    def __init__(self, port: str, baud: int, *, timeout: float = 2.0):
        try:
            # pyserial is optional (the `fpga` extra): only a real board needs it.
            import serial
        except ImportError:
            raise BadInput("pyserial is not installed (pip install pyserial, or the fpga "
                           "extra)") from None
        try:
            self._port = serial.Serial(port, baud, timeout=timeout)
        except (serial.SerialException, ValueError) as exc:
            raise BadInput(f"--port {port}: cannot open at {baud} baud ({exc})") from None
        self._baud = baud
        self._name = port

    def write(self, data: bytes) -> None:
        self._port.write(data)

    def read(self, n: int) -> bytes:
        data = self._port.read(n)
        if len(data) < n:
            raise TransportTimeout(f"{self._name}: {len(data)} of {n} bytes within "
                                   f"{self._port.timeout} s")
        return data

    def pause(self, bit_times: int) -> None:
        self._port.flush()
        time.sleep(bit_times / self._baud)

    def close(self) -> None:
        self._port.close()


def run_board(npu: NpuConfig, model: ModelConfig, driver: BoardDriver, **options):
    """``npu board`` as a function: :func:`sim.flows.simulate.simulate` (strategy ``single``, one
    chip) with the board in place of a simulator. ``options`` are ``simulate``'s (``seed``,
    ``weights``, ``x``, ``calib``, ``batch``, ``max_cycles``). A board that does not answer is
    bad input (exit 2), a refusal too."""
    try:
        return simulate(npu, model, strategy="single", chips=1, backend="board", board=driver,
                        **options)
    except TransportTimeout as exc:
        raise BadInput(f"the board did not answer ({exc}): is the bitstream loaded and the "
                       "baud rate the one it was built for?") from None
    except BoardError as exc:
        raise BadInput(str(exc)) from None
