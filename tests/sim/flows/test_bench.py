"""The benchmark harness (sim.flows.bench): table formatting, module selection."""

import pytest

from sim.errors import BadInput
from sim.flows.bench import format_table, run_benchmarks


def test_table_has_every_row_and_ratio():
    rows = [{"bench": "a", "value": 1.23456, "unit": "x", "ref": 2, "ratio": 0.61728},
            {"bench": "b", "value": 7, "note": "n"}]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["bench", "value", "unit", "ref", "ratio", "note"]
    assert lines[2].split() == ["a", "1.235", "x", "2", "0.6173"]
    assert lines[3].split() == ["b", "7", "n"]


def test_unknown_benchmark_is_refused():
    with pytest.raises(BadInput, match=r"unknown benchmark 'nosuch'; choose from .*matmul"):
        run_benchmarks(only=["nosuch"])
