"""Head (tensor) parallelism (``--strategy head``): every layer split across the chips.

Chip c holds the Q, K and V columns of its heads and the matching rows of Wo, and its share of
the FFN columns (of W1, and the rows of W2), Megatron-style. Heads and FFN columns are split
like ``numpy.array_split`` (4 heads on 3 chips: 2, 1, 1). Every chip runs every block on the
whole (replicated) residual: LayerNorms and residual adds are computed on each chip alike;
the O and FFN2 projections give int32 partial sums that an all-reduce SUM over all chips adds
before they are requantised per channel (``sim.compiler.blocks``). A grid of one stage and
one replica (``sim.compiler.grid``).
"""

from __future__ import annotations

from hw.spec import NpuConfig

from .grid import Grid, compile_grid, head_shards
from .program import SystemProgram
from .quantize import QModel

__all__ = ["head_shards", "compile_head"]


def compile_head(npu: NpuConfig, qm: QModel, chips: int, *, seq: int | None = None,
                 samples: int = 1) -> SystemProgram:
    """Programs for ``chips`` chips that split every layer of ``qm`` by heads."""
    return compile_grid(npu, qm, Grid(shards=chips), strategy="head", seq=seq,
                        samples=samples)
