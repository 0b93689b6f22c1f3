"""Training's gradient all-reduce (``npu plan --training``): the per-step all-reduce of a
model's gradients, one int32 per parameter, over every chip of the system (data parallelism's
one communication), with the 1-D and the 2-D algorithms.

The gradients go through the scratchpad in **sections** of at most :func:`section_elements`
(the chip's scratchpad, and a collective's ``2**24 - 1`` elements): each section one
all-reduce of :mod:`sim.compiler.torus_collective`'s plan (its phases, groups, chunks), timed in
closed form (:func:`collective_cycles`) from the engine's schedule, step by step: a step moves a
chunk's block of ``w`` engine words at ``max(c, r)`` cycles a word (``c = D / B`` on the link,
``r = D / N`` through the scratchpad's port) and costs at least a hop (``a + c``); an
all-reduce runs ``2(n - 1)`` such steps a chunk (its last step merged with the next chunk's
first), a reduce-scatter ``n`` (its last reads locally: the port bounds it), an all-gather in
place ``n - 1``. Against the cycle model on the tiny preset (``tests/sim/planner``,
``npu collective --model``): within 2% from 1 KiB up (the tiny model's whole gradient
all-reduce on a 2 x 2 torus: 43,356 cycles predicted, 43,353 run on Verilator), a few cycles
off for a message of a word or two.
"""

from __future__ import annotations

from dataclasses import dataclass

from hw.spec import ModelConfig, NpuConfig
from hw.spec.collective import LENGTH_BITS, Kind, word_bytes
from hw.spec.timing.collective import ring_bound_cycles
from hw.spec.topology import Topology

from ..compiler.torus_collective import ALGORITHMS, _chunks, torus_collective

__all__ = ["parameter_count", "section_elements", "collective_cycles", "TrainingPlan",
           "plan_training"]

#: Cycles of a collective's fetch and drain beyond its steps (the local input's first words
#: through the read port and the gearbox, the last output words written).
FIXED_CYCLES = 8


def parameter_count(cfg: ModelConfig) -> int:
    """The model's parameters: every layer's attention projections, FFN matrices, biases and
    norms, the embeddings (and an untied LM head) and the final norm."""
    d, dh = cfg.d_model, cfg.d_head
    kv = cfg.n_kv_heads or cfg.n_heads
    attn = d * cfg.n_heads * dh * 2 + d * kv * dh * 2            # Q, O and K, V
    ffn = d * cfg.d_ff * (3 if cfg.ffn == "gated" else 2)
    norm = d * (1 if cfg.norm_kind == "rmsnorm" else 2)
    bias = 0
    if cfg.bias:
        bias = cfg.n_heads * dh + 2 * kv * dh + d + cfg.d_ff * (2 if cfg.ffn == "gated"
                                                                 else 1) + d
    layer = attn + ffn + 2 * norm + bias
    tables = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return cfg.n_layers * layer + tables + norm


def section_elements(npu: NpuConfig) -> int:
    """The most int32 elements one section holds: the scratchpad, and half a COLL's length
    (room for the padding to equal blocks of whole chunks)."""
    return min(npu.sram_bytes // 4, 1 << (LENGTH_BITS - 1))


def collective_cycles(npu: NpuConfig, topology: Topology, kind, n: int, length: int,
                      width: int, dim: int) -> int:
    """Cycles of one collective of ``length`` elements (padded: equal blocks of whole engine
    words) over ``n`` chips on the links of dimension ``dim``, in the chip (the closed form of
    the module docstring)."""
    kind = Kind[kind.upper()] if isinstance(kind, str) else Kind(kind)
    if n == 1:
        return FIXED_CYCLES
    link = topology.link(dim, npu)
    wbytes = word_bytes(npu.link_bytes_per_cycle, npu.array_size)
    epw = wbytes * 8 // width
    c, r = wbytes // link.bytes_per_cycle, wbytes // npu.array_size
    block = -(-length // (n * epw))                    # engine words per block
    k = _chunks(block)
    w = -(-block // k)
    step = max(w * max(c, r), link.latency_cycles + c)
    if kind == Kind.ALL_REDUCE:
        return k * (2 * n - 2) * step + w * r + FIXED_CYCLES
    if kind == Kind.REDUCE_SCATTER:
        return k * n * step + FIXED_CYCLES
    return k * (n - 1) * step + w * r + FIXED_CYCLES


@dataclass
class TrainingPlan:
    """One algorithm's per-step gradient all-reduce: ``cycles`` (predicted), ``bound_cycles``
    (its phases' alpha-beta bound), ``sections`` of at most ``section`` elements."""

    algorithm: str
    topology: str
    chips: int
    parameters: int
    sections: int
    section: int
    cycles: int
    bound_cycles: int
    clock_mhz: float

    @property
    def bytes(self) -> int:
        return 4 * self.parameters

    @property
    def ms(self) -> float:
        return self.cycles / (self.clock_mhz * 1e3)

    def to_json(self) -> dict:
        return {"algorithm": self.algorithm, "topology": self.topology, "chips": self.chips,
                "parameters": self.parameters, "bytes": self.bytes,
                "sections": self.sections, "section_elements": self.section,
                "cycles": self.cycles, "bound_cycles": self.bound_cycles,
                "ratio": self.cycles / self.bound_cycles if self.bound_cycles else None,
                "ms": self.ms}


def _plan_cycles(npu, topology, length, algorithm):
    """(cycles, bound) of one section's all-reduce with ``algorithm``."""
    plan = torus_collective("all_reduce", "sum", 32, length, topology, base=0,
                            size=npu.array_size, link_bytes=npu.link_bytes_per_cycle,
                            algorithm=algorithm)
    cycles = 0
    for phase in plan.phases[plan.members[0]]:
        cycles += max(collective_cycles(npu, topology, p.req.kind, p.req.count,
                                        p.req.length, 32, 0 if p.req.stride == 1 else 1)
                      for p in phase)
    return cycles, plan.bound_cycles(npu)


def plan_training(npu: NpuConfig, cfg: ModelConfig, topology: Topology) -> list[TrainingPlan]:
    """The per-step gradient all-reduce of ``cfg`` over every chip of ``topology``: the 1-D
    ring algorithm (on a torus, a ring through every chip on its slowest dimension's links)
    and, on a torus, the 2-D ones (:data:`~sim.compiler.torus_collective.ALGORITHMS`)."""
    params = parameter_count(cfg)
    section = section_elements(npu)
    full, rest = divmod(params, section)
    out = []
    chips = topology.chips
    options = [("1-D ring", None)]
    if topology.is_torus:
        options += [(f"2-D {name}", name) for name in ALGORITHMS]
    for label, algorithm in options:
        total = bound = 0
        for length, times in ((section, full), (rest, 1 if rest else 0)):
            if not times:
                continue
            if algorithm is None:
                links = [topology.link(d, npu) for d in range(len(topology.dims))]
                slow = min(links, key=lambda x: (x.bytes_per_cycle, -x.latency_cycles))
                ring = Topology((chips,), (slow,))
                cyc, bnd = _plan_cycles(npu, ring, length, "auto")
                bnd = ring_bound_cycles("all_reduce", 4 * length, chips,
                                        slow.bytes_per_cycle, slow.latency_cycles)
            else:
                cyc, bnd = _plan_cycles(npu, topology, length, algorithm)
            total += times * cyc
            bound += times * bnd
        out.append(TrainingPlan(label, str(topology), chips, params, full + bool(rest),
                                section, total, bound, npu.clock_mhz))
    return out


def training_table(plans: list[TrainingPlan]) -> str:
    """The plans as the text ``npu plan --training`` prints."""
    p0 = plans[0]
    lines = [f"gradient all-reduce per training step: {p0.parameters:,} parameters (int32, "
             f"{p0.bytes:,} B per chip) over the {p0.chips} chips of the {p0.topology}, in "
             f"{p0.sections} section(s) of at most {p0.section:,} elements"]
    for p in plans:
        lines.append(f"  {p.algorithm:<22} {p.cycles:>14,} cycles  {p.ms:>10.4g} ms  bound "
                     f"{p.bound_cycles:,} ({p.cycles / p.bound_cycles:.3f})")
    return "\n".join(lines)
