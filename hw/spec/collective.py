"""Collective operations on the ring: encodings, requests, step schedules, word packing, costs.

Plain Python (and NumPy), no Amaranth: the collective engine's gateware
(:mod:`hw.ring.collective`), the golden model (:mod:`sim.golden.collectives`), the host-side test
DMA packing and, later, the instruction-set simulator and the compiler all read this module.

Semantics (MPI rank order)
--------------------------
A collective runs over a **group** of ``count`` consecutive chips starting at ``first`` on a ring
of ``chips`` chips, wrapping around (first=6, count=4 on 8 chips is chips 6, 7, 0, 1). A member's
**group rank** ``p`` is its distance from ``first`` along the ring. Chips outside the group
forward ring traffic and produce no output.

A vector of ``length`` elements is split into ``count`` blocks like ``numpy.array_split``: the
first ``length % count`` blocks are one element longer. After a reduce-scatter group rank ``p``
holds block ``p`` of the reduction; an all-gather's result is the blocks concatenated by group
rank (chip ``first`` first). For an all-gather, ``length`` is the *result* length and a member
contributes its block ``p``.

Ops: ``SUM`` wraps modulo ``2**width`` (associative, so partial sums stay bit-exact); ``MAX`` and
``MIN`` are signed; ``AVG`` is ``floor(wrap(sum) / count)``: the floor (towards minus infinity) of
the *wrapped* two's-complement sum divided by the group size. It equals the floor of the exact
mean whenever the exact sum fits in ``width`` bits; when it does not, it is the wrapped sum's
mean (documented, not an error: the sum is the same one ``SUM`` returns).

Step schedule (how the engine sequences a collective)
-----------------------------------------------------
Each chip executes a list of :class:`Step`: one block streamed as whole **words** (a word is
:func:`word_bytes` bytes; a block starts on a fresh word and its last word is padded). A step takes
its words from the ring (``rx``), the local input stream (``local``), both (combined by the op),
or neither (a zero word, only for the barrier token), and sends them to the ring (``tx``), the
local output stream (``out``), both, or nowhere. Member ``p`` of a group of ``n``:

* reduce-scatter: ``n`` steps; step ``s`` carries block ``(p - 1 - s) mod n``; step 0 is
  local -> tx, steps ``1..n-2`` are rx+local -> tx, step ``n-1`` is rx+local -> out (final).
* all-reduce: ``2n - 1`` steps, block ``(p - 1 - s) mod n``: the reduce-scatter steps, except that
  the final step goes to tx and out, then ``n - 1`` gather steps rx -> tx and out (the last one
  rx -> out).
* all-gather: ``n`` steps, block ``(p - s) mod n``: step 0 local -> tx and out, then rx -> tx and
  out (the last one rx -> out).
* ``n == 1``: one step local -> out.
* send/recv (group of 2): rank 0 streams ``length`` elements local -> tx, rank 1 rx -> out.
* barrier (``n >= 2``): rank 0 sends a token (zero word) and, when it comes back (everyone has
  arrived), a release token; ranks ``1..n-2`` forward both; rank ``n-1`` forwards the first and
  swallows the release.

A chip outside the group replays group rank ``n - 1``'s steps that transmit, as rx -> tx: exactly
the traffic that crosses it. The local input stream delivers the blocks of the steps that use
``local``, in step order (see :func:`local_blocks`), and the output stream returns the blocks of
the steps that go ``out`` (:func:`output_blocks`): the address generators (here the test DMA's
host-side packing) place them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from .topology import MAX_CHIPS as TOPOLOGY_MAX_CHIPS

__all__ = ["Kind", "ReduceOp", "WIDTHS", "MAX_CHIPS", "LENGTH_BITS", "CollectiveRequest", "Step",
           "block_sizes", "block_offsets", "word_bytes", "elements_per_word", "steps",
           "step_words", "max_block_words", "check_fits", "local_blocks", "output_blocks",
           "pack_blocks", "unpack_blocks", "bidirectional_split", "reverse_rank",
           "engine_to_words", "words_to_engine", "check_chips", "COUNT_FIELD_BITS",
           "len_register", "count_register", "request_from_registers"]


class Kind(enum.IntEnum):
    """Collective kinds, as encoded in the engine's command ``kind`` field (3 bits)."""

    ALL_REDUCE = 0
    REDUCE_SCATTER = 1
    ALL_GATHER = 2
    SEND_RECV = 3
    BARRIER = 4


class ReduceOp(enum.IntEnum):
    """Reduction ops, as encoded in the command ``op`` field (2 bits) and ``CO_OP``."""

    SUM = 0
    MAX = 1
    MIN = 2
    AVG = 3


WIDTHS = (32, 64)
#: Chips in one system (``hw.spec.topology.MAX_CHIPS``): a request's ``chips``, ranks and
#: group fields are chip ids of ``hw.spec.topology.chip_bits`` bits. The gateware's ring holds
#: fewer (``hw.spec.ring.RTL_MAX_CHIPS``).
MAX_CHIPS = TOPOLOGY_MAX_CHIPS
#: Bits of the command's ``length`` field: at most 2**24 - 1 elements per collective.
LENGTH_BITS = 24
#: Bits of ``CO_COUNT``'s group size field; the bits above it hold ``length mod count``.
COUNT_FIELD_BITS = 16


def block_sizes(length: int, n: int) -> list[int]:
    """Sizes of ``numpy.array_split(range(length), n)``: the first ``length % n`` are longer."""
    q, r = divmod(length, n)
    return [q + (j < r) for j in range(n)]


def block_offsets(length: int, n: int) -> list[int]:
    """Start element of each block of :func:`block_sizes`."""
    q, r = divmod(length, n)
    return [j * q + min(j, r) for j in range(n)]


def word_bytes(link_bytes: int, size: int = 1) -> int:
    """Bytes of one engine word: ``max(2 * link_bytes, 8)``, rounded up to whole link flits
    and whole scratchpad words of ``size`` bytes (the chip's ``array_size``).

    A word holds a 64-bit element, and the engine's datapath (one word per cycle) is at least
    twice as fast as the link, so that it can catch up with the data it receives; it moves
    whole scratchpad words. Where ``2 * link_bytes`` is already whole scratchpad words (every
    chip the gateware builds: :meth:`hw.spec.NpuConfig.ring_port_error`) the word is
    ``max(2 * link_bytes, 8)``; a wider array (320 lanes on 64-byte links: a word of one
    scratchpad word, five flits) gets the next multiple of both, which the compiler, the ISS
    and the timing models take, the gateware not.

    ``link_bytes`` must be a power of two.
    """
    if not isinstance(link_bytes, int) or link_bytes < 1 or link_bytes & (link_bytes - 1):
        raise ValueError(f"link_bytes_per_cycle must be a power of two, not {link_bytes!r}")
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive number of bytes, not {size!r}")
    unit = math.lcm(link_bytes, size, 8)
    return -(-max(2 * link_bytes, 8) // unit) * unit


def elements_per_word(wbytes: int, width: int) -> int:
    return wbytes * 8 // width


@dataclass(frozen=True)
class CollectiveRequest:
    """One collective as every chip's command gives it; validated on construction.

    ``length`` is the per-chip input length for all-reduce and reduce-scatter, the result length
    for all-gather, the message length for send/recv, ignored (but >= 1) for the barrier.
    ``count=None`` means the whole ring.
    """

    kind: Kind
    op: ReduceOp
    width: int
    length: int
    chips: int
    first: int = 0
    count: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "kind", _enum(Kind, self.kind, "kind"))
        object.__setattr__(self, "op", _enum(ReduceOp, self.op, "op"))
        for name in ("width", "length", "chips", "first"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an integer, not {value!r}")
        if self.count is None:
            object.__setattr__(self, "count", self.chips)
        if not isinstance(self.count, int) or isinstance(self.count, bool):
            raise TypeError(f"count must be an integer, not {self.count!r}")
        if self.width not in WIDTHS:
            raise ValueError(f"width must be 32 or 64, not {self.width}")
        check_chips(self.chips)
        if not 1 <= self.length < 1 << LENGTH_BITS:
            raise ValueError(f"length must be 1..{(1 << LENGTH_BITS) - 1} elements, "
                             f"not {self.length}")
        if not 0 <= self.first < self.chips:
            raise ValueError(f"group first={self.first} is outside the ring of {self.chips} "
                             f"chips (0..{self.chips - 1})")
        if not 1 <= self.count <= self.chips:
            raise ValueError(f"group count={self.count} must be 1..{self.chips} "
                             f"(the ring has {self.chips} chips)")
        if self.kind == Kind.SEND_RECV and self.count != 2:
            raise ValueError(f"send/recv needs a group of 2 chips (sender, receiver), "
                             f"not count={self.count}")

    @property
    def members(self) -> tuple[int, ...]:
        """Chips of the group in group-rank order."""
        return tuple((self.first + p) % self.chips for p in range(self.count))

    def position(self, chip: int) -> int | None:
        """Group rank of ``chip``, or None when it is outside the group."""
        p = (chip - self.first) % self.chips
        return p if p < self.count else None

    def blocks(self) -> list[int]:
        if self.kind == Kind.SEND_RECV:
            return [self.length]
        if self.kind == Kind.BARRIER:
            return [0]
        return block_sizes(self.length, self.count)


def _enum(cls, value, name):
    if isinstance(value, str):
        try:
            return cls[value.upper()]
        except KeyError:
            raise ValueError(f"{name} must be one of {', '.join(m.name.lower() for m in cls)}, "
                             f"not {value!r}") from None
    try:
        return cls(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {', '.join(m.name.lower() for m in cls)}, "
                         f"not {value!r}") from None


@dataclass(frozen=True)
class Step:
    """One step of a chip's schedule: which block, where its words come from and go."""

    block: int
    rx: bool
    local: bool
    tx: bool
    out: bool
    final: bool = False  # the reduction is complete: AVG divides here


def steps(req: CollectiveRequest, chip: int) -> list[Step]:
    """The step schedule of ``chip`` (see the module docstring); the hardware mirrors it."""
    n, p = req.count, req.position(chip)
    if req.kind == Kind.SEND_RECV:
        return {0: [Step(0, False, True, True, False)],
                1: [Step(0, True, False, False, True)]}.get(p, [])
    if req.kind == Kind.BARRIER:
        if n == 1:
            return []
        if p is None:
            return [Step(0, True, False, True, False)]
        first = Step(0, p != 0, False, True, False)
        release = Step(0, True, False, p != n - 1, False)
        return [first, release]
    if p is None:
        relayed = steps(req, req.members[-1])[:-1]
        return [Step(s.block, True, False, True, False) for s in relayed]
    gather = req.kind == Kind.ALL_GATHER
    total = {Kind.REDUCE_SCATTER: n, Kind.ALL_GATHER: n, Kind.ALL_REDUCE: 2 * n - 1}[req.kind]
    out = []
    for s in range(total):
        block = (p - s - (not gather)) % n
        last = s == total - 1
        if not gather and s <= n - 1:          # reduce phase
            step = Step(block, rx=s > 0, local=True, tx=not last, out=s == n - 1,
                        final=s == n - 1)
        else:                                  # gather phase
            step = Step(block, rx=not (gather and s == 0), local=gather and s == 0,
                        tx=not last, out=True)
        out.append(step)
    return out


def step_words(req: CollectiveRequest, step: Step, wbytes: int) -> int:
    """Words one step streams: its block padded to whole words (the barrier token is 1)."""
    if req.kind == Kind.BARRIER:
        return 1
    epw = elements_per_word(wbytes, req.width)
    return -(-req.blocks()[step.block] // epw)


def max_block_words(req: CollectiveRequest, wbytes: int) -> int:
    """Largest step in words: the engine's receive buffer must hold it."""
    return max(step_words(req, Step(b, False, False, False, False), wbytes)
               for b in range(len(req.blocks())))


def check_fits(req: CollectiveRequest, wbytes: int, fifo_words: int) -> None:
    """Raise ValueError when a block of ``req`` exceeds the engine's receive buffer."""
    need = max_block_words(req, wbytes)
    if need > fifo_words:
        raise ValueError(f"a block of {need} words ({need * wbytes} B) exceeds the collective "
                         f"engine's buffers of fifo_words={fifo_words}; split the collective "
                         f"or build the engine with fifo_words >= {need}")


def local_blocks(req: CollectiveRequest, chip: int) -> list[int]:
    """Blocks the local input stream must deliver, in order."""
    return [s.block for s in steps(req, chip) if s.local]


def output_blocks(req: CollectiveRequest, chip: int) -> list[int]:
    """Blocks the local output stream returns, in order."""
    return [s.block for s in steps(req, chip) if s.out]


def _lanes(values: np.ndarray, width: int) -> np.ndarray:
    """Elements as little-endian 32-bit lanes (a 64-bit element is lanes low, high)."""
    dtype = "<i4" if width == 32 else "<i8"
    return np.ascontiguousarray(np.asarray(values).astype(dtype)).view("<u4")


def pack_blocks(vector, req: CollectiveRequest, blocks: list[int], wbytes: int) -> list[int]:
    """Words (as integers of ``8 * wbytes`` bits) streaming ``blocks`` of ``vector``.

    For all-gather, ``vector`` is the member's own block; otherwise the whole per-chip vector.
    """
    vector = np.asarray(vector)
    sizes = req.blocks()
    offsets = [0] if req.kind == Kind.SEND_RECV else block_offsets(req.length, req.count)
    epw = elements_per_word(wbytes, req.width)
    lanes_per_word = wbytes // 4
    words = []
    for b in blocks:
        if req.kind == Kind.ALL_GATHER:
            chunk = vector
        else:
            chunk = vector[offsets[b]:offsets[b] + sizes[b]]
        padded = np.zeros(-(-sizes[b] // epw) * epw, dtype=np.int64)
        padded[:sizes[b]] = chunk
        lanes = _lanes(padded, req.width).reshape(-1, lanes_per_word)
        words += [int.from_bytes(row.tobytes(), "little") for row in lanes]
    return words


def unpack_blocks(words: list[int], req: CollectiveRequest, blocks: list[int],
                  wbytes: int) -> dict[int, np.ndarray]:
    """Inverse of :func:`pack_blocks`: ``{block: elements}`` from the streamed words."""
    sizes = req.blocks()
    epw = elements_per_word(wbytes, req.width)
    dtype = np.int32 if req.width == 32 else np.int64
    result, at = {}, 0
    for b in blocks:
        count = -(-sizes[b] // epw)
        raw = b"".join(int(w).to_bytes(wbytes, "little") for w in words[at:at + count])
        at += count
        wire = "<i4" if req.width == 32 else "<i8"
        result[b] = np.frombuffer(raw, dtype=wire)[:sizes[b]].astype(dtype)
    if at != len(words):
        raise ValueError(f"{len(words)} words streamed, {at} expected")
    return result


def bidirectional_split(req: CollectiveRequest):
    """How a bidirectional ring runs ``req``: ``(forward, reverse)`` requests.

    An all-reduce sends its first ``length - length // 2`` elements around the forward ring and
    the rest around the reverse ring (``reverse`` is None when that is empty). The reverse
    request is in the reverse ring's ranks, where chip ``i`` is ``reverse_rank(i)``; its group
    starts at the reverse rank of the group's last chip. Other kinds use the forward ring only.
    """
    if req.kind != Kind.ALL_REDUCE:
        return req, None
    half = req.length // 2
    fields = {"kind": req.kind, "op": req.op, "width": req.width, "chips": req.chips,
              "count": req.count}
    forward = CollectiveRequest(length=req.length - half, first=req.first, **fields)
    if half == 0:
        return forward, None
    reverse = CollectiveRequest(length=half, first=(req.chips - req.first - req.count)
                                % req.chips, **fields)
    return forward, reverse


def reverse_rank(chip: int, chips: int) -> int:
    """Rank of ``chip`` on the reverse ring (which runs chip i -> i - 1)."""
    return chips - 1 - chip


def check_chips(chips, limit: int = MAX_CHIPS, what: str = "a system") -> int:
    """``chips`` if it is a chip count ``what`` supports (1..``limit``, by default
    :data:`MAX_CHIPS`): the one check every N-chip component and simulator makes (the
    gateware's with ``hw.spec.ring.RTL_MAX_CHIPS``). ``TypeError`` / ``ValueError``
    otherwise."""
    if not isinstance(chips, int) or isinstance(chips, bool):
        raise TypeError(f"chips must be an integer, not {chips!r}")
    if not 1 <= chips <= limit:
        raise ValueError(f"chips must be 1..{limit}, not {chips}: {what} holds at most {limit}")
    return chips


def engine_to_words(values, wbytes: int, size: int) -> np.ndarray:
    """Engine words (integers of ``8 * wbytes`` bits) as [count * wbytes / size, size] uint8
    scratchpad words: an engine word is ``wbytes / size`` consecutive scratchpad words, the
    first holding the low bytes."""
    raw = b"".join(int(v).to_bytes(wbytes, "little") for v in values)
    return np.frombuffer(raw, np.uint8).reshape(-1, size).copy()


def words_to_engine(words, wbytes: int) -> list[int]:
    """[count, size] uint8 scratchpad words as engine words (inverse of
    :func:`engine_to_words`)."""
    raw = np.ascontiguousarray(np.asarray(words, np.uint8)).tobytes()
    if len(raw) % wbytes:
        raise ValueError(f"{len(raw)} bytes are not whole engine words of {wbytes} bytes")
    return [int.from_bytes(raw[i:i + wbytes], "little") for i in range(0, len(raw), wbytes)]


def len_register(length: int, count: int) -> int:
    """``CO_LEN``'s value for ``length`` elements over a group of ``count``: the length in bits
    ``[23:0]`` and the block length ``length // count`` in bits ``[47:24]``.

    The engine has no divider: the block geometry of every collective is a constant of the
    program, so the compiler divides (a one-cycle divider of 24 bits by the group size set the
    FPGA clock; a multi-cycle one would delay each collective's first word)."""
    return length | (length // count) << LENGTH_BITS


def count_register(count: int, length: int) -> int:
    """``CO_COUNT``'s value: the group size in bits ``[15:0]`` and ``length mod count`` (how many
    blocks are one element longer, ``numpy.array_split``'s) in bits ``[31:16]``."""
    return count | (length % count) << COUNT_FIELD_BITS


def request_from_registers(regs) -> tuple[CollectiveRequest, int]:
    """The request and the chip's rank a COLL's ``CO_*`` registers give (``regs`` maps each
    register's name to its value). ``ValueError`` naming the registers when they do not
    describe a collective, or when the block fields of ``CO_LEN`` and ``CO_COUNT`` are not
    the division of its length by its group size."""
    length_value, count_value = regs["CO_LEN"], regs["CO_COUNT"]
    length = length_value & ((1 << LENGTH_BITS) - 1)
    count = count_value & ((1 << COUNT_FIELD_BITS) - 1)
    try:
        req = CollectiveRequest(kind=regs["CO_KIND"], op=regs["CO_OP"], width=regs["CO_WIDTH"],
                                length=length, chips=regs["CO_CHIPS"], first=regs["CO_FIRST"],
                                count=count)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"COLL with invalid registers {dict(regs)}: {exc}") from None
    want_len, want_count = len_register(length, count), count_register(count, length)
    if length_value != want_len or count_value != want_count:
        raise ValueError(
            f"COLL with CO_LEN={length_value:#x}, CO_COUNT={count_value:#x}: {length} elements "
            f"over {count} chips need CO_LEN={want_len:#x} (block length {length // count} in "
            f"bits [47:24]) and CO_COUNT={want_count:#x} ({length % count} longer blocks in "
            "bits [31:16]); the engine has no divider")
    rank = regs["CO_RANK"]
    if not 0 <= rank < req.chips:
        raise ValueError(f"COLL with CO_RANK={rank} outside the ring of {req.chips} chips")
    return req, rank
