"""``head``: attention heads and FFN columns split over the chips (Megatron-style tensor
parallelism); the partial O and FFN2 sums reduced in the group (``sim.compiler.blocks``)."""

from __future__ import annotations

from .base import register
from .grid import GridStrategy

__all__ = ["HEAD"]


class Head(GridStrategy):
    name = "head"
    splits = "attention heads and FFN columns (uneven allowed: 4 heads on 3 chips = 2, 1, 1)"
    relieves = "weight capacity"
    parts = ("head",)

    def search_limit(self, cfg, npu) -> int:
        return cfg.n_heads                    # a head per chip


HEAD = register(Head())
