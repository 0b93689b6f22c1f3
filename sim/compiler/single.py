"""The whole model on one chip (``--strategy single``): every block's weights, one program.

A grid of one chip (``sim.compiler.grid``); the block program and its padding are
``sim.compiler.blocks``'s. A batch of samples runs as one program whose tensors hold every
sample's rows.
"""

from __future__ import annotations

from hw.spec import NpuConfig

from .compat import check_single_chip
from .grid import Grid, compile_grid
from .program import SystemProgram
from .quantize import QModel

__all__ = ["check_single_chip", "compile_single"]


def compile_single(npu: NpuConfig, qm: QModel, *, seq: int | None = None,
                   samples: int = 1) -> SystemProgram:
    """Memory image and program that run every block of ``qm`` on one chip, for ``samples``
    sequences of ``seq`` tokens (default ``seq_len``)."""
    return compile_grid(npu, qm, Grid(), strategy="single", seq=seq, samples=samples)
