"""``hidden``: d_model split over the chips, cutting across heads (``sim.compiler.hidden``):
LayerNorm from partial statistics, split heads' partial scores and the projections'
partial sums reduced over the ring."""

from __future__ import annotations

from ..compiler.blocks import pad_to
from ..compiler.hidden import check_hidden, compile_hidden, hidden_stats
from .base import Split, Strategy, register

__all__ = ["HIDDEN"]


class Hidden(Strategy):
    name = "hidden"
    splits = "d_model columns, cutting across heads (uneven allowed)"
    relieves = "d_head and d_model wider than the datapath"
    parts = ("hidden",)
    quants = ("int8",)
    options = frozenset({"reduce"})

    def check(self, npu, cfg, chips):
        check_hidden(npu, cfg, chips)

    def split(self, chips, grid=None):
        return Split(shards=chips)

    def _compile(self, npu, qm, chips, *, seq, samples, microbatches, grid, reduce):
        return compile_hidden(npu, qm, chips, seq=seq, samples=samples,
                              reduce=reduce or "reduce_scatter")

    def sections(self, prog, comms, res, spans) -> dict:
        return {"hidden": hidden_stats(prog, comms)}

    def search_limit(self, cfg, npu) -> int:
        return pad_to(cfg.d_model, npu.array_size) // npu.array_size   # a word per chip


HIDDEN = register(Hidden())
