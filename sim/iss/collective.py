"""The ISS's COLL: one chip's registers as a request, its input words, its output words.

A collective needs every chip of the ring, so :class:`sim.iss.IssSystem` executes it for
all chips at once (:func:`exec_collectives`); a lone :class:`sim.iss.Iss` executes a COLL with
``CO_CHIPS = 1`` (the one-chip collective: the input, reduced over a group of one) and refuses
any other. Word formats: :mod:`sim.compiler.collective_launch`.
"""

from __future__ import annotations

import numpy as np

from hw.spec.collective import (
    CollectiveRequest,
    Kind,
    block_offsets,
    elements_per_word,
    engine_to_words,
    local_blocks,
    output_blocks,
    unpack_blocks,
    word_bytes,
    words_to_engine,
)

from ..golden.collectives import collective
from .errors import IssError

__all__ = ["coll_request", "exec_collective", "exec_collectives"]


def coll_request(iss) -> tuple[CollectiveRequest, int]:
    """The request and the chip's rank from its CO_* registers (IssError when invalid)."""
    r = {name: iss._reg(name) for name in ("CO_KIND", "CO_OP", "CO_WIDTH", "CO_LEN",
                                           "CO_CHIPS", "CO_RANK", "CO_FIRST", "CO_COUNT")}
    try:
        req = CollectiveRequest(kind=r["CO_KIND"], op=r["CO_OP"], width=r["CO_WIDTH"],
                                length=r["CO_LEN"], chips=r["CO_CHIPS"], first=r["CO_FIRST"],
                                count=r["CO_COUNT"])
    except (TypeError, ValueError) as exc:
        raise IssError(f"COLL with invalid registers {r}: {exc}") from None
    if not 0 <= r["CO_RANK"] < req.chips:
        raise IssError(f"COLL with CO_RANK={r['CO_RANK']} outside the ring of {req.chips} chips")
    return req, r["CO_RANK"]


def _input(iss, req, rank, wbytes):
    blocks = local_blocks(req, rank)
    if not blocks:
        return None
    words = words_to_engine(iss._gather("RD6"), wbytes)
    try:
        got = unpack_blocks(words, req, blocks, wbytes)
    except ValueError as exc:
        raise IssError(f"COLL on chip {rank}: RD6 {exc}") from None
    return np.concatenate([got[b] for b in sorted(got)])


def _output(iss, req, rank, result, wbytes):
    blocks = output_blocks(req, rank)
    if not blocks:
        return
    sizes = req.blocks()
    if req.kind == Kind.REDUCE_SCATTER or req.kind == Kind.SEND_RECV:
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
    iss._scatter("WR3", engine_to_words(values, wbytes, iss.n))


def exec_collectives(isses) -> None:
    """Execute one COLL on every chip of a ring (``isses[i]`` is chip ``i``, all at a COLL)."""
    reqs = [coll_request(iss) for iss in isses]
    req, _ = reqs[0]
    if req.chips != len(isses):
        raise IssError(f"COLL with CO_CHIPS={req.chips} on a ring of {len(isses)} chips")
    for chip, (other, rank) in enumerate(reqs):
        if rank != chip:
            raise IssError(f"chip {chip}'s COLL has CO_RANK={rank}: it must be its ring "
                           f"position {chip}")
        if other != req:
            raise IssError(f"chips disagree on the collective: chip 0 runs {req}, chip {chip} "
                           f"{other}")
    wbytes = word_bytes(isses[0].npu.link_bytes_per_cycle)
    inputs = [_input(iss, req, chip, wbytes) for chip, iss in enumerate(isses)]
    if req.kind == Kind.BARRIER:
        return
    results = collective(req, inputs)
    for chip, iss in enumerate(isses):
        _output(iss, req, chip, results[chip], wbytes)


def exec_collective(iss) -> None:
    """A lone chip's COLL: only a ring of one (``CO_CHIPS = 1``)."""
    req, _ = coll_request(iss)
    if req.chips != 1:
        raise IssError(f"COLL with CO_CHIPS={req.chips} needs the other chips: run the "
                       "program in sim.iss.IssSystem")
    exec_collectives([iss])
