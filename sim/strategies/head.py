"""``head``: attention heads and FFN columns split over the chips (Megatron-style tensor
parallelism); the partial O and FFN2 sums reduced in the group (``sim.compiler.blocks``)."""

from __future__ import annotations

from ..compiler.blocks import pad_to
from .base import register
from .grid import GridStrategy
from .roles import whole

__all__ = ["HEAD"]


class Head(GridStrategy, name="head",
           splits="attention heads and FFN columns (uneven allowed: 4 heads on 3 chips = 2, 1, 1)",
           relieves="weight capacity", parts=("head",)):
    def part_comm(self, npu, cfg, split, samples):
        group = split.shards
        if group <= 1:
            return 0, 0, []
        rows = samples * pad_to(cfg.seq_len, npu.array_size)
        d_pad = pad_to(cfg.d_model, npu.array_size)
        msg = rows * d_pad * 4
        if rows % group == 0:
            # The group splits the row-wise work (sim.compiler.blocks: row_split): reduce-
            # scatters of the int32 O and FFN2 partial sums, all-gathers of the two int8
            # LayerNorm outputs; each sends (N-1)/N of its message from each chip.
            return 2 * (group - 1) * (msg + rows * d_pad) // group, 4, []
        # Two all-reduce SUMs of the partial sums; a ring all-reduce sends 2 (N-1)/N.
        return 2 * 2 * (group - 1) * msg // group, 2, []

    def roles(self, npu, cfg, chips, grid, picks):
        return [whole(cfg, c, 1.0 / chips) for c in picks]

    def search_limit(self, cfg, npu) -> int:
        return cfg.n_heads                    # a head per chip


HEAD = register(Head())
