"""The sweep's plots (sim.sweep.plots): the Pareto front, and three PNGs for any rows."""

from sim.sweep import pareto_front, write_plots
from sim.sweep.plots import PLOTS, series_label

PNG = b"\x89PNG\r\n\x1a\n"


def _row(strategy, chips, latency, total, fits=True, **more):
    return {"npu": "tiny", "model": "tiny", "strategy": strategy, "chips": chips, "grid": None,
            "backend": "pysim", "seed": 0, "batch": None, "fits": fits, "latency_ms": latency,
            "sram_bytes_total": total, "sram_bytes_max": None if total is None else
            total // chips, "sram_capacity": 65536, **more}


ROWS = [_row("single", 1, 10.0, 40_000), _row("head", 2, 6.0, 50_000),
        _row("head", 4, 4.0, 70_000), _row("pipeline", 2, 9.0, 45_000),
        _row("pipeline", 4, 8.0, 80_000),           # beaten by head x4 on both
        _row("data", 2, 1.0, 10, fits=False),      # does not fit: never on the front
        _row("data", 4, None, None, fits=False)]


def test_the_pareto_front_keeps_what_nothing_beats():
    front = pareto_front(ROWS)
    assert [(r["strategy"], r["chips"]) for r in front] == [
        ("single", 1), ("pipeline", 2), ("head", 2), ("head", 4)]
    assert pareto_front([]) == []


def test_series_name_the_parameters_that_vary():
    assert series_label(ROWS[1], []) == "head"
    assert series_label({**ROWS[1], "link_bytes_per_cycle": 8, "npu": "a/fast.toml"},
                        ["npu", "link_bytes_per_cycle"]) == "head (npu=fast, " \
                                                           "link_bytes_per_cycle=8)"


def test_three_pngs_for_timed_rows_and_for_rows_without_cycles(tmp_path):
    for name, rows in (("timed", ROWS), ("untimed", [_row("head", 2, None, 50_000)])):
        paths = write_plots(rows, tmp_path / name)
        assert {k: p.name for k, p in paths.items()} == PLOTS
        for path in paths.values():
            assert path.read_bytes()[:8] == PNG and path.stat().st_size > 5000
