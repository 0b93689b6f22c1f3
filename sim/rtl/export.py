"""``npu export`` as a function: the Verilog of one top-level design, with its configuration.

The file starts with a comment that names the top, the chip count and every field of the NPU
configuration it was built for, so that a Verilog file says what it is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import verilog

from hw.spec import NpuConfig
from hw.tops import TOPS, build_top

from ..errors import BadInput

__all__ = ["Exported", "export_verilog", "verilog_text"]


@dataclass(frozen=True)
class Exported:
    """One written Verilog file."""

    top: str
    npu: NpuConfig
    chips: int
    path: Path
    lines: int


def _header(top: str, npu: NpuConfig, chips: int) -> str:
    fields = [f"{f.name} = {getattr(npu, f.name)!r}" for f in dataclasses.fields(npu)
              if f.name not in ("path", "description")]
    lines = [f"npu-scale: top {top!r} ({TOPS[top].description}), {chips} chip(s)",
             f"NPU configuration {npu.name!r}" + (f" from {npu.path}" if npu.path else ""),
             *fields]
    return "".join(f"// {line}\n" for line in lines)


def verilog_text(top: str, npu: NpuConfig, *, chips: int | None = None) -> tuple[str, int]:
    """``(verilog, chips)`` of ``top`` built for ``npu``; the module is ``npu_<top>``."""
    if top not in TOPS:
        raise BadInput(f"unknown --top {top!r}; choose from {', '.join(TOPS)}")
    chips = TOPS[top].default_chips if chips is None else chips
    try:
        design = build_top(top, npu, chips)
    except (NotImplementedError, ValueError, TypeError) as exc:
        raise BadInput(str(exc)) from None
    return _header(top, npu, chips) + verilog.convert(design, name=f"npu_{top}"), chips


def export_verilog(top: str, npu: NpuConfig, out_dir: str | Path, *,
                   chips: int | None = None) -> Exported:
    """Write ``out_dir/npu_<top>.v``; :class:`~sim.errors.BadInput` for an unknown top, a bad
    chip count or a directory that cannot be written."""
    text, chips = verilog_text(top, npu, chips=chips)
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create output directory {out_dir}: {exc.strerror}") from None
    path = out_dir / f"npu_{top}.v"
    try:
        path.write_text(text)
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror}") from None
    return Exported(top=top, npu=npu, chips=chips, path=path, lines=text.count("\n"))
