"""Multi-chip ISS: one :class:`sim.iss.Iss` per chip of a ring, collectives in lock step.

Each chip runs its program until it reaches a ``COLL`` (or ``HALT``); when every chip of the
ring waits at a ``COLL``, the collective executes for all of them at word level
(:func:`sim.iss.collective.exec_collectives`: each chip's RD6 words unpacked, the golden
collective, the results packed and scattered through WR3), and they continue. Every chip of the
ring takes part in every collective (chips outside the group forward its traffic), so the
programs must have the same number of ``COLL``\\ s, with agreeing CO_* registers.
"""

from __future__ import annotations

from hw.spec import NpuConfig
from hw.spec.collective import check_chips
from hw.spec.isa import IsaError, Op, decode

from .chip import Iss
from .collective import exec_collectives
from .errors import IssError

__all__ = ["IssSystem"]


class IssSystem:
    """``chips`` ISS chips on a ring; ``self.chip[i]`` is chip ``i``'s :class:`Iss`."""

    def __init__(self, npu: NpuConfig, chips: int):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        check_chips(chips)
        self.npu = npu
        self.chips = chips
        self.chip = [Iss(npu) for _ in range(chips)]
        self.collectives = 0

    def run(self, programs, *, max_insns: int = 1_000_000) -> list[int]:
        """Run ``programs[i]`` on chip ``i`` until every chip halts; returns the instructions
        each executed. Raises :class:`IssError` on a deadlock (a chip halts while others wait
        at a COLL) or disagreeing collectives."""
        if len(programs) != self.chips:
            raise ValueError(f"{len(programs)} programs for {self.chips} chips")
        pcs = [0] * self.chips
        halted = [False] * self.chips
        while True:
            for c, iss in enumerate(self.chip):
                if halted[c]:
                    continue
                while True:
                    if pcs[c] >= len(programs[c]):
                        raise IssError(f"chip {c}: program ended without HALT")
                    if pcs[c] >= max_insns:
                        raise IssError(f"chip {c}: program exceeded {max_insns} instructions")
                    try:
                        insn = decode(programs[c][pcs[c]])
                    except IsaError as exc:
                        raise IssError(f"chip {c} pc {pcs[c]}: {exc}") from None
                    if insn.op is Op.HALT:
                        halted[c] = True
                        pcs[c] += 1
                        break
                    if insn.op is Op.COLL:
                        break
                    try:
                        iss.step(insn)
                    except IssError as exc:
                        raise IssError(f"chip {c} pc {pcs[c]}: {exc}") from None
                    pcs[c] += 1
            if all(halted):
                return pcs
            if any(halted):
                waiting = [c for c in range(self.chips) if not halted[c]]
                gone = [c for c in range(self.chips) if halted[c]]
                raise IssError(f"deadlock: chips {waiting} wait at a COLL (pc "
                               f"{[pcs[c] for c in waiting]}) but chips {gone} halted")
            try:
                exec_collectives(self.chip)
            except IssError as exc:
                raise IssError(f"collective {self.collectives} (pcs {pcs}): {exc}") from None
            self.collectives += 1
            for c, iss in enumerate(self.chip):
                iss.launches[Op.COLL] += 1
                pcs[c] += 1
