"""SEND and RECV launches: one message of scratchpad words from one chip to another.

``SEND`` streams the words its RD7 descriptor walks to chip ``SR_DEST``; ``RECV`` writes the
words of one message from chip ``SR_SRC`` through WR4 (``docs/isa.md``, SEND/RECV). A message
is a whole number of ring words (``D / N`` scratchpad words each).
"""

from __future__ import annotations

from dataclasses import dataclass

from hw.spec.collective import word_bytes
from hw.spec.isa import MAX_COUNT, Op

from .descriptors import Desc

__all__ = ["P2PLaunch", "send_launch", "recv_launch", "contiguous", "message_words", "emit"]


@dataclass(frozen=True)
class P2PLaunch:
    op: Op
    gen: str
    desc: Desc
    regs: dict

    @property
    def words(self) -> int:
        total = 1
        for count in self.desc.n:
            total *= max(1, count)
        return total


def contiguous(base: int, words: int) -> Desc:
    """A descriptor for ``words`` consecutive words from ``base`` (two levels when needed)."""
    if words < 1:
        raise ValueError(f"a message needs at least one word, not {words}")
    if words <= MAX_COUNT:
        return Desc(base, (words, 1, 1, 1), (1, 0, 0, 0))
    inner = next((d for d in range(MAX_COUNT, 0, -1) if words % d == 0), 1)
    if words // inner > MAX_COUNT:
        raise ValueError(f"{words} words do not factor into two 16-bit counts")
    return Desc(base, (inner, words // inner, 1, 1), (1, inner, 0, 0))


def message_words(words: int, size: int, link_bytes: int) -> int:
    """``words`` rounded up to whole ring words (what a buffer must hold to be sent)."""
    ratio = word_bytes(link_bytes, size) // size
    return -(-words // ratio) * ratio


def _check(desc: Desc, size: int, link_bytes: int, what: str) -> Desc:
    total = 1
    for count in desc.n:
        total *= max(1, count)
    ratio = word_bytes(link_bytes, size) // size
    if total % ratio:
        raise ValueError(f"{what} of {total} scratchpad words is not whole ring words of "
                         f"{ratio} words (pad the buffer: message_words)")
    return desc


def send_launch(*, dest: int, desc: Desc, size: int, link_bytes: int) -> P2PLaunch:
    """Send the words ``desc`` walks to chip ``dest``."""
    return P2PLaunch(Op.SEND, "RD7", _check(desc, size, link_bytes, "a SEND"),
                     {"SR_DEST": int(dest)})


def recv_launch(*, src: int, desc: Desc, size: int, link_bytes: int) -> P2PLaunch:
    """Receive one message from chip ``src`` into the words ``desc`` walks."""
    return P2PLaunch(Op.RECV, "WR4", _check(desc, size, link_bytes, "a RECV"),
                     {"SR_SRC": int(src)})


def emit(asm, launch: P2PLaunch):
    """Append the launch's SETs and its ``SEND`` or ``RECV`` to an Assembler."""
    asm.set_desc(launch.gen, launch.desc)
    for name, value in launch.regs.items():
        asm.set(name, value)
    asm.launch(launch.op)
