"""The chip's ring port: how a word finds its chip, and point-to-point transfers.

Plain Python, no Amaranth. Every word on a link carries a **tag** beside its data and ``last``:
``dest`` (the chip it is for), ``src`` (the chip that sent it) and ``chan`` (which unit takes
it: :data:`CHAN_COLL` the collective engine, :data:`CHAN_P2P` the receive unit, :data:`CHAN_CTS`
the send unit's clear-to-send flags). Each chip's router (``hw/ring/router.py``) delivers a word
whose ``dest`` is the chip's own id and forwards every other word to the next chip, with no
instruction on that chip: only the chips a transfer is between take part in it.

- **Collectives** (``COLL``): a group member sends every word to the next member of its group
  (:func:`coll_dest`); the last member's words reach the first member through the chips
  outside the group, forwarded by their routers. A ``COLL`` on a chip outside its group is a
  no-op. Groups that share no chip run their collectives at the same time.
- **Point-to-point** (``SEND`` / ``RECV``): ``SEND`` streams the words its read generator (RD7)
  walks to chip ``SR_DEST``, ``last`` on the final one; ``RECV`` takes the words of one message
  from chip ``SR_SRC`` (until ``last``) and writes them through WR4. A ``RECV`` first sends a
  one-word clear-to-send (CTS) to its source; a ``SEND`` streams only once it holds a CTS from
  its destination. So message words enter the ring only when the receiver is taking them:
  they never wait at a router for a ``RECV`` to come (which could block other chips' traffic
  behind them), and a message is never dropped or mixed with another. A message is a whole
  number of ring words of ``D = max(2 * link_bytes_per_cycle, 8)`` bytes: RD7 and WR4 walk a
  multiple of ``D / N`` scratchpad words.
"""

from __future__ import annotations

from .collective import check_chips
from .topology import chip_bits

__all__ = ["RTL_MAX_CHIPS", "CHIP_BITS", "CHAN_BITS", "CHAN_COLL", "CHAN_P2P", "CHAN_CTS",
           "TAG_BITS", "coll_dest", "check_chip_id", "check_rtl_chips"]

#: Chips on the gateware's ring (``hw/chip.py``, ``hw/ring/``, ``hw/system.py``): its tags,
#: clear-to-send flags and the collective engine's counters are sized for this many. The
#: ISS, the timing models and the planner take systems of up to
#: ``hw.spec.topology.MAX_CHIPS`` chips; the RTL backends refuse more than this.
RTL_MAX_CHIPS = 8
#: Bits of a chip id (``dest``, ``src``) in the gateware: :func:`~hw.spec.topology.chip_bits`
#: of :data:`RTL_MAX_CHIPS`.
CHIP_BITS = chip_bits(RTL_MAX_CHIPS)
#: Bits of ``chan``, and its values: collective-engine words, point-to-point message words,
#: clear-to-send tokens (one word each, its data unused).
CHAN_BITS = 2
CHAN_COLL = 0
CHAN_P2P = 1
CHAN_CTS = 2
#: Bits of a word's tag: ``dest`` (low bits), ``src``, ``chan``.
TAG_BITS = 2 * CHIP_BITS + CHAN_BITS


def coll_dest(*, first: int, count: int, chips: int, rank: int) -> int | None:
    """The chip a group member's collective words go to: the next member of its group
    (wrapping to the first); None for a chip outside the group."""
    pos = (rank - first) % chips
    if pos >= count:
        return None
    return (first + (pos + 1) % count) % chips


def check_rtl_chips(chips, what: str = "the gateware's ring") -> int:
    """``chips`` if the gateware's ring holds it (1..:data:`RTL_MAX_CHIPS`); a ``ValueError``
    naming the limit otherwise (larger systems run on the ISS and the timing models)."""
    return check_chips(chips, RTL_MAX_CHIPS, f"{what} (hw.spec.ring.RTL_MAX_CHIPS; larger "
                       "systems run on the ISS)")


def check_chip_id(value: int, chips: int, what: str) -> int:
    """``value`` if it names a chip of a ring of ``chips``; ``ValueError`` naming ``what``."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < chips:
        raise ValueError(f"{what}={value!r} is not a chip of the ring of {chips} (0..{chips - 1})")
    return value
