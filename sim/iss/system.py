"""Multi-chip ISS: one :class:`sim.iss.Iss` per chip of a ring, run together.

Each chip runs its own program; collectives (``COLL``) meet when every member of the group has
posted the same request, point-to-point transfers (``SEND``/``RECV``) when the two chips have
posted theirs (:mod:`sim.iss.scheduler`). Chips outside a collective's group take no part in it.
A deadlock (a chip waiting for a partner that never comes) raises :class:`IssError` naming
every waiting chip and what it waits for.
"""

from __future__ import annotations

from hw.spec import NpuConfig
from hw.spec.collective import check_chips
from hw.spec.isa import Op
from hw.spec.topology import Topology

from .chip import Iss
from .scheduler import run_programs

__all__ = ["IssSystem"]


class IssSystem:
    """``chips`` ISS chips on a ring, or the chips of ``topology`` (a ring or a torus: a
    torus's chips have two collective engines); ``self.chip[i]`` is chip ``i``'s
    :class:`Iss`."""

    def __init__(self, npu: NpuConfig, chips: int, topology: Topology | None = None):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        check_chips(chips)
        if topology is not None and topology.chips != chips:
            raise ValueError(f"chips={chips} is not the {topology.chips} chips of the "
                             f"{topology}")
        self.npu = npu
        self.chips = chips
        self.topology = topology or Topology.ring(chips)
        self.engines = 2 if self.topology.is_torus else 1
        self.chip = [Iss(npu, chip=i) for i in range(chips)]

    def run(self, programs, *, max_insns: int = 1_000_000) -> list[int]:
        """Run ``programs[i]`` on chip ``i`` until every chip halts; returns the instructions
        each executed. Raises :class:`IssError` on a deadlock, a race or a bad launch."""
        return run_programs(self.chip, programs, max_insns=max_insns, engines=self.engines)

    @property
    def collectives(self) -> int:
        """COLL launches of chip 0 (every chip of a whole-ring program runs the same ones)."""
        return self.chip[0].launches[Op.COLL]
