"""``data``: the whole model on every chip, the batch split over them; no communication."""

from __future__ import annotations

from .base import register
from .grid import GridStrategy
from .roles import whole

__all__ = ["DATA"]


class Data(GridStrategy, name="data", splits="batch samples (the whole model on every chip)",
           relieves="throughput only", parts=("data",)):
    def part_sections(self, prog, comms, res, spans) -> dict:
        grid = prog.meta["grid"]
        if grid["replicas"] <= 1:
            return {}
        return {"data": {"replicas": grid["replicas"],
                         "samples_per_replica": prog.meta["replica_samples"]}}

    def roles(self, npu, cfg, chips, grid, picks):
        return [whole(cfg, c) for c in picks]

    def search_limit(self, cfg, npu) -> int:
        return cfg.batch                      # a sample per chip


DATA = register(Data())
