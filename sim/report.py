"""The report of one ``npu sim`` run: what the JSON report holds and the human summary.

The JSON form (:meth:`SimReport.to_json`) is a contract, documented in ``docs/formats.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hw.spec import ModelConfig, NpuConfig
from hw.spec.isa import UNIT_NAMES

__all__ = ["UNITS", "ChipStats", "SimReport"]

#: The units whose busy cycles a chip counts (``hw.spec.isa.UNIT_NAMES``).
UNITS = UNIT_NAMES


@dataclass
class ChipStats:
    """One chip's share of a run. ``busy`` has one entry per unit plus ``idle`` (cycles in
    which no unit was busy); ``overlap_cycles`` counts cycles with two or more units busy."""

    chip: int
    busy: dict[str, int]
    overlap_cycles: int
    sram_bytes_used: int
    sram_bytes: dict[str, int]
    instructions: int

    def to_json(self) -> dict:
        return {"chip": self.chip, "busy": dict(self.busy), "overlap_cycles": self.overlap_cycles,
                "sram_bytes_used": self.sram_bytes_used, "sram_bytes": dict(self.sram_bytes),
                "instructions": self.instructions}


@dataclass
class SimReport:
    """What one simulation measured. ``cycles`` is None on a backend without timing."""

    strategy: str
    chips: int
    backend: str
    seed: int
    npu: NpuConfig
    model: ModelConfig
    cycles: int | None
    load_cycles: int
    golden_match: bool
    max_abs: float
    cosine: float
    per_chip: list[ChipStats]
    wall_s: float
    collectives: list[dict] = field(default_factory=list)
    first_mismatch: dict | None = None
    #: The final activations, dequantised to float32, shaped like the input.
    output: np.ndarray | None = field(default=None, repr=False)

    @property
    def cycles_per_s(self) -> float | None:
        return self.cycles / self.wall_s if self.cycles and self.wall_s else None

    def to_json(self) -> dict:
        report = {
            "strategy": self.strategy, "chips": self.chips, "backend": self.backend,
            "seed": self.seed, "npu": self.npu.name, "model": self.model.name,
            "cycles": self.cycles, "load_cycles": self.load_cycles,
            "golden_match": self.golden_match,
            "float_error": {"max_abs": self.max_abs, "cosine": self.cosine},
            "per_chip": [c.to_json() for c in self.per_chip],
            "collectives": list(self.collectives),
            "sim": {"wall_s": self.wall_s, "cycles_per_s": self.cycles_per_s},
        }
        if self.first_mismatch is not None:
            report["first_mismatch"] = dict(self.first_mismatch)
        return report

    def summary(self) -> str:
        cyc = "n/a (the ISS does not time programs)" if self.cycles is None \
            else f"{self.cycles:,}"
        chip = self.per_chip[0]
        lines = [f"npu sim: {self.model.name} on {self.npu.name}, strategy {self.strategy}, "
                 f"{self.chips} chip(s), backend {self.backend}",
                 f"  program {chip.instructions} instructions, scratchpad "
                 f"{chip.sram_bytes_used:,} of {self.npu.sram_bytes:,} bytes",
                 f"  cycles {cyc} (+{self.load_cycles:,} host load)"]
        if self.cycles:
            busy = ", ".join(f"{u} {v / self.cycles:.0%}" for u, v in chip.busy.items() if v)
            lines.append(f"  busy: {busy}; units overlapped "
                         f"{chip.overlap_cycles / self.cycles:.0%} of the cycles")
        lines.append(f"  golden match: {'yes (bit-exact)' if self.golden_match else 'NO'}; "
                     f"vs float64: cosine {self.cosine:.5f}, max abs {self.max_abs:.4g}")
        if not self.golden_match:
            lines.append(f"  first mismatch {self.first_mismatch}")
        return "\n".join(lines)
