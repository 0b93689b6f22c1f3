"""The chip's ring ports: how a word finds its chip, and point-to-point transfers.

Plain Python, no Amaranth. Every word on a link carries a **tag** beside its data and ``last``:
``dest`` (the chip it is for), ``src`` (the chip that sent it) and ``chan`` (which unit takes
it: :data:`CHAN_COLL` collective engine 0, :data:`CHAN_COLL1` collective engine 1,
:data:`CHAN_P2P` the receive unit, :data:`CHAN_CTS` the send unit's clear-to-send store).
Chip ids are :func:`~hw.spec.topology.chip_bits` bits of the system the gateware is built
for (:func:`tag_bits`). Each chip's router (``hw/ring/router.py``) delivers a word whose
``dest`` is the chip's own id and forwards every other word, with no instruction on that chip:
only the chips a transfer is between take part in it.

- **Routing** (:func:`route_dim`). A chip has one port per dimension of its system: a ring's
  chip one (dimension 0), a torus's two (0: along its row, to chip ``(x + 1, y)``; 1: along
  its column, to ``(x, y + 1)``; ``hw.spec.topology``). A word moves along dimension 1 until
  it is in its destination's row, then along dimension 0 to it (dimension-order routing, the
  column first): a router needs only its row's first and last chip ids to decide, no
  division of chip ids into coordinates. On a ring every word moves along dimension 0.
- **Collectives** (``COLL``): a group member sends every word to the next member of its group
  (``CO_NEXT``); the routers carry it there, through the chips between. A ``COLL`` on a chip
  outside its group is a no-op. Groups that share no chip run their collectives at the same
  time; on a torus, groups on different rows (or columns) share no link either.
- **Point-to-point** (``SEND`` / ``RECV``): ``SEND`` streams the words its read generator (RD7)
  walks to chip ``SR_DEST``, ``last`` on the final one; ``RECV`` takes the words of one message
  from chip ``SR_SRC`` (until ``last``) and writes them through WR4. A ``RECV`` first sends a
  one-word clear-to-send (CTS) to its source; a ``SEND`` streams only once it holds a CTS from
  its destination. So message words enter the network only when the receiver is taking them:
  they never wait at a router for a ``RECV`` to come (which could block other chips' traffic
  behind them), and a message is never dropped or mixed with another. A chip holds the tokens
  that have arrived for SENDs not yet run in a store of :data:`CTS_SLOTS` entries (a token's
  source chip each; a receiver has at most one open RECV, so a sender holds at most one token
  per receiver): a token finding the store full waits on its link until a SEND takes one. A
  message is a whole number of ring words of ``D = max(2 * link_bytes_per_cycle, 8)`` bytes:
  RD7 and WR4 walk a multiple of ``D / N`` scratchpad words.
"""

from __future__ import annotations

from .collective import check_chips
from .topology import MAX_CHIPS, chip_bits

__all__ = ["CHAN_BITS", "CHAN_COLL", "CHAN_P2P", "CHAN_CTS", "CHAN_COLL1", "COLL_CHANS",
           "CTS_SLOTS", "NODE_CHIP_BITS", "tag_bits", "route_dim", "check_chip_id",
           "check_rtl_chips"]

#: Bits of ``chan``, and its values: collective engine 0's words, point-to-point message words,
#: clear-to-send tokens (one word each, its data unused), collective engine 1's words.
CHAN_BITS = 2
CHAN_COLL = 0
CHAN_P2P = 1
CHAN_CTS = 2
CHAN_COLL1 = 3
#: ``chan`` of each collective engine's words.
COLL_CHANS = (CHAN_COLL, CHAN_COLL1)
#: Clear-to-send tokens a chip's send unit holds at most (tokens for SENDs not yet run).
CTS_SLOTS = 4
#: Chip-id bits of the chip the Verilator backend builds once for every system size
#: (``hw.system.ChipNode``): :data:`hw.spec.topology.MAX_CHIPS` chips.
NODE_CHIP_BITS = chip_bits(MAX_CHIPS)


def tag_bits(chip_id_bits: int) -> int:
    """Bits of a word's tag: ``dest`` (low bits), ``src`` (chip ids of ``chip_id_bits``),
    ``chan``."""
    return 2 * chip_id_bits + CHAN_BITS


def route_dim(dest: int, row_first: int, row_last: int) -> int:
    """The dimension a word for chip ``dest`` leaves a chip of the row ``row_first ..
    row_last`` by: 0 (along the row) when ``dest`` is in that row, else 1 (along the column).
    On a ring the row is every chip."""
    return 0 if row_first <= dest <= row_last else 1


def check_rtl_chips(chips, what: str = "the gateware") -> int:
    """``chips`` if the gateware holds a system of that many (1..:data:`MAX_CHIPS`, its chip
    ids sized from it); a ``ValueError`` naming the limit otherwise."""
    return check_chips(chips, MAX_CHIPS, what)


def check_chip_id(value: int, chips: int, what: str) -> int:
    """``value`` if it names a chip of a ring of ``chips``; ``ValueError`` naming ``what``."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < chips:
        raise ValueError(f"{what}={value!r} is not a chip of the ring of {chips} (0..{chips - 1})")
    return value
