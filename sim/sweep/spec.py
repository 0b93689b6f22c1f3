"""The sweep specification (``npu sweep SPEC.toml``): its keys, their checks, its points.

A spec is a flat TOML table whose values are a value or a list of values, plus an optional
``[npu_overrides]`` table of NPU-config keys with a value or a list each. Every list is an axis;
the points are the cross product of all axes (``docs/sweep.md``)::

    npu = ["constraints/npu/tiny.toml"]
    model = ["constraints/models/tiny.toml"]
    strategy = ["head", "pipeline", "data"]
    chips = [1, 2, 4]
    backend = "iss"
    [npu_overrides]
    link_bytes_per_cycle = [4, 8]

A 2-D strategy (``head+pipeline``, ``data+head``, ``data+pipeline``) at N chips runs on every
``A x B`` grid of N chips with A, B >= 2, or on those of the ``grid`` key that have N chips.

:func:`load_spec` refuses a bad spec before any work with :class:`~sim.errors.BadInput`, one line
``key=value problem (SPEC)``: an unknown key, an empty list, a value of the wrong type, an unknown
strategy or backend, a missing NPU or model file, and an override the NPU config's own checks
refuse (``hw.spec.load_npu``), for every NPU file it is applied to.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hw.spec import PRESETS_DIR, ConfigError, ModelConfig, NpuConfig, load_model, load_npu

from ..errors import BadInput
from ..strategies import GRIDS, NAMES, parse_grid
from . import runner
from .runner import BACKENDS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["BACKENDS", "AXES", "SweepSpec", "Point", "load_spec", "parse_spec",
           "OVERRIDABLE"]

#: The parameters of a point, in the order of the result columns (then one per override).
AXES = ("npu", "model", "strategy", "chips", "grid", "backend", "seed", "batch")
#: The NPU-config keys an override may set (all but the free-text ones).
OVERRIDABLE = tuple(f.name for f in dataclasses.fields(NpuConfig)
                    if f.name not in ("name", "description", "path"))

_REQUIRED = ("npu", "model", "strategy", "chips")
_DEFAULTS = {"backend": "iss", "seed": 0, "batch": None, "grid": None, "max_cycles": None}
_KEYS = (*_REQUIRED, "backend", "seed", "batch", "grid", "max_cycles", "npu_overrides")


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its parameters (``params``, what the results are keyed by) and
    the configurations it runs (the NPU with its overrides applied, the model with its batch).
    """

    params: dict[str, Any]
    npu: NpuConfig
    model: ModelConfig
    max_cycles: int | None = None

    @property
    def key(self) -> tuple:
        return point_key(self.params)


def point_key(params: dict[str, Any]) -> tuple:
    """The key a point's results are found by: its parameters, overrides sorted by name
    (an absent override and a null one are the same)."""
    fixed = tuple(params.get(a) for a in AXES)
    extra = tuple(sorted((k, v) for k, v in params.items() if k not in AXES and v is not None))
    return fixed + extra


@dataclass(frozen=True)
class SweepSpec:
    """A checked spec: every axis as a tuple of values, the overrides' axes by key."""

    path: str
    npu: tuple[str, ...]
    model: tuple[str, ...]
    strategy: tuple[str, ...]
    chips: tuple[int, ...]
    backend: tuple[str, ...] = ("iss",)
    seed: tuple[int, ...] = (0,)
    batch: tuple[int | None, ...] = (None,)
    grid: tuple[str, ...] | None = None
    max_cycles: int | None = None
    overrides: dict[str, tuple] = field(default_factory=dict)
    #: The loaded configurations: NPU by (file, overrides), model by file.
    npus: dict = field(default_factory=dict, repr=False, compare=False)
    models: dict = field(default_factory=dict, repr=False, compare=False)

    def override_combinations(self) -> list[dict[str, Any]]:
        keys = list(self.overrides)
        return [dict(zip(keys, values, strict=True))
                for values in itertools.product(*(self.overrides[k] for k in keys))]

    def points(self) -> list[Point]:
        """Every point, in the spec's order (NPU, model, overrides, strategy, chips, ...)."""
        out = []
        combos = self.override_combinations()
        for npu, model, combo in itertools.product(self.npu, self.model, combos):
            hw = self.npus[(npu, _frozen(combo))]
            for strategy, chips, backend, seed, batch in itertools.product(
                    self.strategy, self.chips, self.backend, self.seed, self.batch):
                cfg = self.models[model]
                if batch is not None:
                    cfg = dataclasses.replace(cfg, batch=batch)
                for grid in self._grids(strategy, chips, backend):
                    params = {"npu": npu, "model": model, "strategy": strategy, "chips": chips,
                              "grid": grid, "backend": backend, "seed": seed, "batch": batch,
                              **combo}
                    out.append(Point(params, hw, cfg, self.max_cycles))
        return out

    def _grids(self, strategy, chips, backend) -> list[str | None]:
        """The grids a strategy runs on at ``chips`` chips: None for a 1-D strategy and for the
        planner (which picks the best grid itself); else every A x B (or those of ``grid``).
        A 2-D strategy without a grid of that many chips keeps one point (it will not fit)."""
        if strategy not in GRIDS or backend == "plan":
            return [None]
        if self.grid is not None:
            grids = [g for g in self.grid if _grid_chips(g) == chips]
        else:
            grids = [f"{a}x{chips // a}" for a in range(2, chips // 2 + 1) if chips % a == 0]
        return grids or [None]


def _grid_chips(text: str) -> int:
    a, b = parse_grid(text)
    return a * b


def _frozen(combo: dict) -> tuple:
    return tuple(sorted(combo.items()))


def _error(path, key, value, problem) -> BadInput:
    return BadInput(f"{key}={value!r} {problem} ({path})")


def _values(path, key, raw) -> list:
    """A key's value as a list: a list stays (it must not be empty), a value becomes one."""
    if isinstance(raw, dict):
        raise _error(path, key, raw, "is a table, expected a value or a list of values")
    if isinstance(raw, list):
        if not raw:
            raise _error(path, key, raw, "is an empty list: give at least one value")
        if len({repr(v) for v in raw}) != len(raw):
            raise _error(path, key, raw, "repeats a value")
        return raw
    return [raw]


def _typed(path, key, values, types, name, check=None, problem=""):
    for v in values:
        if isinstance(v, bool) and bool not in types or not isinstance(v, types):
            raise _error(path, key, v, f"has type {type(v).__name__}, expected {name}")
        if check is not None and not check(v):
            raise _error(path, key, v, problem)
    return tuple(values)


def _resolve(path: Path, kind: str, value: str) -> Path:
    """A config file named in the spec: a path (from the current directory, else from the
    spec's directory) or a preset name (``tiny``: ``constraints/<kind>/tiny.toml``)."""
    candidate = Path(value)
    if candidate.is_absolute() or candidate.exists():
        return candidate
    beside = path.parent / candidate
    if beside.exists():
        return beside
    preset = PRESETS_DIR / kind / f"{value}.toml"
    if "/" not in value and not value.endswith(".toml") and preset.exists():
        return preset
    return candidate


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check the spec at ``path``; :class:`~sim.errors.BadInput` for any problem."""
    path = Path(path)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise BadInput(f"{path}: file not found") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, expected a TOML file") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot be read: {exc.strerror}") from None
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"{path}: bad TOML: {exc}") from None
    return parse_spec(data, path)


def parse_spec(data: dict, path: str | Path = "<spec>") -> SweepSpec:
    """Check a spec already parsed from TOML (``path`` names it in messages) and load every
    NPU and model file it names."""
    path = Path(path)
    unknown = [k for k in data if k not in _KEYS]
    if unknown:
        raise _error(path, unknown[0], data[unknown[0]],
                     f"is an unknown key; known keys are {', '.join(_KEYS)}")
    for key in _REQUIRED:
        if key not in data:
            raise BadInput(f"missing required key {key!r} ({path})")
    get = {k: _values(path, k, data[k]) for k in data if k not in ("npu_overrides",
                                                                 "max_cycles")}
    text = (str,)
    npu = _typed(path, "npu", get["npu"], text, "str (a file or a preset name)")
    model = _typed(path, "model", get["model"], text, "str (a file or a preset name)")
    strategy = _typed(path, "strategy", get["strategy"], text, "str",
                      lambda v: v in NAMES, f"is not one of {', '.join(NAMES)}")
    chips = _typed(path, "chips", get["chips"], (int,), "int", lambda v: v >= 1,
                   "must be at least 1")
    backend = _typed(path, "backend", get.get("backend", ["iss"]), text, "str",
                     lambda v: v in BACKENDS, f"is not one of {', '.join(BACKENDS)}")
    seed = _typed(path, "seed", get.get("seed", [0]), (int,), "int", lambda v: v >= 0,
                  "must be at least 0")
    batch = (None,) if "batch" not in get else _typed(
        path, "batch", get["batch"], (int,), "int", lambda v: v >= 1, "must be at least 1")
    grid = None
    if "grid" in get:
        grid = _typed(path, "grid", get["grid"], text, "str (AxB)", _is_grid,
                      "is not AxB with A, B >= 1 (e.g. 2x2)")
    max_cycles = data.get("max_cycles")
    if max_cycles is not None:
        _typed(path, "max_cycles", [max_cycles], (int,), "int", lambda v: v >= 1,
               "must be at least 1")
    if "plan" in backend and runner.planner is None:
        raise _error(path, "backend", "plan", "needs the planner (npu plan), which this "
                     "version does not have yet")
    overrides = _overrides(path, data.get("npu_overrides", {}))
    spec = SweepSpec(path=str(path), npu=npu, model=model, strategy=strategy, chips=chips,
                     backend=backend, seed=seed, batch=batch, grid=grid, max_cycles=max_cycles,
                     overrides=overrides)
    _load_configs(spec, path)
    return spec


def _is_grid(text: str) -> bool:
    try:
        parse_grid(text)
    except ValueError:
        return False
    return True


def _overrides(path, table) -> dict[str, tuple]:
    if not isinstance(table, dict):
        raise _error(path, "npu_overrides", table, "is not a table ([npu_overrides])")
    out = {}
    for key, raw in table.items():
        if key not in OVERRIDABLE:
            raise _error(path, f"npu_overrides.{key}", raw,
                         f"is not an NPU-config key; overridable keys are "
                         f"{', '.join(OVERRIDABLE)}")
        out[key] = tuple(_values(path, f"npu_overrides.{key}", raw))
    return out


def _load_configs(spec: SweepSpec, path: Path) -> None:
    """Load every model, and every NPU file with every combination of overrides, so that a
    bad file or a bad override is refused before any point runs."""
    for name in spec.model:
        file = _resolve(path, "models", name)
        try:
            spec.models[name] = load_model(file)
        except ConfigError as exc:
            raise BadInput(f"model={name!r} in {path}: {exc}") from None
    for name in spec.npu:
        file = _resolve(path, "npu", name)
        try:
            load_npu(file)
        except ConfigError as exc:
            raise BadInput(f"npu={name!r} in {path}: {exc}") from None
        for combo in spec.override_combinations():
            try:
                spec.npus[(name, _frozen(combo))] = load_npu(file, combo)
            except ConfigError as exc:
                if exc.key in combo:
                    raise BadInput(f"npu_overrides.{exc.key}={exc.value!r} {exc.problem} "
                                   f"(applied to {file}; {path})") from None
                others = ", ".join(f"{k}={v!r}" for k, v in combo.items())
                raise BadInput(f"npu_overrides {others} on {file}: {exc.key}={exc.value!r} "
                               f"{exc.problem} ({path})") from None
