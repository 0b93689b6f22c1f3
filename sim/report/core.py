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
_COMM = ("collective", "send", "recv")


@dataclass
class ChipStats:
    """One chip's share of a run. ``busy`` has one entry per unit plus ``idle`` (cycles in
    which no unit was busy); ``overlap_cycles`` counts cycles with two or more units busy,
    ``compute_cycles`` those with matmul, attention or vector busy."""

    chip: int
    busy: dict[str, int]
    overlap_cycles: int
    sram_bytes_used: int
    sram_bytes: dict[str, int]
    instructions: int
    compute_cycles: int = 0
    role: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"chip": self.chip, "busy": dict(self.busy), "overlap_cycles": self.overlap_cycles,
                "compute_cycles": self.compute_cycles,
                "sram_bytes_used": self.sram_bytes_used, "sram_bytes": dict(self.sram_bytes),
                "instructions": self.instructions, "role": dict(self.role)}


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
    #: Per chip, per unit: the busy intervals (``sim.report.timeline.intervals``); None untimed.
    spans: list | None = field(default=None, repr=False)
    samples: int = 1
    #: The same model and batch on one chip: its cycles and where they come from.
    reference: dict | None = None
    pipeline: dict | None = None
    #: Sequence parallelism: the chunking and the K/V transfers (``docs/formats.md``).
    sequence: dict | None = None
    #: The chips as a grid: ``{"replicas", "stages", "shards"}`` (``sim.compiler.grid``).
    grid: dict | None = None
    #: Data parallelism: ``{"replicas", "samples_per_replica"}``.
    data: dict | None = None
    #: Hidden-dimension parallelism: the column shards and collectives (``docs/formats.md``).
    hidden: dict | None = None

    @property
    def cycles_per_s(self) -> float | None:
        return self.cycles / self.wall_s if self.cycles and self.wall_s else None

    @property
    def speedup(self) -> float | None:
        if not self.reference or not self.reference.get("cycles") or not self.cycles:
            return None
        return self.reference["cycles"] / self.cycles

    @property
    def scaling_efficiency(self) -> float | None:
        s = self.speedup
        return None if s is None else s / self.chips

    def to_json(self) -> dict:
        report = {
            "strategy": self.strategy, "chips": self.chips, "backend": self.backend,
            "seed": self.seed, "npu": self.npu.name, "model": self.model.name,
            "quant": self.model.quant,
            "samples": self.samples,
            "cycles": self.cycles, "load_cycles": self.load_cycles,
            "golden_match": self.golden_match,
            "float_error": {"max_abs": self.max_abs, "cosine": self.cosine},
            "per_chip": [c.to_json() for c in self.per_chip],
            "collectives": [dict(c) for c in self.collectives],
            "sim": {"wall_s": self.wall_s, "cycles_per_s": self.cycles_per_s},
        }
        if self.chips > 1 or self.reference:
            report["speedup"] = self.speedup
            report["scaling_efficiency"] = self.scaling_efficiency
            report["reference"] = dict(self.reference) if self.reference else None
        if self.grid is not None:
            report["grid"] = dict(self.grid)
        if self.pipeline is not None:
            report["pipeline"] = dict(self.pipeline)
        if self.sequence is not None:
            report["sequence"] = dict(self.sequence)
        if self.data is not None:
            report["data"] = dict(self.data)
        if self.hidden is not None:
            report["hidden"] = dict(self.hidden)
        if self.first_mismatch is not None:
            report["first_mismatch"] = dict(self.first_mismatch)
        return report

    def _torus(self) -> str:
        topo = getattr(self.npu, "topology", None)
        return f" on the {topo} torus" if topo is not None and topo.is_torus else ""

    def summary(self) -> str:
        cyc = "n/a (the ISS does not time programs)" if self.cycles is None \
            else f"{self.cycles:,}"
        lines = [f"npu sim: {self.model.name} on {self.npu.name}, strategy {self.strategy}, "
                 f"{self.chips} chip(s){self._torus()}, backend {self.backend}, "
                 f"{self.samples} sample(s)"]
        for chip in self.per_chip:
            role = ", ".join(f"{k} {v}" for k, v in chip.role.items()) if self.chips > 1 else ""
            lines.append(f"  chip {chip.chip}: program {chip.instructions} instructions, "
                         f"scratchpad {chip.sram_bytes_used:,} of {self.npu.sram_bytes:,} bytes"
                         + (f" ({role})" if role else ""))
        lines.append(f"  cycles {cyc} (+{self.load_cycles:,} host load)")
        if self.cycles:
            for chip in self.per_chip:
                busy = ", ".join(f"{u} {v / self.cycles:.0%}" for u, v in chip.busy.items()
                                 if v)
                comm = sum(chip.busy[u] for u in _COMM)
                lines.append(f"  chip {chip.chip} busy: {busy}; communication "
                             f"{comm / self.cycles:.0%}, overlap "
                             f"{chip.overlap_cycles / self.cycles:.0%}")
        if self.speedup is not None:
            ref = self.reference
            lines.append(f"  speed-up {self.speedup:.2f}x over one chip ({ref['cycles']:,} "
                         f"cycles, {ref['source']}), scaling efficiency "
                         f"{self.scaling_efficiency:.0%}")
        elif self.reference:
            lines.append(f"  no speed-up: the model {self.reference['source']}")
        if self.data is not None:
            lines.append(f"  data: {self.data['replicas']} replicas, samples "
                         f"{self.data['samples_per_replica']}")
        if self.pipeline is not None:
            p = self.pipeline
            bubble = "n/a" if p["bubble_fraction"] is None else f"{p['bubble_fraction']:.1%}"
            lines.append(f"  pipeline: {p['stages']} stages (layers {p['layers_per_stage']}), "
                         f"{p['microbatches']} microbatches; bubble {bubble} vs "
                         f"(p-1)/(m+p-1) = {p['bubble_formula']:.1%}")
        if self.hidden is not None:
            h = self.hidden
            lines.append(f"  hidden: columns {h['columns_per_chip']}, split heads "
                         f"{h['split_heads']}; per layer {h['collectives_per_layer']} "
                         f"collectives ({h['coll_launches_per_layer']} COLL launches, "
                         f"{h['bytes_per_layer']:,} bytes); projections by {h['reduce']}")
        if self.sequence is not None:
            q = self.sequence
            zigzag = q.get("order") == "zigzag"       # each chip an early and a late block
            chunks = ", ".join(" + ".join(f"{a}..{b - 1}" for a, b in chunk) if zigzag else
                               f"{chunk[0]}..{chunk[1] - 1}" for chunk in q["chunks"])
            passes = f"; passes {[b - a for a, b in q['passes'][0]]}" \
                if len(q["passes"][0]) > 1 else ""
            halo = "" if q["halo_cycles"] is None else f", {q['halo_cycles']:,} send cycles"
            order = f", {q['order']} order" if q["mode"] == "ring" and "order" in q else ""
            lines.append(f"  sequence ({q['mode']}{order}): tokens {chunks}{passes}; window "
                         f"{q['window']}; K/V moved {q['halo_bytes']:,} bytes in "
                         f"{q['transfers_per_layer']} transfers per layer{halo}")
            if q.get("merge_share") is not None:
                lines.append(
                    f"  ring attention: K/V sent per chip {q['kv_bytes_sent']} bytes; transfer "
                    f"cycles hidden behind compute {q['transfer_hidden_cycles']}, exposed "
                    f"{q['halo_exposed_cycles']}; merge "
                    f"{[f'{m:.1%}' for m in q['merge_share']]} of the cycles; attention "
                    f"imbalance {q['attention_imbalance']} (busiest / mean)")
        timed = [c for c in self.collectives if "cycles" in c]
        if timed:
            by_kind = {}
            for c in timed:
                by_kind.setdefault(c["kind"], []).append(c)
            for kind, items in by_kind.items():
                cycles = sum(c["cycles"] for c in items)
                nbytes = sum(c["bytes"] for c in items)
                ratio = cycles / sum(c["bound_cycles"] for c in items)
                links = sorted({c["links"] for c in items if "links" in c})
                where = ""
                if links and links != ["the ring"] and not links[0].startswith("the ring"):
                    # A torus: which rows', columns' links each kind used.
                    shown = ", ".join(links[:6]) + (f", ... ({len(links)})" if len(links) > 6
                                                    else "")
                    where = f"; on {shown}"
                lines.append(f"  {len(items)} x {kind}: {nbytes:,} bytes, {cycles:,} cycles, "
                             f"{ratio:.2f} of the ring bound{where}")
        elif self.collectives:
            lines.append(f"  {len(self.collectives)} collectives/transfers "
                         f"({sum(c['bytes'] for c in self.collectives):,} bytes)")
        lines.append(f"  golden match: {'yes (bit-exact)' if self.golden_match else 'NO'}; "
                     f"vs float64 ({self.model.quant}): cosine {self.cosine:.5f}, max abs "
                     f"{self.max_abs:.4g}")
        if not self.golden_match:
            lines.append(f"  first mismatch {self.first_mismatch}")
        return "\n".join(lines)
