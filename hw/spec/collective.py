"""Collective operations on a ring: encodings, requests, step schedules, word packing, costs.

Plain Python (and NumPy), no Amaranth: the collective engine's gateware
(:mod:`hw.ring.collective`), the golden model (:mod:`sim.golden.collectives`), the host-side test
DMA packing and, later, the instruction-set simulator and the compiler all read this module.

Semantics (MPI rank order)
--------------------------
A collective runs over a **group** of ``count`` chips of a system of ``chips``: the chips
``first + k * stride`` modulo ``chips``, ``k`` the member's **group rank** ``p`` (``stride`` 1:
consecutive chips, wrapping around a ring, first=6, count=4 on 8 chips is chips 6, 7, 0, 1;
``stride`` X: a column of an X x Y torus). Chips outside the group forward traffic and produce
no output. A chip's COLL names its group by its rank and the next member's chip id
(:func:`registers`, :class:`CollCommand`; the ISS finds the members along them:
:func:`walk_group`).

A vector of ``length`` elements is split into ``count`` blocks like ``numpy.array_split``: the
first ``length % count`` blocks are one element longer. After a reduce-scatter group rank ``p``
holds block ``p`` of the reduction; an all-gather's result is the blocks concatenated by group
rank (chip ``first`` first). For an all-gather, ``length`` is the *result* length and a member
contributes its block ``p``.

Ops: ``SUM`` wraps modulo ``2**width`` (associative, so partial sums stay bit-exact); ``MAX`` and
``MIN`` are signed; ``AVG`` is ``floor(wrap(sum) / count)`` (or by the request's ``divisor``):
the floor (towards minus infinity) of
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

import dataclasses
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
           "len_register", "count_register", "CollCommand", "registers",
           "command_from_registers", "walk_group", "kind_register", "IN_PLACE_BIT",
           "CHUNKS_SHIFT", "chunk_of", "merges"]


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

    The group is the ``count`` chips ``first + k * stride`` (modulo ``chips``), in group-rank
    order ``k``: consecutive chips (``stride`` 1: a ring, a row of a torus or a run of either)
    or every ``stride``-th (a column of an X x Y torus, ``stride`` X: ``hw.spec.topology``).
    """

    kind: Kind
    op: ReduceOp
    width: int
    length: int
    chips: int
    first: int = 0
    count: int | None = None
    stride: int = 1
    #: What AVG divides the wrapped sum by (None: ``count``): a collective that completes a
    #: reduction begun by others (a torus's all-reduce over its rows' partial sums) divides by
    #: every chip that contributed.
    divisor: int | None = None
    #: The collective runs this many times back to back on the next parts of the members'
    #: streams (each part a collective of ``length`` elements), one command: a collective
    #: whose blocks exceed the engines' buffers is cut into chunks without a launch per chunk.
    chunks: int = 1
    #: All-gather only: the member's own block is already in place in its output, and is not
    #: written out again (its first step sends it and writes nothing).
    in_place: bool = False

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
        if not isinstance(self.stride, int) or isinstance(self.stride, bool):
            raise TypeError(f"stride must be an integer, not {self.stride!r}")
        if not 1 <= self.stride <= max(1, self.chips - 1):
            raise ValueError(f"group stride={self.stride} must be 1..{max(1, self.chips - 1)} "
                             f"(chips of the {self.chips} between consecutive members)")
        members = tuple((self.first + p * self.stride) % self.chips for p in range(self.count))
        if len(set(members)) != self.count:
            raise ValueError(f"group first={self.first}, count={self.count}, "
                             f"stride={self.stride} visits a chip twice on {self.chips} chips")
        if self.divisor is not None and (not isinstance(self.divisor, int) or
                                         isinstance(self.divisor, bool) or
                                         not 1 <= self.divisor <= MAX_CHIPS):
            raise ValueError(f"divisor={self.divisor!r} must be 1..{MAX_CHIPS} chips")
        if not isinstance(self.chunks, int) or isinstance(self.chunks, bool) or \
                not 1 <= self.chunks <= 1 << COUNT_FIELD_BITS:
            raise ValueError(f"chunks={self.chunks!r} must be 1..{1 << COUNT_FIELD_BITS}")
        if self.chunks > 1 and self.kind not in (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER,
                                                 Kind.ALL_GATHER):
            raise ValueError(f"{self.kind.name.lower()} runs in one chunk, not {self.chunks}")
        if self.in_place and (self.kind != Kind.ALL_GATHER or self.count < 2):
            raise ValueError(f"in_place is an all-gather's of 2 or more chips, not a "
                             f"{self.kind.name.lower()} of {self.count}")
        object.__setattr__(self, "_members", members)
        object.__setattr__(self, "_rank", {c: p for p, c in enumerate(members)})

    @property
    def members(self) -> tuple[int, ...]:
        """Chips of the group in group-rank order."""
        return self._members

    @property
    def avg_divisor(self) -> int:
        """What AVG divides by: ``divisor``, else the group size."""
        return self.count if self.divisor is None else self.divisor

    def position(self, chip: int) -> int | None:
        """Group rank of ``chip``, or None when it is outside the group."""
        return self._rank.get(chip)

    def next_member(self, chip: int) -> int:
        """The member after ``chip`` in group-rank order (the last member's: the first)."""
        return self._members[(self._rank[chip] + 1) % self.count]

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
    #: A chunk's last step merged with the next chunk's first: the words from the ring go
    #: out (block ``block``) while the local words of block ``tx_block`` go to the ring, one
    #: of each per word of the step (equal blocks).
    swap: bool = False
    tx_block: int | None = None

    @property
    def local_block(self) -> int:
        """The block the local stream delivers in this step."""
        return self.tx_block if self.swap else self.block


def merges(req: CollectiveRequest, chip: int) -> bool:
    """Whether ``chip``'s schedule merges each chunk's last step (from the ring to the output
    only) with the next chunk's first (from the local stream to the ring only): a member of an
    all-reduce, or of an all-gather in place, whose blocks are all alike (``length`` a multiple
    of ``count``), of several chunks. The ring's links then stay busy from one chunk to the
    next; a lone chunk's last step leaves a chip's link idle for a block."""
    return (req.chunks > 1 and req.count > 1 and req.position(chip) is not None and
            (req.kind == Kind.ALL_REDUCE or (req.kind == Kind.ALL_GATHER and req.in_place)) and
            req.length % req.count == 0)


def steps(req: CollectiveRequest, chip: int) -> list[Step]:
    """The step schedule of ``chip`` (see the module docstring); the hardware mirrors it. A
    request of several ``chunks`` repeats one chunk's schedule, each chunk's last step merged
    with the next one's first where :func:`merges`."""
    one = _chunk_steps(req, chip)
    if not merges(req, chip):
        return one * req.chunks
    last, first = one[-1], one[0]
    swap = Step(last.block, rx=True, local=True, tx=True, out=True, swap=True,
                tx_block=first.block)
    return one[:-1] + ([swap] + one[1:-1]) * (req.chunks - 1) + [last]


def _chunk_steps(req: CollectiveRequest, chip: int) -> list[Step]:
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
        relayed = _chunk_steps(req, req.members[-1])[:-1]
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
                        tx=not last, out=not (gather and s == 0 and req.in_place))
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
    return [s.local_block for s in steps(req, chip) if s.local]


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


def count_register(count: int, length: int, divisor: int | None = None) -> int:
    """``CO_COUNT``'s value: the group size in bits ``[15:0]``, ``length mod count`` (how many
    blocks are one element longer, ``numpy.array_split``'s) in bits ``[31:16]`` and AVG's
    divisor in bits ``[47:32]`` (0: the group size)."""
    return count | (length % count) << COUNT_FIELD_BITS | \
        (divisor or 0) << 2 * COUNT_FIELD_BITS


@dataclass(frozen=True)
class CollCommand:
    """A COLL as one chip's ``CO_*`` registers give it (``docs/isa.md``, COLL): the
    collective (``group`` in group-rank space: chips ``0..count-1``), the chip's group rank
    (None: outside the group, the COLL is a no-op) and the chip its words go to (``next``, the
    next member), on a system of ``chips`` chips."""

    group: CollectiveRequest
    rank: int | None
    next: int
    chips: int

    def same(self, other: CollCommand) -> bool:
        """Whether ``other`` is a member's command of the same collective."""
        return self.group == other.group and self.chips == other.chips

    def describe(self) -> str:
        g = self.group
        return (f"COLL {g.kind.name} {g.op.name} int{g.width} x{g.length} (rank {self.rank} of "
                f"{g.count}, next chip {self.next})")


#: ``CO_KIND``'s fields: the kind in bits ``[2:0]``, an all-gather in place in bit
#: :data:`IN_PLACE_BIT`, the chunks less one in bits ``[31:16]``.
IN_PLACE_BIT = 8
CHUNKS_SHIFT = 16


def kind_register(req: CollectiveRequest) -> int:
    """``CO_KIND``'s value for ``req``: its kind, ``in_place`` and ``chunks``."""
    return int(req.kind) | req.in_place << IN_PLACE_BIT | (req.chunks - 1) << CHUNKS_SHIFT


def registers(req: CollectiveRequest, chip: int) -> dict:
    """The ``CO_*`` registers of chip ``chip``'s COLL for ``req``: ``CO_RANK`` its group rank
    (``count`` outside the group), ``CO_NEXT`` the next member's chip id (0 outside)."""
    rank = req.position(chip)
    return {"CO_KIND": kind_register(req), "CO_OP": int(req.op), "CO_WIDTH": req.width,
            "CO_LEN": len_register(req.length, req.count), "CO_CHIPS": req.chips,
            "CO_RANK": req.count if rank is None else rank,
            "CO_NEXT": 0 if rank is None else req.next_member(chip),
            "CO_COUNT": count_register(req.count, req.length, req.divisor)}


def command_from_registers(regs) -> CollCommand:
    """The :class:`CollCommand` a COLL's ``CO_*`` registers give (``regs`` maps each register's
    name to its value). ``ValueError`` naming the registers when they do not describe a
    collective, when the block fields of ``CO_LEN`` and ``CO_COUNT`` are not the division of
    its length by its group size (the engine has no divider), or when ``CO_NEXT`` is not a
    chip of the system."""
    length_value, count_value = regs["CO_LEN"], regs["CO_COUNT"]
    length = length_value & ((1 << LENGTH_BITS) - 1)
    count = count_value & ((1 << COUNT_FIELD_BITS) - 1)
    divisor = (count_value >> 2 * COUNT_FIELD_BITS) & ((1 << COUNT_FIELD_BITS) - 1) or None
    chips = regs["CO_CHIPS"]
    kind_value = regs["CO_KIND"]
    try:
        check_chips(chips)
        if kind_value & ~(7 | 1 << IN_PLACE_BIT | 0xFFFF << CHUNKS_SHIFT):
            raise ValueError(f"CO_KIND={kind_value:#x} sets bits outside its kind [2:0], "
                             f"in-place [{IN_PLACE_BIT}] and chunks [31:16] fields")
        group = CollectiveRequest(kind=kind_value & 7, op=regs["CO_OP"],
                                  width=regs["CO_WIDTH"], length=length, chips=max(count, 1),
                                  count=count, divisor=divisor,
                                  in_place=bool(kind_value >> IN_PLACE_BIT & 1),
                                  chunks=(kind_value >> CHUNKS_SHIFT & 0xFFFF) + 1)
        if count > chips:
            raise ValueError(f"group count={count} must be 1..{chips} (the system has {chips} "
                             "chips)")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"COLL with invalid registers {dict(regs)}: {exc}") from None
    want_len = len_register(length, count)
    want_count = count_register(count, length, divisor)
    if length_value != want_len or count_value != want_count:
        raise ValueError(
            f"COLL with CO_LEN={length_value:#x}, CO_COUNT={count_value:#x}: {length} elements "
            f"over {count} chips need CO_LEN={want_len:#x} (block length {length // count} in "
            f"bits [47:24]) and CO_COUNT={want_count:#x} ({length % count} longer blocks in "
            "bits [31:16]); the engine has no divider")
    rank, nxt = regs["CO_RANK"], regs["CO_NEXT"]
    if rank < 0:
        raise ValueError(f"COLL with CO_RANK={rank}: a group rank is 0..{count - 1} "
                         f"({count} or more: outside the group)")
    member = rank < count
    if member and not 0 <= nxt < chips:
        raise ValueError(f"COLL with CO_NEXT={nxt} outside the system's chips 0..{chips - 1}")
    return CollCommand(group, rank if member else None, nxt, chips)


def walk_group(commands, chip: int) -> CollectiveRequest | None:
    """The collective that ``chip``'s posted command is part of, in system chip ids, once every
    member has posted it: ``commands`` maps chips to their posted :class:`CollCommand`; the
    members are found along the ``next`` chips from ``chip``, each with the same collective and
    the next group rank. None while a member has not posted it (or has posted another one).
    ``ValueError`` when the chain of ``next`` chips does not close into the group, or is not
    ``first + k * stride`` (the groups the compiler emits: runs, rows and columns)."""
    cmd = commands[chip]
    n, p = cmd.group.count, cmd.rank
    members = [None] * n
    members[p] = chip
    cur = chip
    for k in range(1, n):
        nxt = commands[cur].next
        other = commands.get(nxt)
        if other is None or not other.same(cmd) or other.rank != (p + k) % n:
            return None
        members[(p + k) % n] = nxt
        cur = nxt
    if commands[cur].next != chip or len(set(members)) != n:
        raise ValueError(f"{cmd.describe()} on chip {chip}: the members' CO_NEXT chips "
                         f"{[commands[m].next for m in members]} do not close into a group of "
                         f"{n} ({members})")
    stride = (members[1] - members[0]) % cmd.chips if n > 1 else 1
    try:
        req = CollectiveRequest(kind=cmd.group.kind, op=cmd.group.op, width=cmd.group.width,
                                length=cmd.group.length, chips=cmd.chips, first=members[0],
                                count=n, stride=stride, divisor=cmd.group.divisor,
                                chunks=cmd.group.chunks, in_place=cmd.group.in_place)
    except ValueError as exc:
        raise ValueError(f"{cmd.describe()} on chip {chip}: group {members}: {exc}") from None
    if list(req.members) != members:
        raise ValueError(f"{cmd.describe()} on chip {chip}: group {members} is not first + k * "
                         "stride (a run, a row or a column)")
    return req


def chunk_of(req: CollectiveRequest) -> CollectiveRequest:
    """One chunk of ``req``: the same collective with ``chunks`` 1."""
    return dataclasses.replace(req, chunks=1) if req.chunks > 1 else req
