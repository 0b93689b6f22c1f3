"""Result rows on disk (sim.sweep.results): typed columns, nulls, keys that survive the trip."""

import pytest

from sim.errors import BadInput
from sim.sweep import read_rows, write_rows
from sim.sweep.results import columns, row_key
from sim.sweep.runner import METRICS

PARAMS = {"npu": "tiny", "model": "tiny", "strategy": "head", "chips": 2, "grid": None,
          "backend": "iss", "seed": 0, "batch": None}


def _row(**values):
    return {**PARAMS, **METRICS, "status": "ok", **values}


def test_rows_round_trip_with_their_types_and_keys(tmp_path):
    rows = [_row(link_bytes_per_cycle=4, clock_mhz=100, fits=True, cycles=1234,
                 latency_ms=0.01234, golden_match=True, sram_bytes_max=100),
            _row(link_bytes_per_cycle=8, clock_mhz=125.5, strategy="data", status="invalid",
                 fits=False, error="does not divide"),
            _row(chips=4, grid="2x2", strategy="data+head", batch=2)]   # no overrides
    paths = write_rows(rows, tmp_path)
    back = read_rows(tmp_path)
    assert [row_key(r) for r in back] == [row_key(r) for r in rows]
    assert back[0]["cycles"] == 1234 and isinstance(back[0]["cycles"], int)
    assert back[0]["clock_mhz"] == 100.0 and back[1]["clock_mhz"] == 125.5
    assert back[2]["link_bytes_per_cycle"] is None and back[2]["grid"] == "2x2"
    assert back[1]["fits"] is False and back[1]["cycles"] is None
    assert columns(rows) == list(back[0])
    assert list(back[0])[8:10] == ["link_bytes_per_cycle", "clock_mhz"]
    csv = paths["csv"].read_text().splitlines()
    assert len(csv) == 4 and csv[0].startswith('"npu","model","strategy","chips"')
    assert not list(tmp_path.glob(".*.part"))


def test_an_absent_override_is_part_of_the_key():
    assert row_key(_row()) != row_key(_row(link_bytes_per_cycle=4))
    assert row_key(_row(link_bytes_per_cycle=None)) == row_key(_row())


def test_no_results_and_foreign_files(tmp_path):
    assert read_rows(tmp_path / "empty") == []
    (tmp_path / "results.parquet").write_text("not parquet")
    with pytest.raises(BadInput, match="not a sweep's results"):
        read_rows(tmp_path)
