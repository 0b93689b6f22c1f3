"""The benchmark harness: table formatting and the chip bench's config files."""

import dataclasses

from hw.spec import ModelConfig, load_model, load_npu, npu_preset
from sim.bench import format_table
from sim.benches.chip import _toml_file


def test_chip_bench_writes_configs_that_load_back(tmp_path):
    npu = dataclasses.replace(npu_preset("fpga"), sram_bytes=512 * 1024, name="fpga-512k")
    cfg = ModelConfig(n_layers=1, d_model=128, n_heads=2, d_head=64, d_ff=512, seq_len=32,
                      causal=False, name="d128")
    assert load_npu(_toml_file(tmp_path, npu)) == npu
    assert load_model(_toml_file(tmp_path, cfg)) == cfg


def test_table_has_every_row_and_ratio():
    rows = [{"bench": "a", "value": 1.23456, "unit": "x", "ref": 2, "ratio": 0.61728},
            {"bench": "b", "value": 7, "note": "n"}]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["bench", "value", "unit", "ref", "ratio", "note"]
    assert lines[2].split() == ["a", "1.235", "x", "2", "0.6173"]
    assert lines[3].split() == ["b", "7", "n"]
