"""The ISS's COLL: a chip's registers as a request, its input words, its output words.

A chip **posts** its COLL (:func:`post_coll`: the command from its CO_* registers, the words
its engine's read generator walks, the addresses its write generator walks: RD6 and WR3 for
engine 0, RD8 and WR5 for engine 1); when every member of the group has posted the same
collective on the same engine (the members found along each one's ``CO_NEXT``:
:func:`hw.spec.collective.walk_group`), :func:`execute_coll` runs the golden collective in
group-rank order and writes each member's output.
A COLL on a chip outside its group is a no-op (its router forwards the group's words). Word
formats: ``hw.spec.collective`` (``docs/isa.md``, COLL).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw.spec.collective import (
    CollCommand,
    Kind,
    Step,
    block_offsets,
    chunk_of,
    command_from_registers,
    elements_per_word,
    engine_to_words,
    local_blocks,
    output_blocks,
    step_words,
    unpack_blocks,
    words_to_engine,
)
from hw.spec.isa import COLL_GENS

from ..golden.collectives import collective
from .errors import IssError

__all__ = ["coll_command", "PendingColl", "post_coll", "execute_coll"]


_REGS = ("CO_KIND", "CO_OP", "CO_WIDTH", "CO_LEN", "CO_CHIPS", "CO_RANK", "CO_NEXT",
         "CO_COUNT")


def coll_command(iss) -> CollCommand:
    """The COLL the chip's CO_* registers give (IssError when invalid)."""
    try:
        return command_from_registers({name: iss._reg(name) for name in _REGS})
    except ValueError as exc:
        raise IssError(str(exc)) from None


@dataclass
class PendingColl:
    """One member's posted COLL: its command, the engine it runs on, its input (None if it has
    none) and the addresses its output goes to."""

    cmd: CollCommand
    engine: int
    chip: int
    pc: int
    vector: list | None             #: per chunk, the chip's local vector
    out_addrs: np.ndarray | None

    def describe(self) -> str:
        return self.cmd.describe() + (f" on engine {self.engine}" if self.engine else "")


def post_coll(iss, chips: int, engine: int = 0, engines: int = 1) -> PendingColl | None:
    """Chip ``iss.chip``'s COLL on collective engine ``engine`` (of the chip's ``engines``)
    with its current registers (None: outside its group)."""
    if not 0 <= engine < engines:
        raise IssError(f"COLL on engine {engine}: a chip of this system has "
                       f"{engines} collective engine{'s' if engines > 1 else ''} "
                       "(a torus's chip has 2)")
    cmd = coll_command(iss)
    if cmd.chips != chips:
        if chips == 1:
            raise IssError(f"COLL with CO_CHIPS={cmd.chips} needs the other chips: run the "
                           "program in sim.iss.IssSystem")
        raise IssError(f"COLL with CO_CHIPS={cmd.chips} on a system of {chips} chips")
    if cmd.rank is None:
        return None
    if cmd.next == iss.chip and cmd.group.count > 1:
        raise IssError(f"chip {iss.chip}'s COLL has CO_NEXT={cmd.next}, its own id: the next "
                       f"member of a group of {cmd.group.count} is another chip")
    req = cmd.group
    rank = cmd.rank
    wbytes = iss.npu.ring_word_bytes
    rd, wr = COLL_GENS[engine]
    vector = None
    one = chunk_of(req)
    blocks = local_blocks(one, rank)
    if blocks:
        # Each chunk's local blocks in turn: a vector per chunk.
        words = words_to_engine(iss._gather(rd), wbytes)
        per = sum(step_words(one, Step(b, False, True, False, False), wbytes) for b in blocks)
        if len(words) != per * req.chunks:
            raise IssError(f"COLL on chip {iss.chip}: {rd} streams {len(words)} words, "
                           f"{per * req.chunks} expected ({req.chunks} chunks of {per})")
        vector = []
        for c in range(req.chunks):
            got = unpack_blocks(words[c * per:(c + 1) * per], one, blocks, wbytes)
            vector.append(np.concatenate([got[b] for b in sorted(got)]))
    out_addrs = None
    if output_blocks(req, rank):
        out_addrs = iss.desc(wr)
        iss._access.writes.append(out_addrs)
    return PendingColl(cmd, engine, iss.chip, iss.pc, vector, out_addrs)


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
    """Run one collective whose every member has posted it (``members`` in group-rank
    order)."""
    req = members[0].cmd.group
    if req.kind == Kind.BARRIER:
        return
    one = chunk_of(req)
    wbytes = isses[0].npu.ring_word_bytes
    outputs = [[] for _ in members]
    for c in range(req.chunks):
        results = collective(one, [None if m.vector is None else m.vector[c] for m in members])
        for rank, m in enumerate(members):
            if m.out_addrs is not None:
                outputs[rank].append(_output_words(one, rank, results[rank], wbytes,
                                                   isses[m.chip].n))
    for rank, m in enumerate(members):
        if m.out_addrs is not None:
            iss = isses[m.chip]
            iss._scatter(COLL_GENS[m.engine][1], np.concatenate(outputs[rank]), m.out_addrs)
