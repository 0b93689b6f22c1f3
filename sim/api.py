"""The typed Python API of npu-scale: everything the ``npu`` command does, as functions.

The command line (:mod:`sim.cli`) and the benchmarks call these; so can a notebook::

    from sim.api import npu_preset, model_preset, simulate
    report = simulate(npu_preset("tiny"), model_preset("tiny"), backend="iss")
    report.golden_match, report.to_json()

Configurations are the frozen :class:`NpuConfig` / :class:`ModelConfig` (``load_npu`` and
``load_model`` read a TOML file, ``npu_preset`` / ``model_preset`` a shipped preset, and
``dataclasses.replace`` makes variants). Errors: :class:`BadInput`, :class:`Watchdog`,
:class:`ToolFailure` (``sim.errors``) and :class:`ConfigError`.
"""

from hw.spec import (
    ConfigError,
    ModelConfig,
    NpuConfig,
    load_model,
    load_npu,
    model_preset,
    npu_preset,
)

from .bench import run_benchmarks
from .board import BoardDriver, SerialTransport, run_board
from .checkpoint import ImportResult, Tokens, embed, import_checkpoint, load_import, tokenize
from .collective import CollectiveReport, run_collective
from .errors import BadInput, NpuError, ToolFailure, Watchdog
from .export import Exported, export_verilog
from .fpga import synthesize
from .report import ChipStats, SimReport
from .simulate import simulate

__all__ = [
    "NpuConfig", "ModelConfig", "ConfigError", "load_npu", "load_model", "npu_preset",
    "model_preset",
    "simulate", "SimReport", "ChipStats",
    "run_collective", "CollectiveReport",
    "export_verilog", "Exported",
    "synthesize",
    "run_board", "BoardDriver", "SerialTransport",
    "run_benchmarks",
    "import_checkpoint", "load_import", "ImportResult", "tokenize", "Tokens", "embed",
    "NpuError", "BadInput", "Watchdog", "ToolFailure",
]
