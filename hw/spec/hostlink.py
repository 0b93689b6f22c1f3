"""The UART host link's protocol: one encoding for the board's gateware and the host driver.

Plain Python (no Amaranth). The gateware is :class:`hw.fpga.uart.HostLink`, the host side
``sim/flows/board.py``; ``docs/fpga.md`` describes the protocol for a reader.

Every request is a fixed 8-byte header, little-endian::

    SYNC (0x5A), command, addr (u32), count (u16)

followed, for the two write commands, by ``count`` words of payload (8 bytes per instruction,
``word_bytes`` per scratchpad word, byte j of a word is its bits 8j..8j+7). Between requests the
link drops every byte but ``SYNC``, so a host resynchronises by sending a header after a pause.

Every request is answered by one status byte, ``ACK`` or a ``NAK_*`` code, then, after an
``ACK`` only, the command's reply bytes. A refused request (``NAK_*``) has no effect; a
framing error (a byte whose stop bit is low) in a header or a payload ends the request with
``NAK_FRAMING`` (the words already written stay written).
"""

from __future__ import annotations

import enum

from .isa import BUSY_COUNTERS

__all__ = ["SYNC", "HEADER_BYTES", "Cmd", "Status", "STATUS_FIELDS", "INFO_FIELDS", "INFO_MAGIC",
           "TRACE_ENTRY_BYTES", "STATUS_BYTES", "INFO_BYTES", "FLAG_DONE", "FLAG_ERROR",
           "FLAG_RUNNING", "FLAG_TRACE_OVERFLOW", "unpack_fields", "reply_bytes"]

SYNC = 0x5A
HEADER_BYTES = 8


class Cmd(enum.IntEnum):
    """The request's second byte."""

    INFO = 0x00         #: reply: the INFO block (what the bitstream was built for)
    WRITE_IMEM = 0x01   #: ``count`` instructions from ``addr``; reply: nothing more
    WRITE_SPAD = 0x02   #: ``count`` scratchpad words from ``addr``
    READ_SPAD = 0x03    #: reply: ``count`` scratchpad words from ``addr``
    START = 0x04        #: run the program from pc 0
    STATUS = 0x05       #: reply: the STATUS block
    READ_TRACE = 0x06   #: reply: trace entries ``addr`` .. ``addr + count - 1``
    RESET = 0x07        #: reset the chip (memories keep their contents): ends a hung program


class Status(enum.IntEnum):
    """The first byte of every reply."""

    ACK = 0x00
    NAK_COMMAND = 0xE1  #: unknown command
    NAK_FRAMING = 0xE2  #: a byte with a low stop bit (or a byte lost to an overrun)
    NAK_BUSY = 0xE3     #: a write, read or start while the chip runs
    NAK_RANGE = 0xE4    #: ``addr + count`` beyond the memory, or ``count`` = 0


#: STATUS block, in order: (name, bytes). ``flags`` bits: FLAG_*; ``busy`` the units busy now
#: (``hw.spec.isa.Unit`` bits); ``busy_cycles`` one u32 per ``hw.spec.isa.BUSY_COUNTERS``.
FLAG_DONE, FLAG_ERROR, FLAG_RUNNING, FLAG_TRACE_OVERFLOW = 1, 2, 4, 8
STATUS_FIELDS = (("flags", 1), ("busy", 1), ("pc", 4), ("cycles", 4), ("trace_count", 4),
                 ("busy_cycles", 4 * len(BUSY_COUNTERS)))
STATUS_BYTES = sum(n for _, n in STATUS_FIELDS)

#: INFO block: the magic, then what the host checks against its NPU configuration.
INFO_MAGIC = b"NPU1"
INFO_FIELDS = (("magic", 4), ("word_bytes", 1), ("sram_words", 4), ("imem_words", 4),
               ("trace_depth", 4), ("divisor", 4))
INFO_BYTES = sum(n for _, n in INFO_FIELDS)

#: A trace entry on the wire: cycle (u32), busy (u8).
TRACE_ENTRY_BYTES = 5


def unpack_fields(fields, raw: bytes) -> dict:
    """Split ``raw`` by ``fields`` into little-endian integers (``magic`` stays bytes)."""
    out, at = {}, 0
    for name, size in fields:
        chunk = raw[at:at + size]
        out[name] = chunk if name == "magic" else int.from_bytes(chunk, "little")
        at += size
    return out


def reply_bytes(cmd: Cmd, count: int, word_bytes: int) -> int:
    """Bytes after the ``ACK`` that answer ``cmd`` with ``count``."""
    return {Cmd.INFO: INFO_BYTES, Cmd.STATUS: STATUS_BYTES, Cmd.READ_SPAD: count * word_bytes,
            Cmd.READ_TRACE: count * TRACE_ENTRY_BYTES}.get(Cmd(cmd), 0)
