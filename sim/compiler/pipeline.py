"""Pipeline parallelism (``--strategy pipeline``): the layers split across the chips, in stages.

Stage s runs on chip s and holds its layers' weights (layers split like ``numpy.array_split``:
4 layers on 3 chips = 2, 1, 1). The batch is split into ``microbatches`` (likewise uneven)
that flow through the stages in a static GPipe schedule: stage s receives microbatch m from
stage s - 1 (``RECV``), runs its layers on it, and sends it to stage s + 1 (``SEND``). Only the
two neighbours take part in a transfer, so the stages overlap: while stage s computes m, it
already receives m + 1 (posted as soon as m has arrived) and stage s + 1 computes m - 1. A grid
of one replica and one shard per stage (``sim.compiler.grid``, which also gives the bubble).
"""

from __future__ import annotations

from hw.spec import NpuConfig

from .grid import Grid, compile_grid, split_batch, stage_layers
from .program import SystemProgram
from .quantize import QModel

__all__ = ["stage_layers", "split_batch", "compile_pipeline"]


def compile_pipeline(npu: NpuConfig, qm: QModel, chips: int, *, seq: int | None = None,
                     samples: int = 1, microbatches: int | None = None) -> SystemProgram:
    """Programs for ``chips`` pipeline stages over ``samples`` sequences in ``microbatches``
    (default ``min(samples, chips)``)."""
    return compile_grid(npu, qm, Grid(stages=chips), strategy="pipeline", seq=seq,
                        samples=samples, microbatches=microbatches)
