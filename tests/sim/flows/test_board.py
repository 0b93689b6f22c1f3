"""The board driver (sim.flows.board) end to end against the board top in Amaranth's simulator: the
driver that runs a real board talks, through the bit-level UART model of sim.rtl.uart_model,
to the board top's UART pins (4 clocks per bit), loads a program, runs it, reads it back."""

import dataclasses
import json

import numpy as np
import pytest

from hw.spec import PRESETS_DIR, model_preset, npu_preset
from hw.spec.collective import ReduceOp
from hw.spec.formats import OutMode
from hw.spec.isa import Op, decode
from hw.spec.memory import pack_params, pack_rows, pack_weight_blocks, unpack_rows
from sim import errors
from sim.compiler.assembler import Assembler
from sim.compiler.descriptors import emit_matmul, matmul_launch
from sim.compiler.quantize import quantize_model
from sim.flows.board import BoardDriver, avg_collectives, run_board
from sim.flows.simulate import simulate
from sim.golden.float_model import random_weights
from sim.golden.matmul import matmul_unit
from sim.rtl.chip_runner import run_chip_pysim
from sim.rtl.uart_model import SimTransport
from sim.rtl.verilator.board import VerilatorTransport
from sim.strategies import compile_program
from tests.helpers import TINY_MODEL, TINY_NPU, assert_one_line_error, run, seeded, small_npu


def _tiny_matmul(npu, rng):
    """C = requant8(A B + bias) for 4x4 operands: program, images, reads and the golden C."""
    n = npu.array_size
    a, b = rng.integers(-128, 128, (n, n)), rng.integers(-128, 128, (n, n))
    p = (rng.integers(-5000, 5000, n), rng.integers(1, 2**16, n), rng.integers(16, 22, n))
    images = {0: pack_rows(a, 1, n), 16: pack_weight_blocks(b, n), 64: pack_params(*p, n)}
    launch = matmul_launch(size=n, m=n, k=n, n=n, a_base=0, a_row_words=1, b_base=16,
                           p_base=64, c_base=200, c_row_words=1, mode=OutMode.INT8)
    asm = Assembler()
    emit_matmul(asm, launch)
    asm.halt()
    return asm.words(), images, [(200, n)], matmul_unit(a, b, *p, OutMode.INT8)


def test_driver_runs_a_matmul_on_the_simulated_board():
    npu = small_npu()
    program, images, reads, want = _tiny_matmul(npu, seeded(21))
    transport = SimTransport(npu, divisor=4)
    out = BoardDriver(transport).run_chip(npu, program, images, reads, max_cycles=10_000)
    got = unpack_rows(out["regions"][0], npu.array_size, npu.array_size, 1)
    assert (got == want).all(), f"board result\n{got}\ngolden\n{want}"
    assert not (np.abs(want) == 128).all(), "test data saturates everywhere"
    # The board's chip counts the cycles and busy cycles the bare chip does in pysim.
    ref = run_chip_pysim(npu, program, images, reads, max_cycles=10_000)
    assert (out["cycles"], out["busy_cycles"]) == (ref["cycles"], ref["busy_cycles"])
    assert out["trace"] == ref["trace"] and out["load_cycles"] == ref["load_cycles"]
    assert not out["error"]


@pytest.mark.slow
def test_verilated_board_runs_the_matmul_like_the_simulated_one():
    """The Verilated board top (sim.rtl.verilator.board) behind its C++ UART model: the same
    result, cycles, busy counters and trace as the bare chip (a build of its own: slow)."""
    npu = small_npu()
    program, images, reads, want = _tiny_matmul(npu, seeded(21))
    with VerilatorTransport(npu, divisor=4) as transport:
        out = BoardDriver(transport).run_chip(npu, program, images, reads, max_cycles=10_000)
    got = unpack_rows(out["regions"][0], npu.array_size, npu.array_size, 1)
    assert (got == want).all(), f"board result\n{got}\ngolden\n{want}"
    ref = run_chip_pysim(npu, program, images, reads, max_cycles=10_000)
    assert (out["cycles"], out["busy_cycles"]) == (ref["cycles"], ref["busy_cycles"])
    assert out["trace"] == ref["trace"] and out["load_cycles"] == ref["load_cycles"]


def test_a_board_built_for_another_npu_is_refused():
    transport = SimTransport(small_npu(), divisor=4)
    other = npu_preset("tiny")
    with pytest.raises(errors.BadInput, match=r"the board's bitstream has sram_words=1024, the "
                                              r"NPU 'tiny' needs 16384: rebuild it"):
        run_board(other, model_preset("tiny"), BoardDriver(transport))


def test_a_silent_board_is_bad_input():
    class Silent:
        def write(self, data):
            pass

        def read(self, n):
            raise errors.TransportTimeout("nothing within 2.0 s")

        def pause(self, bits):
            pass

    with pytest.raises(errors.BadInput, match=r"the board did not answer \(nothing within "
                                              r"2.0 s\): is the bitstream loaded"):
        run_board(npu_preset("tiny"), model_preset("tiny"), BoardDriver(Silent()))


def test_cli_refuses_a_missing_port(capsys):
    assert_one_line_error(*run(capsys, "board", "--port", "/dev/no-such-tty", "--npu",
                               TINY_NPU, "--model", TINY_MODEL),
                          "npu board: --port /dev/no-such-tty: cannot open at 1000000 baud")


def test_cli_needs_a_port_or_sim(capsys):
    assert_one_line_error(*run(capsys, "board", "--npu", TINY_NPU, "--model", TINY_MODEL),
                          "npu board: one of the arguments --port --sim is required")
    assert_one_line_error(*run(capsys, "board", "--sim", "--baud", "115200", "--npu", TINY_NPU,
                               "--model", TINY_MODEL),
                          "npu board: --baud 115200 is for a board (--port); --sim runs 4 "
                          "clocks per bit")


def test_cli_refuses_a_bad_timeout(capsys):
    assert_one_line_error(*run(capsys, "board", "--port", "x", "--npu", TINY_NPU, "--model",
                               TINY_MODEL, "--timeout", "0"),
                          "npu board: --timeout 0.0 must be positive")


@pytest.mark.slow
def test_run_board_matches_the_golden_model():
    """A one-layer model compiled, loaded over the simulated UART, run, read back and compared
    (~3,000 bytes over the UART: minutes of pysim)."""
    npu = dataclasses.replace(npu_preset("tiny"), sram_bytes=8192, imem_words=512)
    model = dataclasses.replace(model_preset("tiny"), n_layers=1, d_model=4, n_heads=1,
                                n_kv_heads=1, d_head=4, d_ff=4, seq_len=4)
    transport = SimTransport(npu, divisor=4)
    report = run_board(npu, model, BoardDriver(transport), seed=3)
    assert report.golden_match and report.backend == "board"
    ref = simulate(npu, model, backend="pysim", seed=3)
    assert report.cycles == ref.cycles


# --- AVG: the board's chip has no AVG divider (hw.fpga.board.COLL_AVG) --------------------------

def _coll_program(ops):
    """SET CO_OP for each op of ``ops`` (None: leave it), then a COLL; then HALT."""
    asm = Assembler(elide=False)
    for op in ops:
        if op is not None:
            asm.set("CO_OP", int(op))
        asm.launch(Op.COLL)
    asm.halt()
    return asm.words()


@pytest.mark.parametrize("ops, pcs", [
    ([ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN], []),
    ([None], []),                                        # CO_OP is 0 (SUM) after the reset
    ([ReduceOp.AVG], [1]),
    ([ReduceOp.SUM, ReduceOp.AVG, None, ReduceOp.MIN], [3, 4]),  # AVG stays set
])
def test_avg_collectives_follows_co_op(ops, pcs):
    assert avg_collectives(_coll_program(ops)) == pcs


def test_the_driver_refuses_a_coll_avg_before_touching_the_board():
    class Untouched:
        def write(self, data):
            raise AssertionError("the driver wrote to the board")

        read = pause = write

    program = _coll_program([ReduceOp.MAX, ReduceOp.AVG])
    with pytest.raises(errors.BadInput, match=r"the program runs a COLL AVG \(pc 3\): the "
                                              r"board's chip has no AVG divider"):
        BoardDriver(Untouched()).run_chip(small_npu(), program, {}, [])


@pytest.mark.parametrize("strategy, chips, grid", [("single", 1, None), ("head", 2, None),
                                                   ("data+head", 4, "2x2")])
def test_the_compiler_emits_no_avg(strategy, chips, grid):
    """What ``npu board`` runs (and the multi-chip strategies): all-reduces with SUM only."""
    model = model_preset("tiny")
    rng = seeded(5)
    x = rng.standard_normal((2, model.seq_len, model.d_model))
    qm = quantize_model(model, random_weights(model, 5), x)
    prog = compile_program(strategy, npu_preset("tiny"), qm, chips, seq=model.seq_len,
                           samples=2, grid=grid)
    colls = 0
    for chip, c in enumerate(prog.chips):
        assert avg_collectives(c.program) == [], f"{strategy}: chip {chip} runs AVG"
        colls += sum(1 for w in c.program if decode(w).op is Op.COLL)
    assert colls > 0 or chips == 1, f"{strategy}: no COLL at all, nothing was checked"


# --- the board preset (constraints/npu/ulx3s.toml: the chip `make fpga` builds) ----------------

def test_board_preset_runs_a_one_layer_model_bit_exact_on_the_iss():
    """The ULX3S preset's chip (a ring chip, one collective engine, the ring port kept) runs a
    one-layer model of the tiny shape: every output integer equals the golden model's."""
    npu = npu_preset("ulx3s")
    assert npu.chip_error() is None and npu.ring_port_buildable
    model = dataclasses.replace(model_preset("tiny"), n_layers=1)
    report = simulate(npu, model, backend="iss", seed=11)
    assert report.golden_match, report.first_mismatch
    assert report.cycles and report.cycles > 0 and report.chips == 1


@pytest.mark.slow
@pytest.mark.verilator
@pytest.mark.usefixtures("verilator_ok")
def test_board_preset_runs_a_one_layer_model_on_the_verilated_board(capsys, tmp_path):
    """``npu board --sim`` on the board preset: a one-layer model of the tiny shape compiled,
    loaded over the Verilated board's UART, run and read back, equal to the golden model, in
    the cycles the ISS's cycle model gives the bare chip (5 s warm; a cold board build takes
    minutes: slow)."""
    model = dataclasses.replace(model_preset("tiny"), n_layers=1)
    path = tmp_path / "one-layer.toml"
    text = (PRESETS_DIR / "models" / "tiny.toml").read_text()
    assert "n_layers = 4\n" in text
    path.write_text(text.replace("n_layers = 4\n", "n_layers = 1\n"))
    code, out, err = run(capsys, "board", "--sim", "--npu", "constraints/npu/ulx3s.toml",
                         "--model", str(path), "--seed", "11", "--json", str(tmp_path / "r.json"))
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["golden_match"] and report["backend"] == "board", report
    ref = simulate(npu_preset("ulx3s"), model, backend="iss", seed=11)
    assert report["cycles"] == ref.cycles, (report["cycles"], ref.cycles)
