"""Run a program on the exported chip under cocotb + Verilator (``npu sim --backend verilator``)."""

from __future__ import annotations

import numpy as np
from amaranth.back import verilog

from hw.spec import NpuConfig
from hw.tile.chip import Chip

from .verilator import run_cocotb

__all__ = ["run_chip_verilator"]


def run_chip_verilator(npu: NpuConfig, program: list[int], images: dict[int, np.ndarray],
                       reads: list[tuple[int, int]], *, max_cycles: int = 1_000_000) -> dict:
    """Same contract as :func:`sim.rtl.chip_runner.run_chip_pysim`, plus ``timeout``."""
    chip = Chip(npu=npu)
    text = verilog.convert(chip, name="npu_chip")
    bases = sorted(images)
    data = {
        "program": np.array(program, np.uint64),
        "image_bases": np.array(bases, np.int64),
        "image_sizes": np.array([len(images[b]) for b in bases], np.int64),
        "image_words": (np.concatenate([images[b] for b in bases]) if bases
                        else np.zeros((0, npu.word_bytes), np.uint8)),
        "reads": np.array(reads, np.int64).reshape(-1, 2),
        "word_bytes": npu.word_bytes,
        "imem_addr_bits": npu.imem_addr_bits,
        "addr_bits": npu.sram_addr_bits,
        "max_cycles": max_cycles,
    }
    out = run_cocotb(text, top="npu_chip", test_module="tb_chip", data=data,
                     timeout=3600.0)
    out["regions"] = [np.array(r, np.uint8).reshape(-1, npu.word_bytes) for r in out["regions"]]
    return out
