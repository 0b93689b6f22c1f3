"""The ISS's SEND and RECV: point-to-point messages between two chips of a ring.

A chip posts its SEND (:func:`post_send`: the destination ``SR_DEST`` and the words RD7 walks)
or its RECV (:func:`post_recv`: the source ``SR_SRC`` and the addresses WR4 walks); a SEND
from chip a to chip b meets the RECV on b from a, and :func:`execute_transfer` copies the
words. A message is a whole number of ring words (``D / N`` scratchpad words each); the two
sides must walk the same number of words (the RTL would wait forever otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw.spec.ring import check_chip_id

from .errors import IssError

__all__ = ["PendingSend", "PendingRecv", "post_send", "post_recv", "execute_transfer"]


@dataclass
class PendingSend:
    """A posted SEND: ``chip`` sends ``words`` to ``peer`` (``SR_DEST``)."""

    chip: int
    peer: int
    pc: int
    words: np.ndarray

    @property
    def dest(self) -> int:
        return self.peer

    def describe(self) -> str:
        return f"SEND of {len(self.words)} words to chip {self.peer}"


@dataclass
class PendingRecv:
    """A posted RECV: ``chip`` takes a message from ``peer`` (``SR_SRC``) into ``addrs``."""

    chip: int
    peer: int
    pc: int
    addrs: np.ndarray

    @property
    def src(self) -> int:
        return self.peer

    def describe(self) -> str:
        return f"RECV of {len(self.addrs)} words from chip {self.peer}"


def _ratio(iss) -> int:
    return iss.npu.ring_word_bytes // iss.n


def _check_words(iss, count, what):
    ratio = _ratio(iss)
    if count % ratio:
        raise IssError(f"{what} walks {count} scratchpad words: a message is whole ring words "
                       f"of {ratio} scratchpad words")


def post_send(iss, chips: int) -> PendingSend:
    try:
        dest = check_chip_id(iss._reg("SR_DEST"), chips, "SR_DEST")
    except ValueError as exc:
        raise IssError(f"SEND with {exc}") from None
    words = iss._gather("RD7")
    _check_words(iss, len(words), "SEND: RD7")
    return PendingSend(iss.chip, dest, iss.pc, words)


def post_recv(iss, chips: int) -> PendingRecv:
    try:
        src = check_chip_id(iss._reg("SR_SRC"), chips, "SR_SRC")
    except ValueError as exc:
        raise IssError(f"RECV with {exc}") from None
    addrs = iss.desc("WR4")
    _check_words(iss, len(addrs), "RECV: WR4")
    iss._access.writes.append(addrs)
    return PendingRecv(iss.chip, src, iss.pc, addrs)


def execute_transfer(send: PendingSend, recv: PendingRecv, isses) -> None:
    """Copy a message; its two sides must have the same length."""
    if len(send.words) != len(recv.addrs):
        raise IssError(f"mismatched lengths: chip {send.chip} (pc {send.pc}) sends "
                       f"{len(send.words)} words to chip {recv.chip}, whose RECV (pc {recv.pc}) "
                       f"takes {len(recv.addrs)}")
    isses[recv.chip]._scatter("WR4", send.words, recv.addrs)
