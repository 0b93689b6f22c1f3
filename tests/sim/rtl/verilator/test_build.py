"""sim.rtl.verilator.build: one build per hardware configuration (whatever the chip count),
cached outside the clone, safe when several processes want it at once; the generated wrapper
and port bindings."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pytest

from hw.spec import npu_preset
from sim.compiler.assembler import Assembler
from sim.rtl.verilator import build
from sim.rtl.verilator.build import (
    MODEL,
    builds_made,
    config_key,
    ensure_build,
    ports_header,
    top_ports,
    wrapper,
)
from sim.rtl.verilator.runner import run_system_verilator
from tests.helpers import ROOT
from tests.sim.rtl.verilator.test_runner import SMALL, compiled

MINI = """// a header comment
module npu_node(clk, rst, host__imem__payload, done, link_stall);
  input clk;
  input rst;
  input [75:0] host__imem__payload;
  output done;
  input [1:0] link_stall;
endmodule
"""


def test_top_ports_and_the_wrapper():
    assert top_ports(MINI) == {"clk": ("input", 1), "rst": ("input", 1),
                               "host__imem__payload": ("input", 76),
                               "done": ("output", 1), "link_stall": ("input", 2)}
    text = wrapper(MINI)
    assert text.startswith(f"module {MODEL}(clk, host__imem__payload, done, link_stall);")
    assert "  input [75:0] host__imem__payload;" in text and "input rst" not in text
    assert ".rst(1'b0)" in text and ".link_stall(link_stall)," in text


def test_ports_header_names_the_mangled_ports():
    """Verilator spells each "__" of a port's name "___05F"; payloads above 64 bits are
    VlWide (``.data()``). The header binds one node's ports and names no chip count."""
    npu = npu_preset("tiny")
    wide = {"host__imem__payload": 76, "host__wr__payload": 46, "ring__tx__payload": 73}
    lines = ["module npu_node(" + ");"]
    lines += [f"  input [{wide.get(name, 1) - 1}:0] {name};"
              for name in build.NODE_PORTS.values()]
    lines += [f"  output busy_cycles__{k};" for k in range(8)]
    header = ports_header(npu, "\n".join(lines + ["endmodule"]))
    assert "NPU_CHIPS" not in header and "#define NPU_WORD_BYTES 4" in header
    assert "#define NPU_IMEM_DATA_OFF 12" in header and "#define NPU_WR_DATA_BITS 32" in header
    assert ("node->imem_payload = Port{t->host___05Fimem___05Fpayload.data(), 76};"
            in header)
    assert "node->wr_payload = Port{&t->host___05Fwr___05Fpayload, 46};" in header
    assert "node->tx_payload = Port{t->ring___05Ftx___05Fpayload.data(), 73};" in header
    assert "node->chip_id = Port{&t->chip_id, 1};" in header
    assert "node->busy_cycles[7] = Port{&t->busy_cycles___05F7, 1};" in header


def test_config_key_is_the_hardware():
    tiny = npu_preset("tiny")
    renamed = dataclasses.replace(tiny, name="other", description="the same hardware")
    assert config_key(renamed) == config_key(tiny)
    assert config_key(dataclasses.replace(tiny, link_latency_cycles=3)) != config_key(tiny)


def test_config_key_is_the_gateware_this_process_holds(monkeypatch):
    """The key hashes the gateware modules as they were loaded: the files edited on disk
    afterwards (a run that outlives an edit of hw/) must not give their key to the Verilog of
    the old modules in memory."""
    tiny = npu_preset("tiny")
    before = config_key(tiny)
    real = pathlib.Path.read_bytes
    monkeypatch.setattr(pathlib.Path, "read_bytes",
                        lambda self: real(self) + b"# edited" if "hw" in self.parts else real(self))
    assert build._gateware_digest() != build._GATEWARE   # the files on disk did change
    assert config_key(tiny) == before


def test_the_optimisation_level_is_its_own_build(monkeypatch):
    """``$NPU_SCALE_VERILATOR_OPT`` sets the per-cycle code's level, and names another build."""
    monkeypatch.delenv(build.OPT_ENV, raising=False)
    assert build.make_opt() == build.MAKE_OPT == ("OPT_FAST=-O3", "OPT_SLOW=-O1")
    default = build._build_name("0" * 16)
    monkeypatch.setenv(build.OPT_ENV, "1")
    assert build.make_opt() == ("OPT_FAST=-O1", "OPT_SLOW=-O1")
    assert build._build_name("0" * 16) != default
    monkeypatch.setenv(build.OPT_ENV, "fast")
    with pytest.raises(ValueError, match=r"NPU_SCALE_VERILATOR_OPT='fast' must be 0, 1, 2 or 3"):
        build.make_opt()


@pytest.mark.slow
@pytest.mark.verilator
def test_the_default_build_runs_what_the_suite_build_runs(verilator_ok, rng, monkeypatch):
    """The suite builds at -O1 (tests/conftest.py); the default -O3 build of one chip gives the
    same integers, cycles, busy counters and traces."""
    npu, prog, images, _ = compiled(rng, "single", 1, cfg=dataclasses.replace(SMALL, n_layers=2))
    runs = []
    for level in ("1", "3"):
        monkeypatch.setenv(build.OPT_ENV, level)
        runs.append(run_system_verilator(npu, [prog.chips[0].program], images, prog.reads()))
        runs[-1]["binary"] = ensure_build(npu).binary
    quick, default = runs
    assert quick["binary"] != default["binary"]
    for key in ("cycles", "chip_cycles", "busy_cycles", "errors", "traces"):
        assert quick[key] == default[key], key
    assert all((a == b).all() for a, b in zip(quick["regions"][0], default["regions"][0],
                                              strict=True))


@pytest.mark.verilator
def test_other_weights_do_not_rebuild(verilator_ok, rng):
    """A second run with other weights and inputs takes the cached executable: no new build,
    the executable untouched."""
    npu, prog, images, _ = compiled(rng, "single", 1, cfg=SMALL)
    first = run_system_verilator(npu, [prog.chips[0].program], images, prog.reads())
    build = ensure_build(npu)
    made, mtime = len(builds_made()), build.binary.stat().st_mtime_ns
    npu, prog, images, _ = compiled(rng, "single", 1, cfg=SMALL)
    second = run_system_verilator(npu, [prog.chips[0].program], images, prog.reads())
    assert second["build_cached"], "the second run rebuilt"
    assert len(builds_made()) == made and build.binary.stat().st_mtime_ns == mtime
    assert second["build_s"] < 1.0, f"a cached build took {second['build_s']:.2f} s"
    assert first["regions"][0][0].shape == second["regions"][0][0].shape


@pytest.mark.verilator
def test_one_build_runs_every_chip_count(verilator_ok):
    """Rings of 1, 2, 3, 5 and 8 chips run on one build: none of them builds again."""
    npu = npu_preset("tiny")
    halt = Assembler()
    halt.halt()
    run_system_verilator(npu, [halt.words()], [{}], [[]], max_cycles=100)
    made = len(builds_made())
    for chips in (2, 3, 5, 8):
        out = run_system_verilator(npu, [halt.words()] * chips, [{}] * chips, [[]] * chips,
                                   max_cycles=100)
        assert out["build_cached"] and len(out["chip_cycles"]) == chips
        assert out["chip_cycles"] == [out["cycles"]] * chips
    assert len(builds_made()) == made


BUILD_ONE = """
import json, sys, time
from sim.rtl.verilator import build
from tests.helpers import small_npu
if sys.argv[1] == "stub":
    def compile_stub(work, text, header):
        time.sleep(2.0)     # the other process reaches the lock meanwhile
        (work / "harness").write_text("a stand-in for the executable")
    build._compile = compile_stub
b = build.ensure_build(small_npu())
print(json.dumps({"cached": b.cached, "binary": str(b.binary), "build_s": b.build_s}))
"""


@pytest.mark.verilator
@pytest.mark.parametrize("compiler", ["stub", pytest.param("verilator", marks=pytest.mark.slow)])
def test_two_processes_build_a_new_configuration_once(verilator_ok, tmp_path, compiler):
    """Two processes want the same configuration, new to an empty cache, at once: both get the
    executable, one build happens (the other waits on the lock and finds it).

    ``stub``: the real export, lock, index, rename and build log around a compile step that
    only waits and writes a stand-in executable (the real compile of a cold configuration,
    about 50 s, is the slow suite's ``verilator`` case; the cached one is
    test_other_weights_do_not_rebuild's)."""
    env = {**os.environ, "NPU_SCALE_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_ONE, compiler], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["cached"] for r in results) == [False, True]
    assert results[0]["binary"] == results[1]["binary"]
    made = [json.loads(line) for line in (tmp_path / "fast" / "builds.log").read_text()
            .splitlines()]
    assert len(made) == 1, made
    leftovers = [p.name for p in (tmp_path / "fast").iterdir() if p.name.startswith("tmp-")]
    assert leftovers == []
    print(f"cold build of small_npu x 1 ({compiler}): {made[0]['build_s']} s")
