"""The ISS's COLL: a chip's registers as a request, its input words, its output words.

A chip **posts** its COLL (:func:`post_coll`: the request from its CO_* registers, the words
RD6 walks, the addresses WR3 walks); when every member of the group has posted the same
request, :func:`execute_coll` runs the golden collective and writes each member's output.
A COLL on a chip outside its group is a no-op (its router forwards the group's words). Word
formats: ``hw.spec.collective`` (``docs/isa.md``, COLL).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw.spec.collective import (
    CollectiveRequest,
    Kind,
    block_offsets,
    elements_per_word,
    engine_to_words,
    local_blocks,
    output_blocks,
    request_from_registers,
    unpack_blocks,
    words_to_engine,
)

from ..golden.collectives import collective
from .errors import IssError

__all__ = ["coll_request", "PendingColl", "post_coll", "execute_coll"]


def coll_request(iss) -> tuple[CollectiveRequest, int]:
    """The request and the chip's rank from its CO_* registers (IssError when invalid)."""
    r = {name: iss._reg(name) for name in ("CO_KIND", "CO_OP", "CO_WIDTH", "CO_LEN",
                                           "CO_CHIPS", "CO_RANK", "CO_FIRST", "CO_COUNT")}
    try:
        return request_from_registers(r)
    except ValueError as exc:
        raise IssError(str(exc)) from None


@dataclass
class PendingColl:
    """One member's posted COLL: its request, its input (None if it has none) and the
    addresses its output goes to."""

    req: CollectiveRequest
    chip: int
    pc: int
    vector: np.ndarray | None
    out_addrs: np.ndarray | None

    def describe(self) -> str:
        r = self.req
        members = f"{r.members[0]}..{r.members[-1]}" if r.count > 1 else f"{r.members[0]}"
        return f"COLL {r.kind.name} {r.op.name} int{r.width} x{r.length} (group {members})"


def post_coll(iss, chips: int) -> PendingColl | None:
    """Chip ``iss.chip``'s COLL with its current registers (None: outside its group)."""
    req, rank = coll_request(iss)
    if req.chips != chips:
        if chips == 1:
            raise IssError(f"COLL with CO_CHIPS={req.chips} needs the other chips: run the "
                           "program in sim.iss.IssSystem")
        raise IssError(f"COLL with CO_CHIPS={req.chips} on a ring of {chips} chips")
    if rank != iss.chip:
        raise IssError(f"chip {iss.chip}'s COLL has CO_RANK={rank}: it must be its ring "
                       f"position {iss.chip}")
    if req.position(rank) is None:
        return None
    wbytes = iss.npu.ring_word_bytes
    vector = None
    blocks = local_blocks(req, rank)
    if blocks:
        words = words_to_engine(iss._gather("RD6"), wbytes)
        try:
            got = unpack_blocks(words, req, blocks, wbytes)
        except ValueError as exc:
            raise IssError(f"COLL on chip {rank}: RD6 {exc}") from None
        vector = np.concatenate([got[b] for b in sorted(got)])
    out_addrs = None
    if output_blocks(req, rank):
        out_addrs = iss.desc("WR3")
        iss._access.writes.append(out_addrs)
    return PendingColl(req, rank, iss.pc, vector, out_addrs)


def _output_words(req, rank, result, wbytes, size):
    blocks = output_blocks(req, rank)
    sizes = req.blocks()
    if req.kind in (Kind.REDUCE_SCATTER, Kind.SEND_RECV):
        parts = {blocks[0]: result}
    else:
        offsets = block_offsets(req.length, req.count)
        parts = {b: result[offsets[b]:offsets[b] + sizes[b]] for b in blocks}
    epw = elements_per_word(wbytes, req.width)
    wire = "<i4" if req.width == 32 else "<i8"
    values = []
    for b in blocks:
        padded = np.zeros(-(-sizes[b] // epw) * epw, np.int64)
        padded[:sizes[b]] = parts[b]
        raw = padded.astype(wire).tobytes()
        values += [int.from_bytes(raw[i:i + wbytes], "little")
                   for i in range(0, len(raw), wbytes)]
    return engine_to_words(values, wbytes, size)


def execute_coll(members: list[PendingColl], isses) -> None:
    """Run one collective whose every member has posted it (``members`` in group order)."""
    req = members[0].req
    if req.kind == Kind.BARRIER:
        return
    inputs = [None] * req.chips
    for m in members:
        inputs[m.chip] = m.vector
    results = collective(req, inputs)
    wbytes = isses[0].npu.ring_word_bytes
    for m in members:
        if m.out_addrs is None:
            continue
        iss = isses[m.chip]
        iss._scatter("WR3", _output_words(req, m.chip, results[m.chip], wbytes, iss.n),
                     m.out_addrs)
