"""What every strategy is: its name, the axes it splits, what it compiles, what it refuses.

A :class:`Strategy` owns, for one way of spreading a model over chips, the decisions that the
simulator, the planner, the sweeps and the CLI would otherwise each make on its name: the chips
and grid it runs on (:meth:`Strategy.layout`), the checks a model must pass before it compiles
(:meth:`Strategy.check`), its compile (:meth:`Strategy.compile`), the quantisation schemes and
options it takes, the sections it adds to a report (:meth:`Strategy.sections`), the one-chip
program a run's speed-up is measured against (:meth:`Strategy.reference_program`), and the
planner's view of it (:meth:`Strategy.split`, :meth:`Strategy.search_limit`). The registry
(:mod:`sim.strategies`) lists one instance of each.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from hw.spec import QUANT_SCHEMES, ConfigError, ModelConfig, NpuConfig

from ..compiler.compat import Limit, Limits, check_ring_size, check_single_chip
from ..compiler.program import SystemProgram
from ..compiler.quantize import QModel
from .roles import Role, whole

__all__ = ["Strategy", "Split", "parse_grid", "REGISTRY", "register"]

#: Every strategy by name, in the order users see them (filled by :func:`register`).
REGISTRY: dict[str, Strategy] = {}

#: The options a strategy may take besides its chips (``Strategy.options``).
OPTIONS = ("microbatches", "grid", "reduce", "order")


def parse_grid(text: str, parts: int = 2) -> tuple[int, ...]:
    """``"2x3"`` -> ``(2, 3)`` (``parts`` 3: ``"2x2x4"`` -> ``(2, 2, 4)``); ValueError for
    anything else."""
    pattern = r"\s*[xX]\s*".join([r"(\d+)"] * parts)
    match = re.fullmatch(rf"\s*{pattern}\s*", text or "")
    shape = "x".join("ABC"[:parts])
    example = "x".join(["2"] * parts)
    if not match or any(int(g) < 1 for g in match.groups()):
        raise ValueError(f"--grid {text!r} is not {shape} with each side >= 1 (e.g. {example})")
    return tuple(int(g) for g in match.groups())


@dataclass(frozen=True)
class Split:
    """How many chips split each thing: heads (or, for hidden, d_model), layers, samples."""

    shards: int = 1
    stages: int = 1
    replicas: int = 1


class Strategy:
    """One strategy. Subclasses set the class attributes and override the hooks they need."""

    #: The name users type (``--strategy``).
    name: str = ""
    #: What it splits, one line (the CLI's help and the docs' tables).
    splits: str = ""
    #: The limits it relieves, one line.
    relieves: str = ""
    #: Its parts: the 1-D strategies of a grid (``("head", "pipeline")``), else ``(name,)``.
    parts: tuple[str, ...] = ()
    #: Quantisation schemes its compiler emits.
    quants: tuple[str, ...] = QUANT_SCHEMES
    #: Options besides ``chips`` it takes (of :data:`OPTIONS`).
    options: frozenset = frozenset()
    #: How the planner times it: ``"program"`` (its programs compiled from the shapes),
    #: ``"analytic"`` (from the built strategies' timed programs) or ``"no"`` (not planned:
    #: ``npu plan`` leaves it out).
    planned: str = "program"
    #: It runs on exactly one chip.
    one_chip: bool = False
    #: Its compiler runs full attention over more keys than the K/V ring holds in passes over
    #: key chunks (``sim.compiler.attention_launch.plan_schedule``).
    long_passes: bool = False

    def __init_subclass__(cls, **attributes):
        """``class Head(GridStrategy, name="head", parts=("head",), ...)``: a subclass sets the
        attributes above in its header (TypeError for a name that is not one of them)."""
        super().__init_subclass__()
        for key, value in attributes.items():
            if key.startswith("_") or not hasattr(Strategy, key) or callable(getattr(Strategy,
                                                                                   key)):
                raise TypeError(f"{key!r} is not a strategy attribute")
            setattr(cls, key, value)

    # --- what it runs on --------------------------------------------------------------------
    @property
    def is_grid(self) -> bool:
        """A 2-D strategy: ``--grid AxB`` gives its first part A chips, the second B."""
        return len(self.parts) > 1

    @property
    def pipelined(self) -> bool:
        return "microbatches" in self.options

    def chips_of(self, grid: str | None) -> int:
        """The chips a run takes when ``--chips`` is not given: A x B (x C) of the grid, else
        1."""
        if grid is None:
            return 1
        return math.prod(parse_grid(grid, max(2, len(self.parts))))

    def check_options(self, *, chips: int, microbatches=None, grid=None, reduce=None,
                      order=None):
        """ValueError for an option this strategy does not take, naming it."""
        if grid is not None and not self.is_grid:
            raise ValueError(f"--grid applies to {', '.join(_grid_names())}, not --strategy "
                             f"{self.name}")
        if microbatches is not None and "microbatches" not in self.options:
            raise ValueError("--microbatches applies to strategies with a pipeline")
        if reduce is not None and "reduce" not in self.options:
            raise ValueError("reduce applies to --strategy hidden")
        if order is not None and "order" not in self.options:
            raise ValueError(f"--order applies to --strategy sequence, not {self.name}")
        if self.one_chip and chips != 1:
            raise ValueError(f"--strategy {self.name} runs on one chip, not --chips {chips}")

    def check_quant(self, quant: str):
        """ValueError when the compiler emits no programs for ``quant`` under this strategy."""
        if quant not in self.quants:
            raise ValueError(f"--strategy {self.name} does not compile quant=\"{quant}\" yet "
                             f"(strategies that do: {', '.join(_quant_names(quant))}); use "
                             "--quant int8")

    def split(self, chips: int, grid: tuple[int, int] | None = None) -> Split:
        """The chips splitting heads, stages and replicas (the planner's counts)."""
        return Split()

    # --- compile ----------------------------------------------------------------------------
    def check(self, npu: NpuConfig, cfg: ModelConfig, chips: int, grid=None):
        """Refuse (ConfigError, ValueError) a model whose share a chip cannot run, before any
        work: the first of :meth:`limits`."""
        self.report_limits(npu, cfg, chips, grid, Limits())

    def limits(self, npu: NpuConfig, cfg: ModelConfig, chips: int, grid=None, *,
               samples: int | None = None) -> list[Limit]:
        """Every constraint :meth:`check` refuses ``cfg`` on ``chips`` chips for, in its
        order (the planner's reasons); ``samples``: the batch the run splits (the planner's
        ``cfg.batch``; a simulation's batch is checked when it compiles)."""
        found = Limits(collect=True)
        self.report_limits(npu, cfg, chips, grid, found, samples=samples)
        return found.found

    def report_limits(self, npu: NpuConfig, cfg: ModelConfig, chips: int, grid,
                      limits: Limits, *, samples: int | None = None):
        """Report each constraint broken to ``limits`` (:meth:`check` and :meth:`limits`
        share it): by default the chips a run takes, the ring's size, the scheme, and each
        chip running whole layers as one chip would."""
        if self.one_chip and chips != 1:
            limits.refuse(f"is not 1: --strategy {self.name} runs on one chip", key="chips",
                          value=chips, limit=1)
        check_ring_size(chips, limits)
        limits.run(self.check_quant, cfg.quant)
        check_single_chip(npu, cfg, limits, passes=self.long_passes)

    def compile(self, npu: NpuConfig, qm: QModel, chips: int, *, seq: int, samples: int,
                microbatches: int | None = None, grid: str | None = None,
                reduce: str | None = None, order: str | None = None) -> SystemProgram:
        """Programs for ``chips`` chips; ValueError for an option that does not apply,
        ConfigError for a model or chip that cannot run it. ``order``: sequence only, the
        tokens' order over the chips (``sim.compiler.sequence.ORDERS``)."""
        self.check_options(chips=chips, microbatches=microbatches, grid=grid, reduce=reduce,
                           order=order)
        self.check_quant(qm.quant)
        extra = {} if order is None else {"order": order}
        return self._compile(npu, qm, chips, seq=seq, samples=samples,
                             microbatches=microbatches, grid=grid, reduce=reduce, **extra)

    def _compile(self, npu, qm, chips, *, seq, samples, microbatches, grid, reduce):
        raise NotImplementedError

    def compile_shapes(self, npu: NpuConfig, qm: QModel, chips: int, *, samples: int,
                       microbatches: int | None = None, grid: str | None = None,
                       only: set[int] | None = None, emit: bool = True) -> SystemProgram:
        """The planner's compile: the programs and layouts :meth:`compile` gives, from the
        shapes alone (``qm`` without weights; its emitters place tensors without contents)
        and without the checks (the planner collects every violated limit itself);
        ``only``: just those chips' programs where the compiler can (the others None);
        ``emit=False``: the scratchpads' layout alone (the planner's capacity, on any
        number of chips and on chips without a ring port)."""
        raise NotImplementedError

    def reference_program(self, npu: NpuConfig, qm: QModel, *, seq: int,
                          samples: int) -> tuple[SystemProgram | None, str]:
        """The one-chip program a multi-chip run's speed-up is measured against, and how it
        was made (or None and why there is none)."""
        try:
            return REGISTRY["single"].compile(npu, qm, 1, seq=seq, samples=samples), ""
        except ConfigError as exc:
            return None, f"does not fit one chip: {exc}"

    # --- the report -------------------------------------------------------------------------
    def sections(self, prog: SystemProgram, comms: list[dict], res: dict,
                 spans: list | None) -> dict[str, dict]:
        """The report's sections of this strategy (``"pipeline"``, ``"sequence"``, ...),
        from the program, its collectives and what the run measured."""
        return {}

    # --- the planner ------------------------------------------------------------------------
    def comm(self, npu: NpuConfig, cfg: ModelConfig, chips: int,
             grid: tuple[int, int] | None = None) -> tuple[int, int, list[str]]:
        """Per layer: (bytes a chip sends, collectives, notes) of the planner's report."""
        return 0, 0, []

    def roles(self, npu: NpuConfig, cfg: ModelConfig, chips: int,
              grid: tuple[int, int] | None, picks) -> list[Role]:
        """The :class:`~sim.strategies.roles.Role` of each chip of ``picks``."""
        return [whole(cfg, c) for c in picks]

    def search_limit(self, cfg: ModelConfig, npu: NpuConfig) -> int:
        """The most chips it can use on ``cfg`` (a head, a layer, a sample ... each)."""
        return 1

    def __repr__(self):
        return f"<strategy {self.name}>"


def register(strategy: Strategy) -> Strategy:
    """Add ``strategy`` to :data:`REGISTRY` (once per name)."""
    if not strategy.name or strategy.name in REGISTRY:
        raise ValueError(f"strategy name {strategy.name!r} is empty or taken")
    REGISTRY[strategy.name] = strategy
    return strategy


def _grid_names() -> list[str]:
    return [s.name for s in REGISTRY.values() if s.is_grid]


def _quant_names(quant: str) -> list[str]:
    return [s.name for s in REGISTRY.values() if quant in s.quants]
