"""The planner on a torus and to 1,024 chips: grids placed on the torus of their shape, each
dimension's links charged, every chip count planned with one timer."""

import dataclasses
import time

import pytest

from hw.spec import ModelConfig, model_preset, npu_preset
from hw.spec.topology import DimLink, Topology
from sim.errors import BadInput
from sim.planner import plan as plan_module
from sim.planner.plan import per_chip_bytes, plan, plan_chip_counts, torus_of
from tests.helpers import TINY_MODEL, TINY_NPU, assert_one_line_error, run

TINY = npu_preset("tiny")
LPU = npu_preset("lpu-like")
LLAMA = model_preset("llama2-7b")
SMALL = ModelConfig(n_layers=5, d_model=20, n_heads=5, d_head=4, d_ff=36, seq_len=5, batch=5,
                    name="uneven")


def test_a_grid_is_placed_with_its_consecutive_axis_along_the_rows():
    assert torus_of("head+pipeline", (8, 4)) == (8, 4)      # head groups: rows of 8
    assert torus_of("data+head", (2, 8)) == (8, 2)          # head groups of 8 again
    assert torus_of("data+pipeline", (2, 8)) == (8, 2)      # 8-stage pipelines along rows


@pytest.mark.parametrize("strategy, chips, grid", [
    ("head+pipeline", 9, (3, 3)), ("head+pipeline", 8, (2, 4)), ("data+head", 6, (2, 3)),
    ("data+pipeline", 6, (3, 2)), ("head", 3, None), ("pipeline", 4, None), ("data", 3, None)])
def test_a_grid_laid_out_on_its_distinct_shares_is_every_chip_laid_out(monkeypatch, strategy,
                                                                      chips, grid):
    """Uneven splits (5 heads, layers, samples, rows): the representative layouts give each
    chip the bytes of its own layout."""
    fast = per_chip_bytes(TINY, SMALL, strategy, chips, grid)
    monkeypatch.setattr(plan_module, "_representatives",
                        lambda npu, cfg, strategy, chips, grid, picks: {c: c for c in picks})
    full = per_chip_bytes(TINY, SMALL, strategy, chips, grid)
    assert len(full) == chips
    for a, b in zip(fast, full, strict=True):
        assert a == b, f"{strategy} {grid} chip {b.chip}: {a} != {b}"


@pytest.mark.slow
def test_llama2_7b_fits_a_torus_on_lpu_like():
    """The fewest chips: head+pipeline 32x7 on the 32 x 7 torus (32x6 needs 232,898,560 bytes
    a chip of 230,686,720; heads packed, five 128-lane heads to two 320-lane words)."""
    report = plan(LPU, LLAMA, min_chips=True, strategy="head+pipeline")
    (p,) = report.strategies
    assert p.fits and p.chips == p.min_chips == 224 and p.grid == "32x7"
    assert p.topology == "32x7" and p.predicted_cycles > 0
    assert any("placed on the 32x7 torus: its rows (dimension 0: 64 B/cycle, 200 cycles) "
               "hold the head groups" in n for n in p.notes), p.notes
    assert report.best is p
    at = plan(dataclasses.replace(LPU, topology=Topology((32, 6))), LLAMA, chips=192,
              strategy="head+pipeline").strategies[0]
    assert at.grid == "32x6" and not at.fits
    assert any(r.key == "sram_bytes" for r in at.reasons)


def test_every_chip_count_shares_one_timer():
    reports = plan_chip_counts(LPU, LLAMA, [192, 224, 1024], strategy="head+pipeline")
    fits = [(r.strategies[0].chips, r.strategies[0].grid, r.strategies[0].fits)
            for r in reports]
    assert fits == [(192, fits[0][1], False), (224, "32x7", True), (1024, "32x32", True)]
    # Only the plans that fit are timed; one chip count's own plan times the others too.
    unfit, fit = reports[0].strategies[0], reports[1].strategies[0]
    assert unfit.predicted_cycles is None and fit.predicted_cycles > 0
    assert any(n.startswith("not timed: it does not fit (npu plan --chips 192")
               for n in unfit.notes)
    alone = plan(LPU, LLAMA, chips=192, strategy="head+pipeline").strategies[0]
    assert not alone.fits and alone.predicted_cycles > 0
    with pytest.raises(BadInput, match=r"chip count 1025 must be 1..1024"):
        plan_chip_counts(LPU, LLAMA, [1025])


@pytest.mark.slow
def test_all_chip_counts_up_to_1024():
    """Every count 1..1,024 is planned (the wall time is printed, not asserted: the bench
    measures speed)."""
    start = time.perf_counter()
    reports = plan_chip_counts(LPU, LLAMA, range(1, 1025))
    wall = time.perf_counter() - start
    fitting = [r.best.chips for r in reports if r.best]
    print(f"1..1024 chips, every strategy: {wall:.1f} s, {len(fitting)} counts fit")
    assert fitting and fitting[0] == 224


def test_each_dimension_is_charged_its_links():
    """head+pipeline 2x2 on the 2 x 2 torus: the sends go along a column, so a column link
    200 cycles deeper costs each of the stage boundaries 198 cycles more; the head groups'
    collectives run on the rows' links, so deeper rows cost more too."""
    cfg = dataclasses.replace(model_preset("tiny"), n_layers=2)
    base = DimLink(TINY.link_bytes_per_cycle, TINY.link_latency_cycles)
    deep = DimLink(TINY.link_bytes_per_cycle, TINY.link_latency_cycles + 198)

    def cycles(links):
        npu = dataclasses.replace(TINY, topology=Topology((2, 2), links))
        return plan(npu, cfg, chips=4, strategy="head+pipeline").strategies[0].predicted_cycles

    even = cycles(())
    assert cycles((base, base)) == even
    assert cycles((base, deep)) == even + 198 * (2 - 1)
    assert cycles((deep, base)) > even


def test_a_torus_places_only_its_grid():
    npu = dataclasses.replace(TINY, topology=Topology((2, 4)))
    cfg = dataclasses.replace(model_preset("tiny"), n_layers=4, batch=4)
    by = {name: plan(npu, cfg, chips=8, strategy=name).strategies[0]
          for name in ("head+pipeline", "data+head", "data+pipeline")}
    assert by["head+pipeline"].grid == "2x4"
    assert by["data+head"].grid == "4x2" and by["data+pipeline"].grid == "4x2"
    with pytest.raises(BadInput, match=r"--chips 4 is not the 8 chips of the topology 2x4"):
        plan(npu, cfg, chips=4)


def test_the_cli_plans_a_torus(capsys):
    status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                           "--topology", "2x2", "--strategy", "head+pipeline")
    assert status == 0, err
    assert "head+pipeline 2x2 on 4: placed on the 2x2 torus" in out, out
    assert_one_line_error(*run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                               "--topology", "2x2", "--min-chips"),
                          "--min-chips searches the chip counts itself")


def test_the_cli_plans_every_chip_count(capsys):
    status, out, err = run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                           "--up-to", "4", "--strategy", "head+pipeline")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0] == "npu plan: tiny on tiny, every chip count 1..4, strategy head+pipeline"
    assert "  4 chips: head+pipeline 2x2 on the 2x2 torus, " in out, out
    assert "fewest chips that fit: 4; fitting counts: 1" in out and "planned 4 chip counts" in out
    assert_one_line_error(*run(capsys, "plan", "--npu", TINY_NPU, "--model", TINY_MODEL,
                               "--up-to", "4", "--topology", "2x2"),
                          "--up-to plans each count on its own ring or torus")
