"""2-D collectives on a torus: all-reduce, reduce-scatter and all-gather over a rectangle of
chips, composed from collectives on its rows' and columns' rings (``docs/isa.md``, COLL); and
the same on a ring (one row: the 1-D collective, run as the 2-D ones are, in chunks).

A group is a rectangle ``w x h`` of an ``X x Y`` torus (:class:`Rect`: the whole torus, a
sub-rectangle, a row or a column); its ranks are row-major, MPI's order: the chip at ``(x0 + i,
y0 + j)`` has rank ``j * w + i``. Each chip's part is a list of COLL launches on its two
collective engines (engine 0 on its row's ring, engine 1 on its column's: each engine's words go
to the next member of its group, and the routers carry them along that dimension), with WAITs
where a phase needs the previous one's output:

- **all-reduce**, large messages (``"halves"``): the vector in two halves, each through
  reduce-scatter, all-reduce and all-gather, one along the rows first and the other along the
  columns first, so that both dimensions' links are busy in every phase::

      engine 0: RS_row(A)      AR_row(B_j)     AG_row(A)
      engine 1: RS_col(B)      AR_col(A_i)     AG_col(B)

  (``A_i``: the block of half A that chip ``(i, j)`` holds after its row's reduce-scatter).
  AVG sums in the first phase and divides by ``w * h`` in the second (the engine's divisor).
- **all-reduce**, small messages (``"rows_columns"``): an all-reduce along the row, then along
  the column, on engine 0 back to back: ``2(w - 1) + 2(h - 1)`` steps instead of ``2(wh - 1)``.
- **reduce-scatter**: along the columns (rank ``j`` of a column gets the ranks ``j*w ..
  j*w + w - 1``'s blocks), then along the rows (rank ``i`` of that gets its own block).
- **all-gather**: along the rows, then along the columns (the inverse).
- a row (``h == 1``) or a column (``w == 1``): one collective on engine 0 or 1.

Memory (natural order, every phase in place in one buffer per half): an all-reduce's buffer holds
the vector (each half padded with zeros to a multiple of ``w * h`` engine words, so that every
phase's blocks are whole engine words: ``coll_launch_natural``); a reduce-scatter's or an
all-gather's holds ``w * h`` **slots**, one per rank, each block ``numpy.array_split`` gives the
rank padded to a slot of ``ceil(ceil(L / (w h)) / epw)`` engine words: the blocks of the nested
collectives are then whole slots, and every rank's block is exactly MPI's. ``pack_input`` and
``unpack_output`` convert a chip's vector and result to and from its buffer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from hw.spec.collective import (
    CollectiveRequest,
    Kind,
    ReduceOp,
    block_offsets,
    block_sizes,
    elements_per_word,
    engine_to_words,
    word_bytes,
    words_to_engine,
)
from hw.spec.isa import COLL_FIFO_WORDS
from hw.spec.timing.collective import pipelined_bound_cycles, ring_bound_cycles
from hw.spec.topology import Topology

from .collective_launch import CollLaunch, coll_launch_natural, emit, emit_descs

__all__ = ["Rect", "TorusCollective", "torus_collective", "ALGORITHMS"]

#: The all-reduce's algorithms (``torus_collective``'s ``algorithm``; ``"auto"`` picks).
ALGORITHMS = ("halves", "rows_columns")
#: At or below this many bytes, ``"auto"`` runs an all-reduce as ``"rows_columns"``.
SMALL_BYTES = 256


@dataclass(frozen=True)
class Rect:
    """``w x h`` chips of a torus from ``(x0, y0)``, not wrapping around its edges."""

    x0: int
    y0: int
    w: int
    h: int

    @classmethod
    def whole(cls, topology: Topology) -> Rect:
        """Every chip: of a torus, or of a ring (one row)."""
        return cls(0, 0, *topology.dims) if topology.is_torus else cls(0, 0, topology.chips, 1)

    def check(self, topology: Topology) -> Rect:
        X, Y = _dims(topology)
        for name, v in (("x0", self.x0), ("y0", self.y0), ("w", self.w), ("h", self.h)):
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if name in "wh" else 0):
                raise ValueError(f"rectangle {name}={v!r} must be a "
                                 f"{'positive' if name in 'wh' else 'non-negative'} integer")
        if self.x0 + self.w > X or self.y0 + self.h > Y:
            raise ValueError(f"rectangle {self.w}x{self.h} at ({self.x0}, {self.y0}) leaves the "
                             f"{topology} (x0 + w <= {X}, y0 + h <= {Y})")
        return self

    @property
    def count(self) -> int:
        return self.w * self.h

    def members(self, topology: Topology) -> tuple[int, ...]:
        """The chips in rank order (row-major)."""
        X = _dims(topology)[0]
        return tuple((self.y0 + j) * X + self.x0 + i for j in range(self.h) for i in range(self.w))


def _dims(topology: Topology) -> tuple[int, int]:
    """``(X, Y)``: a ring is one row of all its chips."""
    return topology.dims if topology.is_torus else (topology.chips, 1)


def _xy(topology: Topology, chip: int) -> tuple[int, int]:
    X = _dims(topology)[0]
    return chip % X, chip // X


@dataclass(frozen=True)
class _Phase:
    """One collective of one chip's part: on ``engine``, over ``req``, on the buffer's words
    from ``offset`` (scratchpad words from the chip's base)."""

    engine: int
    req: CollectiveRequest
    offset: int


@dataclass
class TorusCollective:
    """One 2-D collective's plan: each member's launches (:meth:`emit`), its buffer
    (:meth:`pack_input`, :meth:`unpack_output`) and what it costs (:meth:`bound_cycles`)."""

    kind: Kind
    op: ReduceOp
    width: int
    length: int
    topology: Topology
    rect: Rect
    algorithm: str
    base: int
    size: int                     #: scratchpad word bytes
    wbytes: int                   #: engine word bytes
    buffer_words: int             #: scratchpad words of a member's buffer
    phases: dict                  #: chip -> list of lists of _Phase (the phases, in order)
    halves: tuple = ()            #: all-reduce: (elements, padded elements) per half
    slot: int = 0                 #: reduce-scatter, all-gather: elements per slot
    half_words: int = 0           #: all-reduce: the second half's offset in the buffer

    @property
    def members(self) -> tuple[int, ...]:
        return self.rect.members(self.topology)

    def rank(self, chip: int) -> int | None:
        members = self.members
        return members.index(chip) if chip in members else None

    def launches(self, chip: int, link_bytes: int) -> list[list[CollLaunch]]:
        """Chip ``chip``'s COLL launches, phase by phase (empty outside the rectangle). A
        collective whose blocks exceed the engines' buffers (:data:`COLL_FIFO_WORDS` engine
        words) runs in equal chunks, one command (``CollectiveRequest.chunks``)."""
        epw = self._epw()
        out = []
        for phase in self.phases.get(chip, []):
            row = []
            for p in phase:
                k = _chunks(p.req.length // p.req.count // epw)
                req = dataclasses.replace(p.req, length=p.req.length // k, chunks=k)
                row.append(coll_launch_natural(req, chip, base=self.base + p.offset,
                                               size=self.size, link_bytes=link_bytes,
                                               engine=p.engine))
            out.append(row)
        return out

    def emit(self, asm, chip: int, link_bytes: int):
        """Append chip ``chip``'s launches to an assembler, phase by phase. None needs a
        WAIT: each engine's launches form a chain in which each one reads only what the
        previous one on the same engine wrote, and a COLL waits for its engine to be idle
        (its output written). Both engines' descriptors of a phase are set before its first
        COLL (the generators are the engines' own; the CO_* registers they share are set
        before each COLL), so that the second engine's launch follows the first's closely."""
        for phase in self.launches(chip, link_bytes):
            for launch in phase:
                emit_descs(asm, launch)
            for launch in phase:
                emit(asm, launch, descs=False)

    # --- the buffer -------------------------------------------------------------------------
    def _epw(self):
        return elements_per_word(self.wbytes, self.width)

    def _dtype(self):
        return np.int32 if self.width == 32 else np.int64

    def _elements(self, vector) -> np.ndarray:
        """The buffer's elements for ``vector`` (padding zero)."""
        if self.kind == Kind.ALL_REDUCE:
            epw, ratio = self._epw(), self.wbytes // self.size
            out = np.zeros(self.buffer_words // ratio * epw, np.int64)
            at = 0
            for (n, _), start in zip(self.halves, (0, self.half_words // ratio * epw),
                                     strict=False):
                out[start:start + n] = vector[at:at + n]
                at += n
            return out
        return np.zeros(self.rect.count * self.slot, np.int64)

    def pack_input(self, chip: int, vector) -> np.ndarray:
        """[buffer_words, size] uint8: the buffer of member ``chip`` holding its ``vector``
        (all-reduce, reduce-scatter: the whole per-chip vector; all-gather: its block)."""
        vector = np.asarray(vector, np.int64)
        p = self.rank(chip)
        if self.kind == Kind.ALL_REDUCE:
            elems = self._elements(vector)
        else:
            elems = self._elements(None)
            n = self.rect.count
            if self.kind == Kind.REDUCE_SCATTER:
                for j, (off, sz) in enumerate(zip(block_offsets(self.length, n),
                                                  block_sizes(self.length, n), strict=True)):
                    elems[j * self.slot:j * self.slot + sz] = vector[off:off + sz]
            else:
                sz = block_sizes(self.length, n)[p]
                elems[p * self.slot:p * self.slot + sz] = vector[:sz]
        return self._words(elems)

    def _words(self, elems):
        wire = "<i4" if self.width == 32 else "<i8"
        raw = elems.astype(wire).tobytes()
        values = [int.from_bytes(raw[i:i + self.wbytes], "little")
                  for i in range(0, len(raw), self.wbytes)]
        return engine_to_words(values, self.wbytes, self.size)

    def unpack_output(self, chip: int, words) -> np.ndarray:
        """Member ``chip``'s result from its buffer (all-reduce, all-gather: the whole vector;
        reduce-scatter: its block)."""
        wire = "<i4" if self.width == 32 else "<i8"
        raw = b"".join(int(v).to_bytes(self.wbytes, "little")
                       for v in words_to_engine(words, self.wbytes))
        elems = np.frombuffer(raw, wire).astype(self._dtype())
        n = self.rect.count
        if self.kind == Kind.ALL_REDUCE:
            epw, ratio = self._epw(), self.wbytes // self.size
            starts = (0, self.half_words // ratio * epw)
            return np.concatenate([elems[start:start + count] for (count, _), start
                                   in zip(self.halves, starts, strict=False)])
        sizes = block_sizes(self.length, n)
        if self.kind == Kind.REDUCE_SCATTER:
            p = self.rank(chip)
            return elems[p * self.slot:p * self.slot + sizes[p]].copy()
        return np.concatenate([elems[j * self.slot:j * self.slot + sizes[j]]
                               for j in range(n)])

    # --- cost -------------------------------------------------------------------------------
    def bound_cycles(self, npu, pipelined: bool = False) -> int:
        """The algorithm's alpha-beta bound on the torus's links: per phase, the ring cost of
        its slowest collective (the two engines' collectives of a phase run at once on the
        two dimensions), the phases added. The ring cost is the step-synchronous
        ``steps * (ceil(M_phase / (n * B)) + a)`` (:func:`~hw.spec.timing.collective.
        ring_bound_cycles`), or with ``pipelined`` the lower bound of chips that forward
        each word as it arrives (:func:`~hw.spec.timing.collective.pipelined_bound_cycles`:
        on links whose latency overlaps the blocks)."""
        total = 0
        ebytes = self.width // 8
        links = [self.topology.link(d, npu) for d in range(len(self.topology.dims))]
        cost = pipelined_bound_cycles if pipelined else ring_bound_cycles
        for phase in self.phases[self.members[0]]:
            worst = 0
            for p in phase:
                link = links[0 if p.req.stride == 1 else 1]     # a row's ring or a column's
                if p.req.count > 1:
                    worst = max(worst, cost(p.req.kind, p.req.length * ebytes, p.req.count,
                                            link.bytes_per_cycle, link.latency_cycles))
            total += worst
        return total


def _row(topo, rect, y, **kw):
    return CollectiveRequest(chips=topo.chips, first=y * _dims(topo)[0] + rect.x0, count=rect.w,
                             stride=1, **kw)


def _col(topo, rect, x, **kw):
    return CollectiveRequest(chips=topo.chips, first=rect.y0 * _dims(topo)[0] + x, count=rect.h,
                             stride=topo.dims[0], **kw)


def torus_collective(kind, op, width: int, length: int, topology: Topology, *,
                     rect: Rect | None = None, base: int, size: int, link_bytes: int,
                     algorithm: str = "auto", half_base: int | None = None) -> TorusCollective:
    """The plan of one 2-D collective of ``length`` elements (the per-chip vector for
    all-reduce and reduce-scatter, the result for all-gather) over ``rect`` (default the whole
    torus), each member's buffer at scratchpad word ``base`` (the all-reduce's second half at
    ``half_base`` when given: in another bank than the first, the two engines' streams do not
    share a bank's ports). ``ValueError`` naming what does not fit."""
    kind = Kind[kind.upper()] if isinstance(kind, str) else Kind(kind)
    if kind not in (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER):
        raise ValueError(f"a 2-D collective is an all-reduce, a reduce-scatter or an "
                         f"all-gather, not {kind.name.lower()}")
    probe = CollectiveRequest(kind=kind, op=op, width=width, length=length,
                              chips=topology.chips)
    op = probe.op
    rect = (rect or Rect.whole(topology)).check(topology)
    if algorithm not in ("auto",) + ALGORITHMS:
        raise ValueError(f"algorithm {algorithm!r} is not one of auto, {', '.join(ALGORITHMS)}")
    wbytes = word_bytes(link_bytes, size)
    epw = elements_per_word(wbytes, width)
    ratio = wbytes // size
    n, w, h = rect.count, rect.w, rect.h
    members = rect.members(topology)
    phases = {}
    halves, slot, off_b = (), 0, 0
    fields = {"kind": kind, "width": width}
    sum_op = ReduceOp.SUM if op == ReduceOp.AVG else op
    div = n if op == ReduceOp.AVG else None   # AVG: summed, divided once by every chip
    if algorithm == "auto":
        algorithm = "rows_columns" if length * width // 8 <= SMALL_BYTES else "halves"
    if w == 1 or h == 1:
        algorithm = "ring"
    elif kind != Kind.ALL_REDUCE:
        algorithm = "columns_rows" if kind == Kind.REDUCE_SCATTER else "rows_columns"

    def row(y, **kw):
        return _row(topology, rect, y, **{**fields, **kw})

    def col(x, **kw):
        return _col(topology, rect, x, **{**fields, **kw})

    if kind == Kind.ALL_REDUCE and algorithm in ("ring", "rows_columns"):
        # Each phase's blocks whole engine words (and whole chunks).
        groups = (n,) if algorithm == "ring" else (w, h)
        padded = _fit(length, math.lcm(*groups) * epw, [lambda m, g=g: m // (g * epw)
                                                          for g in groups])
        halves = ((length, padded),)
        for c in members:
            x, y = _xy(topology, c)
            if algorithm == "ring":
                req = row(y, op=op, length=padded) if h == 1 else col(x, op=op, length=padded)
                phases[c] = [[_Phase(0 if h == 1 else 1, req, 0)]]
            else:
                phases[c] = [[_Phase(0, row(y, op=sum_op, length=padded), 0)],
                             [_Phase(0, col(x, op=op, length=padded, divisor=div), 0)]]
    elif kind == Kind.ALL_REDUCE:
        la, lb = length - length // 2, length // 2
        pa = _fit(la, n * epw, [lambda m: m // (w * epw), lambda m: m // (n * epw)])
        pb = _fit(lb, n * epw, [lambda m: m // (h * epw), lambda m: m // (n * epw)]) \
            if lb else 0
        halves = ((la, pa), (lb, pb)) if lb else ((la, pa),)
        off_b = pa // epw * ratio if half_base is None else half_base - base
        if off_b < pa // epw * ratio:
            raise ValueError(f"half_base={half_base} overlaps the first half's buffer "
                             f"(words {base}..{base + pa // epw * ratio - 1})")
        rs, ag = {"kind": Kind.REDUCE_SCATTER}, {"kind": Kind.ALL_GATHER, "in_place": True}
        for c in members:
            x, y = _xy(topology, c)
            i, j = x - rect.x0, y - rect.y0
            # Half A along the row first on engine 0, half B along the column first on
            # engine 1: each engine's chain reads only what it wrote.
            one = [_Phase(0, row(y, op=sum_op, length=pa, **rs), 0)]
            two = [_Phase(0, col(x, op=op, length=pa // w, divisor=div),
                          i * (pa // w // epw * ratio))]
            three = [_Phase(0, row(y, op=sum_op, length=pa, **ag), 0)]
            if lb:
                one.append(_Phase(1, col(x, op=sum_op, length=pb, **rs), off_b))
                two.append(_Phase(1, row(y, op=op, length=pb // h, divisor=div),
                                  off_b + j * (pb // h // epw * ratio)))
                three.append(_Phase(1, col(x, op=sum_op, length=pb, **ag), off_b))
            phases[c] = [one, two, three]
    else:
        per = -(-length // n)                      # the longest block's elements
        slot = _fit(per, epw, [lambda m: m // epw, lambda m: w * m // epw])
        total = n * slot
        for c in members:
            x, y = _xy(topology, c)
            j = y - rect.y0
            super_words = w * slot // epw * ratio
            if algorithm == "ring":
                req = row(y, op=op, length=total) if h == 1 else col(x, op=op, length=total)
                phases[c] = [[_Phase(0 if h == 1 else 1, req, 0)]]
            elif kind == Kind.REDUCE_SCATTER:
                # The columns first (rank j of a column gets its row's blocks), then the rows;
                # AVG sums along the columns and divides by every chip along the rows.
                phases[c] = [[_Phase(0, col(x, op=sum_op, length=total), 0)],
                             [_Phase(0, row(y, op=op, length=w * slot, divisor=div),
                                     j * super_words)]]
            else:
                phases[c] = [[_Phase(0, row(y, op=op, length=w * slot, in_place=True),
                                     j * super_words)],
                             [_Phase(0, col(x, op=op, length=total, in_place=True), 0)]]
    if len(halves) == 2:
        buffer_words = off_b + halves[1][1] // epw * ratio
    else:
        buffer_words = (halves[0][1] if halves else n * slot) // epw * ratio
    plan = TorusCollective(kind, op, width, length, topology, rect, algorithm, base, size,
                           wbytes, buffer_words, phases, halves, slot, off_b)
    for c in members:
        plan.launches(c, link_bytes)
    return plan


def _chunks(block_words: int) -> int:
    """Chunks a collective of blocks of ``block_words`` engine words runs in: each block
    within the engines' buffers."""
    return max(1, -(-block_words // COLL_FIFO_WORDS))


def _fit(elements: int, unit: int, blocks) -> int:
    """The fewest elements, at least ``elements`` and a multiple of ``unit``, for which every
    ``blocks[k](elements)`` (a phase's block in engine words) splits into equal chunks."""
    m = max(unit, -(-elements // unit) * unit)
    while any(b(m) % _chunks(b(m)) for b in blocks):
        m += unit
    return m
