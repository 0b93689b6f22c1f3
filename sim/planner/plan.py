"""``npu plan`` as a function: will a model fit N chips, with which strategy, how fast?

:func:`plan` answers, per strategy (``sim.strategies``) and chip count, without
running any RTL and without the model's weights:

- **fits** or not, with every violated limit named (:class:`Reason`): the strategy's own
  checks (:meth:`~sim.strategies.base.Strategy.limits`: what ``npu sim`` would refuse, every
  refusal collected), then each chip's bytes against ``sram_bytes``, the program against
  ``imem_words``. Every model feature is planned as the strategy compiles it (RMSNorm,
  SiLU and a gated FFN included: the gate is a tensor of the layout, its matmul and MUL are
  in the programs).
- **per-chip bytes**: ``weights``, ``kv_cache`` and ``activations`` as the compiler's
  allocator lays them out, from the strategy's own compile of the shapes stopped after the
  layout (:func:`per_chip_bytes`), plus the tables it does not place (embeddings, positions,
  final norm and LM head, where they live);
- **communication** per layer (bytes a chip sends, collectives);
- **predicted cycles**, latency and tokens/s at ``clock_mhz``: the strategy's programs
  compiled from the model's shape alone (:func:`compile_shapes`: the compiler's layout and
  program with dummy integer parameters) and timed by the ISS's timing model, the cycle model
  (:mod:`sim.timing.cycle`, equal to the RTL) when the programs are short enough, else the
  launch-level model (:mod:`sim.timing.launch`); deep models are timed on two and four layers per
  chip and extended along their layers. The strategies timed from other programs (sequence
  and the 2-D grids: :data:`COMPILED` lists the others) are marked analytic;
- the **smallest chip count** that fits.

The JSON form is :meth:`PlanReport.to_json` (``docs/formats.md``, ``npu plan --json``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np

from hw.spec import ConfigError, ModelConfig, NpuConfig
from hw.spec.attention import POS_BITS
from hw.spec.collective import word_bytes
from hw.spec.formats import OutMode
from hw.spec.memory import row_words
from hw.spec.timing import attention as attn_timing
from hw.spec.timing.collective import ring_bound_cycles
from hw.spec.topology import MAX_CHIPS, DimLink, Topology
from hw.spec.vector import GELU16_KNOTS

from ..compiler import attention_launch as al_
from ..compiler.attention_launch import plan_schedule
from ..compiler.blocks import pad_to
from ..compiler.program import SystemProgram
from ..compiler.quantize import (
    LLM_SCHEMES,
    RELU16_G,
    QGated16,
    QLayer,
    QLayerNorm,
    QLinear,
    QModel,
)
from ..errors import BadInput
from ..golden.vector import SPLIT16_G
from ..iss.errors import IssError
from ..strategies import GRIDS, NAMES, REGISTRY
from ..strategies import get as get_strategy
from ..strategies.grid import GridStrategy
from ..strategies.roles import Role, cut_points, part
from ..timing.cycle import time_programs
from ..timing.launch import LaunchTimer, time_programs_fast

__all__ = ["plan", "plan_chip_counts", "PlanReport", "StrategyPlan", "ChipBytes", "Reason",
           "compile_shapes", "COMPILED", "per_chip_bytes", "limits", "ring_buildable",
           "torus_of", "dim_links", "ring_link"]

#: Strategies whose programs the compiler emits (the others are planned analytically).
COMPILED = tuple(s.name for s in REGISTRY.values() if s.planned == "program")
#: Programs up to this many chip-cycles are timed by the cycle model (equal to the RTL).
EXACT_CHIP_CYCLES = 150_000
#: Chips deep enough to be timed on fewer layers and extended (layers per chip).
SHORTENED_LAYERS = 4
#: Largest chip count ``--min-chips`` tries.
MAX_SEARCH = 4096
#: The limits of a split itself (an axis longer than what it splits): no layout is made.
SPLIT_KEYS = ("n_heads", "n_layers", "batch")
#: Chips over the scratchpad named one share at a time (the rest in one line).
LISTED_SHARES = 3


# --- the report ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Reason:
    """One violated limit: the key, the value the plan needs, the limit, why."""

    key: str
    value: object
    limit: object
    message: str

    def __str__(self):
        return self.message


@dataclass
class ChipBytes:
    chip: int
    weights: int
    kv_cache: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations

    def to_json(self) -> dict:
        return {"chip": self.chip, "weights": self.weights, "kv_cache": self.kv_cache,
                "activations": self.activations}


@dataclass
class StrategyPlan:
    strategy: str
    grid: str | None
    chips: int
    fits: bool
    reasons: list[Reason]
    per_chip: list[ChipBytes]
    comm_bytes_per_layer: int
    collectives_per_layer: int
    predicted_cycles: int | None
    latency_ms: float | None
    tokens_per_s: float | None
    min_chips: int | None
    notes: list[str] = field(default_factory=list)
    #: How the cycles were found: "cycle model", "launch-level model", "analytic" or None.
    timing: str | None = None
    #: The torus a 2-D grid is placed on (``"XxY"``, :func:`torus_of`); None: a ring.
    topology: str | None = None

    def to_json(self) -> dict:
        return {"strategy": self.strategy, "grid": self.grid, "chips": self.chips,
                "fits": self.fits, "reasons": [str(r) for r in self.reasons],
                "per_chip": [c.to_json() for c in self.per_chip],
                "comm_bytes_per_layer": self.comm_bytes_per_layer,
                "collectives_per_layer": self.collectives_per_layer,
                "predicted_cycles": self.predicted_cycles, "latency_ms": self.latency_ms,
                "tokens_per_s": self.tokens_per_s, "min_chips": self.min_chips,
                "notes": list(self.notes), "timing": self.timing,
                "topology": self.topology}


@dataclass
class PlanReport:
    npu: NpuConfig
    model: ModelConfig
    strategies: list[StrategyPlan]
    wall_s: float = 0.0

    def ranked(self) -> list[StrategyPlan]:
        """Fitting plans first, by predicted latency; then the others."""
        def key(p):
            lat = p.latency_ms if p.latency_ms is not None else math.inf
            return (not p.fits, lat)
        return sorted(self.strategies, key=key)

    @property
    def best(self) -> StrategyPlan | None:
        ranked = self.ranked()
        return ranked[0] if ranked and ranked[0].fits else None

    def to_json(self) -> dict:
        return {"npu": self.npu.name, "model": self.model.name,
                "strategies": [p.to_json() for p in self.ranked()]}

    def table(self) -> str:
        """The plans as a table for people, by predicted latency, the best marked ``*``."""
        best = self.best
        head = (f"npu plan: {self.model.name} on {self.npu.name} "
                f"({self.npu.clock_mhz:g} MHz, {self.npu.sram_bytes:,} B SRAM per chip)")
        cols = ("", "strategy", "grid", "chips", "fits", "max chip bytes", "comm B/layer",
                "coll/layer", "cycles", "latency ms", "tokens/s", "min chips", "timing")
        rows = []
        for p in self.ranked():
            peak = max((c.total for c in p.per_chip), default=None)
            rows.append(("*" if p is best else "", p.strategy, p.grid or "-", str(p.chips),
                         "yes" if p.fits else "no", "-" if peak is None else f"{peak:,}",
                         f"{p.comm_bytes_per_layer:,}",
                         str(p.collectives_per_layer),
                         "-" if p.predicted_cycles is None else f"{p.predicted_cycles:,}",
                         "-" if p.latency_ms is None else f"{p.latency_ms:.4g}",
                         "-" if p.tokens_per_s is None else f"{p.tokens_per_s:,.4g}",
                         "-" if p.min_chips is None else str(p.min_chips), p.timing or "-"))
        widths = [max(len(c), *(len(r[k]) for r in rows)) for k, c in enumerate(cols)]
        lines = [head, "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
        for p in self.ranked():
            what = f"{p.strategy}" + (f" {p.grid}" if p.grid else "") + f" on {p.chips}"
            for r in p.reasons:
                lines.append(f"  {what}: does not fit: {r}")
            for note in p.notes:
                lines.append(f"  {what}: {note}")
        lines.append(f"  planned in {self.wall_s:.2f} s")
        return "\n".join(lines)


# --- what each chip holds -----------------------------------------------------------------
def _learned_positions(cfg: ModelConfig) -> bool:
    """GPT-2 and BERT learn a position table (``seq_len`` rows counted); a RoPE model
    (``rope_theta`` > 0, Llama) rotates its queries and keys instead: its tables are the
    compiler's (``rope.cos``, ``rope.sin``, counted with the weights)."""
    return not cfg.rope


def _table_bytes(npu: NpuConfig, cfg: ModelConfig, role: Role) -> int:
    """What the compiler does not place and a chip still holds: its share of the token
    embedding table (and of the learned positions) and of the LM head, int8 per element, and
    the final norm's parameters where they live."""
    table = cfg.vocab_size * cfg.d_model
    pos = cfg.seq_len * cfg.d_model if _learned_positions(cfg) else 0
    head = role.lm_head if cfg.causal else 0.0      # an encoder has no LM head
    out = math.ceil((table + pos) * role.embeddings) + math.ceil(table * head)
    if role.final_norm:
        out += row_words(cfg.d_model, 4, npu.array_size) * npu.array_size
    return out


def _roles(npu, cfg, strategy, chips, grid, *, only=None) -> list[Role]:
    """Each chip's :class:`Role` (the strategy's split, ``numpy.array_split`` everywhere);
    ``only``: just those chips (``"cuts"``: one of each distinct share, for searches)."""
    n = npu.array_size
    if only == "cuts":
        cuts = {c for total in (cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.seq_len, cfg.batch,
                                pad_to(cfg.d_model, n) // n)
                for c in cut_points(total, max(1, chips))}
        only = {c for c in cuts if c < chips}
    picks = range(chips) if only is None else sorted(only)
    return get_strategy(strategy).roles(npu, cfg, chips, grid, picks)


def _cut_chips(npu, cfg, strategy, chips, grid=None) -> list[int]:
    return [r.chip for r in _roles(npu, cfg, strategy, chips, grid, only="cuts")]


def _grid_text(grid) -> str | None:
    return None if grid is None else f"{grid[0]}x{grid[1]}"


def _layout(npu, cfg, strategy, chips, grid, picks, samples=None) -> dict[int, dict]:
    """Per chip of ``picks``: the allocator's bytes per category (a gated FFN's gate is one of
    its tensors), from the strategy's own compile of ``cfg``'s shapes (``samples``: default
    ``cfg.batch``) stopped after its layout (``emit=False``: no program, so on any chip count
    and without a ring port)."""
    prog = get_strategy(strategy).compile_shapes(
        npu, _dummy_qmodel(cfg), chips, samples=cfg.batch if samples is None else samples,
        grid=_grid_text(grid), only=set(picks), emit=False)
    return {c: dict(prog.chips[c].alloc.used) for c in picks}


#: Chips holding more layers than this are laid out with 1 and 2 layers per stage and their
#: weights extended along the layers (each layer's weights are the same size).
LAID_OUT_LAYERS = 2


def _representatives(npu, cfg, strategy, chips, grid, picks) -> dict[int, int]:
    """Each chip of ``picks`` and the chip laid out for it: on the grid compiler's layouts
    (chip ``(r * stages + s) * shards + h``) the first chip whose replica, stage and shard
    have the same shares (samples; layers, first and last stage; heads, K/V heads, FFN
    columns, rows and d_model words, first shard) and so the same layout: a grid of
    hundreds of chips is laid out on its few distinct shares. Other strategies: itself."""
    strat = get_strategy(strategy)
    if not isinstance(strat, GridStrategy):
        return {c: c for c in picks}
    split = strat.split(chips, grid)
    n = npu.array_size
    totals = {"replicas": (cfg.batch,), "stages": (cfg.n_layers,),
              "shards": (cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.seq_len,
                         pad_to(cfg.d_model, n) // n)}

    def axis(size, what):
        first = {}
        for i in range(size):
            key = (tuple(part(t, size, i) for t in totals[what]), i == 0, i == size - 1)
            first.setdefault(key, i)
        return [first[(tuple(part(t, size, i) for t in totals[what]), i == 0, i == size - 1)]
                for i in range(size)]

    rs, ss, hs = (axis(split.replicas, "replicas"), axis(split.stages, "stages"),
                  axis(split.shards, "shards"))
    out = {}
    for c in picks:
        h, rest = c % split.shards, c // split.shards
        s_, r = rest % split.stages, rest // split.stages
        out[c] = (rs[r] * split.stages + ss[s_]) * split.shards + hs[h]
    return out


def per_chip_bytes(npu: NpuConfig, cfg: ModelConfig, strategy: str, chips: int, grid=None, *,
                   only=None) -> list[ChipBytes]:
    """Each chip's bytes (``only``: those chips, or ``"cuts"``): the compiler's allocator
    (:func:`_layout`) plus what it does not place (:func:`_table_bytes`). ValueError when the
    compiler cannot lay the share out (its message says why)."""
    roles = _roles(npu, cfg, strategy, chips, grid, only=only)
    rep = _representatives(npu, cfg, strategy, chips, grid, [r.chip for r in roles])
    picks = sorted(set(rep.values()))
    stages = get_strategy(strategy).split(chips, grid).stages
    deep = max(r.layers for r in roles) > LAID_OUT_LAYERS
    if not deep:
        one, two = _layout(npu, cfg, strategy, chips, grid, picks), None
    else:
        one, two = (_layout(npu, dataclasses.replace(cfg, n_layers=k * stages), strategy,
                            chips, grid, picks) for k in (1, 2))
    out = []
    for r in roles:
        used = one[rep[r.chip]]
        weights = used["weights"]
        if two is not None:
            weights += (r.layers - 1) * (two[rep[r.chip]]["weights"] - weights)
        out.append(ChipBytes(r.chip, weights + _table_bytes(npu, cfg, r), used["kv_cache"],
                             used["activations"]))
    return out


# --- limits -------------------------------------------------------------------------------
def _reasons(npu, cfg, strategy, chips, grid, per_chip, refused=None) -> list[Reason]:
    """Every constraint ``strategy``'s own checks refuse (:meth:`Strategy.limits` on the
    model itself: a feature it does not build is one of them; ``refused``: those, already
    found), then each chip whose bytes exceed the scratchpad (chips with the same bytes named
    together)."""
    out = list(refused) if refused is not None else [
        Reason(e.key, e.value, e.limit, str(e)) for e in
        get_strategy(strategy).limits(npu, cfg, chips, grid, samples=cfg.batch)]
    over = {}
    for c in per_chip:
        if c.total > npu.sram_bytes:
            over.setdefault((c.weights, c.kv_cache, c.activations), []).append(c.chip)
    groups = sorted(over.items(), key=lambda item: -sum(item[0]))
    for (w, kv, act), which in groups[:LISTED_SHARES]:
        out.append(Reason("sram_bytes", w + kv + act, npu.sram_bytes,
                          f"{_chips(which)} {'needs' if len(which) == 1 else 'need'} "
                          f"{w + kv + act:,} bytes (weights {w:,}, kv_cache {kv:,}, "
                          f"activations {act:,}) of sram_bytes={npu.sram_bytes:,}"))
    if len(groups) > LISTED_SHARES:
        rest = sorted(c for _, which in groups[LISTED_SHARES:] for c in which)
        most = sum(groups[LISTED_SHARES][0])
        out.append(Reason("sram_bytes", most, npu.sram_bytes,
                          f"{_chips(rest)} need up to {most:,} bytes (as many shares, each "
                          f"its own) of sram_bytes={npu.sram_bytes:,}"))
    return out


def limits(npu: NpuConfig, cfg: ModelConfig, strategy: str, chips: int, grid=None, *,
           per_chip: list[ChipBytes] | None = None) -> list[Reason]:
    """Every limit ``strategy`` on ``chips`` chips (``grid``: ``(A, B)``) violates; the
    chips' bytes are :func:`per_chip_bytes` unless ``per_chip`` gives them."""
    if per_chip is None:
        return _bytes_and_reasons(npu, cfg, strategy, chips, grid)[1]
    return _reasons(npu, cfg, strategy, chips, grid, per_chip)


def _bytes_and_reasons(npu, cfg, name, chips, grid, only=None):
    """(per-chip bytes, reasons); no bytes and the compiler's refusal as a reason when it
    cannot lay the share out, or none when the split itself is refused (more chips along
    an axis than heads, layers or samples: no chip count's layout would mean anything)."""
    refused = _reasons(npu, cfg, name, chips, grid, [])
    if any(r.key in SPLIT_KEYS for r in refused):
        return [], refused
    try:
        per_chip = per_chip_bytes(npu, cfg, name, chips, grid, only=only)
    except ValueError as exc:
        reasons = list(refused)
        if not reasons:
            reasons.append(Reason("layout", None, None, f"no scratchpad layout: {exc}"))
        return [], reasons
    return per_chip, _reasons(npu, cfg, name, chips, grid, per_chip, refused)


def _chips(which) -> str:
    """``chip 3`` or ``chips 0-2, 5``."""
    runs, start = [], None
    for k, c in enumerate(which):
        if start is None:
            start = c
        if k + 1 == len(which) or which[k + 1] != c + 1:
            runs.append(f"{start}" if start == c else f"{start}-{c}")
            start = None
    return ("chip " if len(which) == 1 else "chips ") + ", ".join(runs)


# --- shapes-only compile --------------------------------------------------------------------
def _dummy_qmodel(cfg: ModelConfig) -> QModel:
    """A quantised model with no weights, for the emitters' shapes-only mode
    (``contents=False``): the compiler's program and layout depend only on the shapes and on
    the scheme's flags (``sim.compiler.quantize.quantize_model``: under ``quant="smooth16"``
    every layer's FFN hidden is int16, ``ffn16``, with a GELU16 table; post-norm smooth16
    also has the per-lane requantisations of the QKV and FFN1 inputs, ``qkv_req`` and
    ``ffn_req``; under ``quant="llm16"`` likewise, and every block after the first starts with
    the REQUANT of its residual scale, ``res_req``; under ``quant="llm16c"`` that REQUANT is
    per lane, every norm has its per-lane ``norm_req`` and a gated FFN its ``gated16``).
    ``sim.compiler.assembler.Assembler.set``
    drops SETs by value *and* source, so any integer scales give the same instructions."""
    smooth16 = cfg.quant in ("smooth16", "llm16", "llm16c")
    wide = cfg.quant == "llm16c"
    lanes = (None, None) if smooth16 and cfg.norm == "post" else None   # present, not read
    per_lane = (np.ones(1, np.int64), np.ones(1, np.int64))             # present, not read
    gated16 = QGated16(None, RELU16_G, 15, (4, 1), (1, 7), (1, 15)) if wide and cfg.ffn == "gated" \
        else None
    layers = []
    for i in range(cfg.n_layers):
        res_req = None
        if i and cfg.quant in LLM_SCHEMES:
            res_req = per_lane if wide else (1 << 15, 15)
        layers.append(QLayer(
            ln1=QLayerNorm(None, None, 16, 1 << 15, 16), q=None, k=None, v=None, o=None,
            ln2=QLayerNorm(None, None, 16, 1 << 15, 16), ffn1=None, ffn2=None,
            score_mult=1 << 15, score_shift=16, out_mult=1 << 15, out_shift=16, lut=None,
            qkv_req=lanes, ffn_req=lanes,
            lut16=np.zeros(GELU16_KNOTS, np.int64) if smooth16 else None,
            gelu_g=(SPLIT16_G if gated16 else RELU16_G) if smooth16 else 0,
            gate=QLinear(None, None, None, None, OutMode.INT8) if cfg.ffn == "gated" else
            None,
            res_req=res_req, norm_req=per_lane if wide else None, norm_n=1 if wide else 0,
            gated16=gated16))
    return QModel(cfg, layers, 1.0, {}, 1 << 15, 16, quant=cfg.quant)


def compile_shapes(strategy: str, npu: NpuConfig, cfg: ModelConfig, chips: int, *,
                   samples: int = 1, microbatches: int | None = None,
                   grid: str | None = None, only: set[int] | None = None) -> SystemProgram:
    """The programs and layouts ``sim.strategies.compile_program`` gives ``cfg`` on
    ``chips`` chips, from the shapes alone (no weights, dummy scales; the SET values of the
    scales differ, nothing else): the grid compiler itself, its emitter placing the weights
    without their contents, none of its checks (the planner collects them); ``only``: just
    those chips' programs (the others None).
    ``ValueError`` when a program cannot be written (attention that fits no schedule).
    Hidden parallelism: its own compiler (``sim.compiler.hidden``), without contents or checks
    either, on datapaths as wide as the model (the planner names the shards' width limits)."""
    return get_strategy(strategy).compile_shapes(
        npu, _dummy_qmodel(cfg), chips, samples=samples, microbatches=microbatches, grid=grid,
        only=only)


# --- timing ---------------------------------------------------------------------------------
class _Timer:
    """Times compiled programs; one launch timer (and its memo) for the whole plan."""

    def __init__(self, npu):
        self.npu = npu
        self.launches = LaunchTimer(npu)
        self.exact_budget = EXACT_CHIP_CYCLES
        self.programs = {}
        self._smallest = {}
        self._launches = {}

    def smallest(self, cfg, name):
        """:func:`_smallest`, once per model and strategy."""
        key = (cfg, name)
        if key not in self._smallest:
            self._smallest[key] = _smallest(self.npu, cfg, name)
        return self._smallest[key]

    def time(self, npu, programs) -> tuple[int, str]:
        # A launch's duration is the chip's alone: one launch timer (and its memo) per chip
        # configuration, whatever the topology.
        chip = dataclasses.replace(npu, topology=None)
        if chip not in self._launches:
            self._launches[chip] = self.launches if chip == dataclasses.replace(
                self.npu, topology=None) else LaunchTimer(chip)
        fast = time_programs_fast(npu, programs, timer=self._launches[chip]).cycles
        torus = npu.topology is not None and npu.topology.is_torus
        if fast * len(programs) <= self.exact_budget and not torus:
            try:
                return time_programs(npu, programs, ring=len(programs) > 1,
                                     max_cycles=4 * fast + 1000,
                                     link=ring_link(npu)).cycles, "cycle model"
            except IssError:
                pass
        return fast, "launch-level model"


def ring_link(npu: NpuConfig) -> DimLink:
    """The links of ``npu``'s ring: its ``[topology]``'s when that is a ring with links of its
    own, on a torus the slowest dimension's (a group of all its chips is on no one ring of
    it, as the launch-level model times it), else the NPU's ``link_*``."""
    topo = npu.topology
    if topo is not None and topo.links:
        links = topo.links
        return DimLink(min(x.bytes_per_cycle for x in links),
                       max(x.latency_cycles for x in links))
    return DimLink(npu.link_bytes_per_cycle, npu.link_latency_cycles)


def dim_links(npu: NpuConfig) -> tuple[DimLink, DimLink]:
    """The links of a torus's dimensions 0 and 1 (a grid's rows and columns): the
    ``[topology]``'s, else the NPU's ``link_*`` on both."""
    topo = npu.topology
    if topo is not None and topo.links:
        return (topo.links[0], topo.links[-1])
    own = DimLink(npu.link_bytes_per_cycle, npu.link_latency_cycles)
    return own, own


def torus_of(name: str, grid: tuple[int, int]) -> tuple[int, int]:
    """The torus ``X x Y`` a 2-D grid is placed on: its axis of consecutive chip ids (the head
    groups of head+pipeline and data+head, the pipelines of data+pipeline) along the rows
    (dimension 0, X), the other along the columns (Y), so that head+pipeline's head groups
    are rows' rings and its stage-to-stage sends one hop along a column."""
    a, b = grid
    return (a, b) if name == "head+pipeline" else (b, a)


_ROWS = {"head+pipeline": ("the head groups", "the pipeline stages, each send one hop"),
         "data+head": ("the head groups", "the data replicas"),
         "data+pipeline": ("the pipelines, each send one hop", "the data replicas")}


def _row_npu(npu: NpuConfig, chips: int, link: DimLink) -> NpuConfig:
    """``npu`` on a ring of ``chips`` chips with links ``link`` (a row of a torus)."""
    return dataclasses.replace(npu, topology=Topology((chips,), (link,)))


def _fit_npu(npu: NpuConfig, cfg: ModelConfig, strategy: str, chips: int,
             samples: int) -> NpuConfig:
    """``npu`` with an instruction memory large enough for any program, and, when a chip's
    share of ``cfg`` (its layout, :func:`_layout`) does not fit its scratchpad, a larger one
    (the same banks, each a power of two words) on which the compiled addresses are valid."""
    laid = _layout(npu, cfg, strategy, chips, None, _cut_chips(npu, cfg, strategy, chips),
                   samples)
    need = max(sum(used.values()) for used in laid.values())
    big = dataclasses.replace(npu, imem_words=1 << 20)
    if need <= npu.sram_bytes // 2:
        return big
    bank = npu.sram_bytes // npu.sram_banks
    banks = max(npu.sram_banks, -(-2 * need // bank))
    return dataclasses.replace(big, sram_bytes=banks * bank, sram_banks=banks)


def _compiled_cycles(timer, npu, cfg, strategy, chips, samples):
    """Cycles of the compiled programs (on a scratchpad that holds them); deep models are
    compiled with 2 and 4 layers per chip and extended linearly along the layers."""
    key = (strategy, chips, samples, cfg, npu.topology)
    if key not in timer.programs:
        timer.programs[key] = _compile_and_time(timer, npu, cfg, strategy, chips, samples)
    cycles, how, size, notes = timer.programs[key]
    return cycles, how, size, list(notes)


def _compile_and_time(timer, npu, cfg, strategy, chips, samples):
    per_stage = get_strategy(strategy).split(chips).stages
    per_chip = math.ceil(cfg.n_layers / per_stage)
    notes = []

    def run(model):
        fit = _fit_npu(npu, model, strategy, chips, samples)
        prog = compile_shapes(strategy, fit, model, chips, samples=samples)
        cycles, how = timer.time(fit, [c.program for c in prog.chips])
        return cycles, how, prog, fit is not npu

    if per_chip <= SHORTENED_LAYERS:
        cycles, how, prog, bigger = run(cfg)
        size = max(len(c.program) for c in prog.chips)
    else:
        (c2, how, p2, bigger), (c4, _, p4, _) = (run(dataclasses.replace(cfg, n_layers=k *
                                                                         per_stage))
                                                 for k in (2, 4))
        cycles = round(c2 + (c4 - c2) * (per_chip - 2) / 2)
        s2, s4 = (max(len(c.program) for c in p.chips) for p in (p2, p4))
        size = round(s2 + (s4 - s2) * (per_chip - 2) / 2)
        notes.append(f"timed on 2 and 4 layers per chip, extended to {per_chip}")
    if bigger:
        notes.append("timed on a scratchpad large enough to hold it (more banks of the "
                     "same size)")
    return cycles, how, size, notes


# --- the planner ------------------------------------------------------------------------------
def plan(npu: NpuConfig, model: ModelConfig, *, chips: int | None = None,
         min_chips: bool = False, strategy: str = "all",
         exact_chip_cycles: int = EXACT_CHIP_CYCLES) -> PlanReport:
    """Plan ``model`` on ``chips`` chips of ``npu`` (or, ``min_chips``, on the fewest that fit)
    with ``strategy`` (a name of ``sim.strategies.NAMES``, or ``"all"``)."""
    if not isinstance(npu, NpuConfig):
        raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
    if not isinstance(model, ModelConfig):
        raise TypeError(f"model must be a ModelConfig, not {model!r}")
    if (chips is None) == (not min_chips):
        raise BadInput("give either --chips N or --min-chips")
    if chips is not None and (not isinstance(chips, int) or chips < 1):
        raise BadInput(f"--chips {chips} must be a positive integer")
    if chips is not None and npu.topology is not None and npu.topology.chips != chips:
        raise BadInput(f"--chips {chips} is not the {npu.topology.chips} chips of the "
                       f"topology {npu.topology}")
    names = _names(strategy)
    start = time.perf_counter()
    timer = _Timer(npu)
    timer.exact_budget = exact_chip_cycles
    out = []
    for name in names:
        smallest = timer.smallest(model, name)
        if min_chips:
            # Nothing fits: plan it on the largest system the ring builds, to say why.
            at = smallest[0] if smallest else min(MAX_CHIPS, _search_limit(npu, model, name))
            grid = smallest[1] if smallest else None
        else:
            at, grid = chips, None
        out.append(_evaluate(timer, npu, model, name, at, grid,
                             smallest[0] if smallest else None))
    return PlanReport(npu, model, out, time.perf_counter() - start)


def plan_chip_counts(npu: NpuConfig, model: ModelConfig, counts, *, strategy: str = "all",
                     exact_chip_cycles: int = EXACT_CHIP_CYCLES) -> list[PlanReport]:
    """:func:`plan` on each chip count of ``counts`` (each 2-D grid on the torus of its
    shape, :func:`torus_of`), sharing one timer: the programs, layouts and the fewest chips
    that fit are found once for all the counts, and only the plans that fit are timed (the
    others' ``predicted_cycles`` are None, a note says why). The grid compiler's strategies
    lay out each distinct share once (:func:`_representatives`) and list every chip; the
    others (hidden, sequence: a share per chip) lay out and list the chips where a share
    changes, the first and the last (``per_chip_bytes(..., only="cuts")``)."""
    if not isinstance(npu, NpuConfig):
        raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
    if not isinstance(model, ModelConfig):
        raise TypeError(f"model must be a ModelConfig, not {model!r}")
    counts = list(counts)
    for chips in counts:
        if not isinstance(chips, int) or isinstance(chips, bool) or not 1 <= chips <= MAX_CHIPS:
            raise BadInput(f"chip count {chips!r} must be 1..{MAX_CHIPS} (a system's chips, "
                           "hw.spec.topology.MAX_CHIPS)")
    if npu.topology is not None:
        raise BadInput("planning every chip count needs an NPU without a [topology]: each "
                       "count is a ring, each grid a torus of its shape")
    names = _names(strategy)
    timer = _Timer(npu)
    timer.exact_budget = exact_chip_cycles
    out = []
    for chips in counts:
        start = time.perf_counter()
        plans = []
        for name in names:
            smallest = timer.smallest(model, name)
            only = None if isinstance(get_strategy(name), GridStrategy) else "cuts"
            plans.append(_evaluate(timer, npu, model, name, chips, None,
                                   smallest[0] if smallest else None, only,
                                   time_unfit=False))
        out.append(PlanReport(npu, model, plans, time.perf_counter() - start))
    return out


@dataclass
class LongestContext:
    """The longest ``seq_len`` one strategy fits on ``chips`` chips (0: not even one token),
    and the limits the next token breaks (``beyond``)."""

    strategy: str
    chips: int
    grid: str | None
    tokens: int
    beyond: list[Reason]

    def to_json(self) -> dict:
        return {"strategy": self.strategy, "chips": self.chips, "grid": self.grid,
                "tokens": self.tokens, "beyond": [str(r) for r in self.beyond]}


def longest_context(npu: NpuConfig, model: ModelConfig, chips: int, *,
                    strategy: str = "all") -> list[LongestContext]:
    """Per strategy, the longest ``seq_len`` of ``model`` that fits ``chips`` chips of ``npu``:
    every check the strategy's compiler makes (``max_seq_len``, the K/V ring and the passes
    over key chunks that lift it, 16-bit positions) and every chip's bytes against
    ``sram_bytes``, by doubling and bisection up to ``2**16`` tokens (a chip's share only
    grows with the sequence); a grid strategy on its best A x B grid of ``chips``."""
    if not isinstance(chips, int) or not 1 <= chips <= MAX_CHIPS:
        raise BadInput(f"--chips {chips!r} must be 1..{MAX_CHIPS}")
    top = 1 << POS_BITS
    out = []
    for name in _names(strategy):
        grids = _grids(chips, name) if name in GRIDS else [None]
        best = None
        for grid in grids:

            def beyond(tokens, grid=grid, name=name):
                cfg = dataclasses.replace(model, seq_len=tokens)
                _, reasons = _bytes_and_reasons(npu, cfg, name, chips, grid, only="cuts")
                return reasons

            # Sequence parallelism needs a token per chip: its shortest sequence is chips.
            first = chips if name == "sequence" else 1
            if beyond(first):
                found = LongestContext(name, chips, _grid_text(grid), 0, beyond(first))
            else:
                lo, hi = first, 2 * first
                while hi < top and not beyond(hi):
                    lo, hi = hi, min(top, 2 * hi)
                if not beyond(hi):
                    lo = hi
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if not beyond(mid) else (lo, mid)
                found = LongestContext(name, chips, _grid_text(grid), lo,
                                       beyond(lo + 1) if lo < top else [])
            if best is None or found.tokens > best.tokens:
                best = found
        if best is None:
            best = LongestContext(name, chips, None, 0, [Reason(
                "chips", chips, 4, f"chips={chips} makes no A x B grid with A, B >= 2")])
        out.append(best)
    return out


def _names(strategy):
    """The strategies ``strategy`` names (``all``: every planned one)."""
    planned = tuple(n for n in NAMES if REGISTRY[n].planned != "no")
    names = planned if strategy == "all" else (strategy,)
    for name in names:
        if name not in REGISTRY:
            raise BadInput(f"strategy {name!r} is not one of all, {', '.join(NAMES)}")
        if REGISTRY[name].planned == "no":
            raise BadInput(f"--strategy {name} is not planned yet (the planner plans "
                           f"{', '.join(planned)}); simulate it with npu sim")
    return names


def _grids(chips, name=None, topology=None):
    """The A x B grids of ``chips`` chips, both sides at least 2 (a side of 1 is the plain
    strategy of the other side); on a given torus only the one placed on it
    (:func:`torus_of`)."""
    grids = [(a, chips // a) for a in range(2, chips // 2 + 1) if chips % a == 0]
    if topology is not None and topology.is_torus:
        grids = [g for g in grids if torus_of(name, g) == topology.dims]
    return grids


def _search_limit(npu, cfg, name) -> int:
    """The most chips a strategy can use: a head, a layer, a sample, a word, a token each."""
    return min(MAX_SEARCH, get_strategy(name).search_limit(cfg, npu))


def _fits_per_chip(npu, cfg, name, chips, grid) -> bool:
    """Every per-chip limit holds (the ring's chip count aside). Chips with the same share
    are checked once."""
    _, reasons = _bytes_and_reasons(npu, cfg, name, chips, grid, only="cuts")
    return not [r for r in reasons if r.key != "chips"]


def _smallest(npu, cfg, name):
    """The fewest chips (and grid) on which ``name`` fits every per-chip limit; chips beyond
    the ring's are counted (the plan then names the ring's limit). None if none does.

    A one-dimensional split is searched by doubling and bisection (a chip's share only
    shrinks with more chips; the few counts below the bisection's answer are checked too, for
    the padding's small steps); a grid by trying every chip count and factorisation."""
    top = _search_limit(npu, cfg, name)
    if name in GRIDS:
        for chips in range(1, top + 1):
            for grid in _grids(chips):
                if _fits_per_chip(npu, cfg, name, chips, grid):
                    return chips, grid
        return None

    def fits(chips):
        return _fits_per_chip(npu, cfg, name, chips, None)

    if top <= 64:
        return next(((c, None) for c in range(1, top + 1) if fits(c)), None)
    hi = 1
    while hi < top and not fits(hi):
        hi = min(top, 2 * hi)
    if not fits(hi):
        return None
    lo = hi // 2                     # does not fit (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    for chips in range(max(1, hi - 8), hi):
        if fits(chips):
            return chips, None
    return hi, None


def _evaluate(timer, npu, cfg, name, chips, grid, smallest, only=None,
              time_unfit=True) -> StrategyPlan:
    """One strategy's plan on ``chips`` (a grid strategy: its best grid). ``time_unfit``:
    also time a plan that does not fit (what it would take); without, its cycles are None."""
    if name in GRIDS and grid is None:
        grids = _grids(chips, name, npu.topology)
        if not grids:
            if npu.topology is not None and npu.topology.is_torus:
                reason = Reason("topology", str(npu.topology), None,
                                f"topology {npu.topology} places no {name} grid (its head "
                                "groups or pipelines along the rows: A x B = "
                                f"{'X x Y' if name == 'head+pipeline' else 'Y x X'})")
            else:
                reason = Reason("chips", chips, 4, f"chips={chips} makes no A x B grid with "
                                                   "A, B >= 2 (use the one-dimensional "
                                                   "strategies)")
            return StrategyPlan(name, None, chips, False, [reason], [], 0, 0, None, None,
                                None, smallest, [], None)
        options = [_evaluate(timer, npu, cfg, name, chips, g, smallest, only, time_unfit)
                   for g in grids]
        fitting = [p for p in options if p.fits] or options

        def key(p):
            return p.latency_ms if p.latency_ms is not None else math.inf
        return min(fitting, key=key)
    per_chip, reasons = _bytes_and_reasons(npu, cfg, name, chips, grid, only=only)
    comm, colls, notes = get_strategy(name).comm(npu, cfg, chips, grid)
    torus = None
    if name in GRIDS:
        x, y = torus_of(name, grid)
        torus = f"{x}x{y}"
        (l0, l1), (rows, cols) = dim_links(npu), _ROWS[name]
        notes.append(f"placed on the {torus} torus: its rows (dimension 0: "
                     f"{l0.bytes_per_cycle} B/cycle, {l0.latency_cycles} cycles) hold {rows}, "
                     f"its columns (dimension 1: {l1.bytes_per_cycle} B/cycle, "
                     f"{l1.latency_cycles} cycles) {cols}")
    if reasons and not time_unfit:
        cycles, how, more = None, None, ["not timed: it does not fit (npu plan --chips "
                                         f"{chips} times it)"]
    else:
        cycles, how, more = _cycles(timer, npu, cfg, name, chips, grid, reasons)
    notes += more
    if cycles is not None and cycles < 0:
        cycles = None
    if how == "analytic" and name == "hidden":
        notes.insert(0, "analytic: no hidden program for this ring (or fewer words of d_model "
                        "than chips); one chip's program timed and split, the collectives "
                        "added from the ring's cost")
    elif how == "analytic" and name not in COMPILED:
        notes.insert(0, f"analytic: {name}'s own programs are not timed by the planner yet "
                        "(its layout is its compiler's); cycles estimated from the 1-D "
                        "strategies' timed programs")
    program = [n for n in more if n.startswith("program of")]
    if program:
        reasons.append(Reason("imem_words", program[0], npu.imem_words,
                              f"{program[0]} exceed imem_words={npu.imem_words:,}"))
        notes.remove(program[0])
    latency = None if cycles is None else cycles / (npu.clock_mhz * 1e3)
    tokens = None if not latency else cfg.batch * cfg.seq_len / (latency / 1e3)
    return StrategyPlan(
        strategy=name, grid=None if grid is None else f"{grid[0]}x{grid[1]}", chips=chips,
        fits=not reasons, reasons=reasons, per_chip=per_chip, comm_bytes_per_layer=comm,
        collectives_per_layer=colls, predicted_cycles=cycles, latency_ms=latency,
        tokens_per_s=tokens, min_chips=smallest, notes=notes,
        timing=how, topology=torus)


def _compatible(npu, cfg, tokens, name=None):
    """The attention of a chip running ``tokens`` tokens can be scheduled (by strategy
    ``name``: the grid strategies run full attention beyond the ring in passes)."""
    passes = name is not None and get_strategy(name).long_passes
    try:
        plan_schedule(seq=tokens, window=cfg.window, causal=cfg.causal, ring=npu.attn_window,
                      passes=passes)
    except ValueError:
        return False
    return True


def ring_buildable(npu: NpuConfig) -> bool:
    """The chip's ring port exists (the configuration's own build rule,
    :meth:`hw.spec.NpuConfig.ring_port_error`), so COLL, SEND and RECV can be encoded."""
    return npu.ring_port_buildable


def _cycles(timer, npu, cfg, name, chips, grid, reasons):
    """(cycles, how, notes); cycles None when no program can be written for the plan."""
    b = cfg.batch
    ring_ok = chips <= MAX_CHIPS and (chips == 1 or ring_buildable(npu))
    notes = []
    if chips > 1 and not ring_buildable(npu):
        notes.append(f"the collective engine's word of {word_bytes(npu.link_bytes_per_cycle)} "
                     f"B is not whole scratchpad words of {npu.array_size} B: no chip of this "
                     "NPU can be built with a ring port, so no multi-chip program can be "
                     "written; communication is costed from the ring's closed forms")
    try:
        if name == "hidden" and (not ring_ok or chips > MAX_CHIPS or
                                 pad_to(cfg.d_model, npu.array_size) // npu.array_size < chips):
            # No program for this ring (or fewer words of d_model than chips): analytic.
            if not _compatible(npu, cfg, cfg.seq_len):
                return None, None, notes
            return _analytic(timer, npu, cfg, name, chips, grid, notes)
        if name in COMPILED:
            if not ring_ok or any(r.key in ("n_heads", "n_layers", "chips") for r in reasons):
                return _scaled(timer, npu, cfg, name, chips, notes)
            if not _compatible(npu, cfg, cfg.seq_len, name):
                return None, None, notes
            cycles, how, size, more = _compiled_cycles(timer, npu, cfg, name, chips, b)
            if size > npu.imem_words:
                more.append(f"program of {size:,} instructions")
            return cycles, how, more
        if not _compatible(npu, cfg, min(cfg.seq_len, npu.attn_window) if name == "sequence"
                           else cfg.seq_len):
            return None, None, notes
        return _analytic(timer, npu, cfg, name, chips, grid, notes)
    except (ValueError, ConfigError) as exc:
        notes.append(f"not timed: {exc}")
        return None, None, notes


def _ring_attention_cycles(npu, cfg, chunk, chips) -> int:
    """Ring attention's attention beyond a chip's own chunk, per layer and sample, on the
    busiest chip (causal: the last; bidirectional: every one): each head merges the other
    ``chips - 1`` chunks into each of its query runs of at most ``attn_window`` rows, a
    launch per key chunk of at most ``attn_window`` (``sim.compiler.sequence``), each as
    long as ``launch_cycles`` of a middle state launch says; the transfers run beside them."""
    ring = npu.attn_window
    run, keys = min(chunk, ring), min(chunk, ring)
    rw = -(-cfg.d_head // npu.array_size)          # a head's words (heads at lane 0)
    launch = al_.state_launch(
        mode="middle", size=npu.array_size, d_head=cfg.d_head, queries=run, keys=keys,
        q_base=0, q_row_words=rw, col=0, k_base=0, v_base=0, k_row_words=rw, v_row_words=rw,
        k_col=0, v_col=0, s_base=0, score_mult=1, score_shift=1, out_mult=1, out_shift=1)
    one = attn_timing.launch_cycles(launch.regs, window=ring, length=npu.softmax_len,
                                    size=npu.array_size, d_head=npu.d_head_max,
                                    pipeline=npu.attention_pipeline)
    launches = math.ceil(chunk / ring) * (chips - 1) * math.ceil(chunk / ring)
    return cfg.n_heads * launches * one


def _scaled(timer, npu, cfg, name, chips, notes, link=None):
    """A compiled strategy beyond what can be compiled (more chips than the ring or than the
    split allows): its per-chip work from one chip's share, analytically; ``link``: the
    ring's links (default :func:`ring_link`)."""
    npu = dataclasses.replace(npu, topology=None)       # the share runs on one chip
    if name == "head" and chips <= cfg.n_heads:
        heads = max(1, cfg.n_heads // chips)
        share = dataclasses.replace(cfg, n_heads=heads, d_model=heads * cfg.d_head,
                                    n_kv_heads=math.gcd(heads, max(1, heads // cfg.kv_group)),
                                    d_ff=max(1, math.ceil(cfg.d_ff / chips)))
        cycles, how, notes2 = _one_chip_layers(timer, npu, share)
        comm = _ring_cycles(npu, cfg, chips, 2 * cfg.n_layers, link)
        notes.append("analytic: no program for this ring; one chip's share of the heads and "
                     "FFN columns timed as a smaller model, the all-reduces added from the "
                     "ring's cost")
        return cycles + comm, "analytic", notes + notes2
    if name == "pipeline" and chips <= cfg.n_layers:
        per = math.ceil(cfg.n_layers / chips)
        stage = dataclasses.replace(cfg, n_layers=per)
        cycles, how, notes2 = _one_chip_layers(timer, npu, stage)
        m = min(cfg.batch, chips)
        notes.append("analytic: no program for this ring; one stage timed and the "
                     "pipeline's m + p - 1 stage times counted")
        return round(cycles * (m + chips - 1) / m), "analytic", notes + notes2
    return None, None, notes


def _one_chip_layers(timer, npu, cfg):
    """One chip's cycles for ``cfg`` from its program on 1 and 2 layers, extended along its
    layers (every layer's program is the same): a share's timing whatever its layer count,
    so that the grids of every chip count share a few timed programs."""
    if cfg.n_layers <= 2:
        return _analytic_from(timer, npu, cfg, "single", 1)
    (c1, how, n1), (c2, _, _) = (_analytic_from(timer, npu, dataclasses.replace(
        cfg, n_layers=k), "single", 1) for k in (1, 2))
    notes = [n for n in n1 if not n.startswith("timed on")]
    notes.append(f"timed on 1 and 2 layers, extended to {cfg.n_layers}")
    return c1 + (c2 - c1) * (cfg.n_layers - 1), how, notes


def _analytic_from(timer, npu, cfg, strategy, chips, samples=None):
    samples = cfg.batch if samples is None else samples
    cycles, how, _size, notes = _compiled_cycles(timer, npu, cfg, strategy, chips, samples)
    return cycles, how, notes


def _ring_cycles(npu, cfg, chips, count, link=None):
    """``count`` all-reduces of the residual's int32 partial sums on ``chips`` chips of a ring
    with links ``link`` (default :func:`ring_link`)."""
    n = npu.array_size
    link = link or ring_link(npu)
    msg = cfg.batch * pad_to(cfg.seq_len, n) * pad_to(cfg.d_model, n) * 4
    return count * ring_bound_cycles("all_reduce", msg, chips, link.bytes_per_cycle,
                                     link.latency_cycles)


def _analytic(timer, npu, cfg, name, chips, grid, notes):
    b = cfg.batch
    if name == "data":
        per = -(-b // chips) or 1
        cycles, _, more = _analytic_from(timer, npu, cfg, "single", 1, per)
        return cycles, "analytic", notes + more
    if name in ("data+head", "data+pipeline"):
        a, bb = grid
        per = max(1, -(-b // a))
        inner = name.split("+")[1]
        if (inner == "head" and bb > cfg.n_heads) or (inner == "pipeline" and bb > cfg.n_layers):
            return None, None, notes
        row = dim_links(npu)[0]          # the inner part on a row of the torus
        if bb > MAX_CHIPS or not ring_buildable(npu):
            inner_cfg = dataclasses.replace(cfg, batch=per)
            cycles, how, more = _scaled(timer, npu, inner_cfg, inner, bb, [], row)
            return cycles, "analytic", notes + more
        cycles, _, more = _analytic_from(timer, _row_npu(npu, bb, row),
                                         dataclasses.replace(cfg, batch=per), inner, bb, per)
        return cycles, "analytic", notes + more
    if name == "head+pipeline":
        a, bb = grid
        per = math.ceil(cfg.n_layers / bb)
        if a > cfg.n_heads or bb > cfg.n_layers:
            return None, None, notes
        stage = dataclasses.replace(cfg, n_layers=per)
        m = min(b, bb)
        mb = max(1, math.ceil(b / m))
        # Each stage's head group on a row's ring, the sends one hop along a column.
        row, col = dim_links(npu)
        if a <= MAX_CHIPS and ring_buildable(npu):
            t_stage, _, more = _analytic_from(timer, _row_npu(npu, a, row),
                                              dataclasses.replace(stage, batch=mb), "head", a,
                                              mb)
        else:
            t_stage, _, more = _scaled(timer, npu, dataclasses.replace(stage, batch=mb), "head",
                                       a, [], row)
        send = math.ceil(mb * pad_to(cfg.seq_len, npu.array_size) *
                         pad_to(cfg.d_model, npu.array_size) * 2 / col.bytes_per_cycle)
        cycles = (m + bb - 1) * t_stage + (bb - 1) * (send + col.latency_cycles)
        return cycles, "analytic", notes + more
    if name == "hidden":
        one, _, more = _analytic_from(timer, npu, cfg, "single", 1)
        link, lat = npu.link_bytes_per_cycle, npu.link_latency_cycles
        per_layer = 0
        if chips > 1:
            for kind, msg in get_strategy("hidden").collectives(npu, cfg):
                per_layer += ring_bound_cycles(kind, msg, chips, link, lat)
        cycles = math.ceil(one / chips) + cfg.n_layers * per_layer
        return cycles, "analytic", notes + more
    if name == "sequence":
        chunk = math.ceil(cfg.seq_len / chips)
        model = dataclasses.replace(cfg, seq_len=chunk, window=min(cfg.window, chunk))
        cycles, _, more = _analytic_from(timer, npu, model, "single", 1)
        kv = b * max(cfg.window - 1, 0) * 2 * cfg.d_model
        cycles += cfg.n_layers * (math.ceil(kv / npu.link_bytes_per_cycle) +
                                  npu.link_latency_cycles) if chips > 1 else 0
        if not cfg.window and chips > 1:
            extra = _ring_attention_cycles(npu, cfg, chunk, chips)
            cycles += cfg.n_layers * b * extra
            notes = notes + [f"ring attention: {extra:,} cycles a layer on the busiest chip "
                             f"for the other chunks' merged launches (the transfers behind "
                             f"them)"]
        return cycles, "analytic", notes + more
    return None, None, notes
