"""The typed Python API of npu-scale: everything the ``npu`` command does, as functions.

The command line (:mod:`sim.cli`) and the benchmarks call these; so can a notebook::

    from sim.api import npu_preset, model_preset, simulate
    report = simulate(npu_preset("tiny"), model_preset("tiny"), backend="iss")
    report.golden_match, report.cycles, report.to_json()
    plan(npu_preset("lpu-like"), model_preset("llama2-7b"), min_chips=True).table()

Configurations are the frozen :class:`NpuConfig` / :class:`ModelConfig` (``load_npu`` and
``load_model`` read a TOML file, ``npu_preset`` / ``model_preset`` a shipped preset, and
``dataclasses.replace`` makes variants). Errors: :class:`BadInput`, :class:`Watchdog`,
:class:`ToolFailure` (``sim.errors``) and :class:`ConfigError`.
"""

from hw.spec import ConfigError, ModelConfig, NpuConfig
from hw.spec.config import load_model, load_npu, model_preset, npu_preset

from .errors import BadInput, NpuError, ToolFailure, Watchdog
from .flows.bench import run_benchmarks
from .flows.board import BoardDriver, SerialTransport, run_board
from .flows.collective import CollectiveReport, run_collective
from .flows.fpga import synthesize
from .flows.simulate import simulate
from .models.accuracy import LayerAccuracy, layer_accuracy
from .models.checkpoint import (
    ImportResult,
    Tokens,
    embed,
    import_checkpoint,
    load_import,
    logits,
    tokenize,
)
from .planner.plan import PlanReport, StrategyPlan, plan
from .report.core import ChipStats, SimReport
from .rtl.export import Exported, export_verilog
from .sweep import SweepResult, SweepSpec, load_spec, run_sweep

__all__ = [
    "NpuConfig", "ModelConfig", "ConfigError", "load_npu", "load_model", "npu_preset",
    "model_preset",
    "simulate", "SimReport", "ChipStats",
    "run_collective", "CollectiveReport",
    "plan", "PlanReport", "StrategyPlan",
    "export_verilog", "Exported",
    "synthesize",
    "run_board", "BoardDriver", "SerialTransport",
    "run_benchmarks",
    "load_spec", "run_sweep", "SweepSpec", "SweepResult",
    "import_checkpoint", "load_import", "ImportResult", "tokenize", "Tokens", "embed", "logits",
    "layer_accuracy", "LayerAccuracy",
    "NpuError", "BadInput", "Watchdog", "ToolFailure",
]
