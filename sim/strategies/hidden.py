"""``hidden``: d_model split over the chips, cutting across heads (``sim.compiler.hidden``):
LayerNorm from partial statistics, split heads' partial scores and the projections'
partial sums reduced over the ring."""

from __future__ import annotations

import dataclasses

from ..compiler.blocks import pad_to
from ..compiler.hidden import check_hidden, compile_hidden, hidden_stats
from .base import Split, Strategy, register
from .roles import whole

__all__ = ["HIDDEN"]


class Hidden(Strategy, name="hidden",
             splits="d_model columns, cutting across heads (uneven allowed)",
             relieves="d_head and d_model wider than the datapath", parts=("hidden",),
             quants=("int8",), options=frozenset({"reduce"})):
    def report_limits(self, npu, cfg, chips, grid, limits, *, samples=None):
        """The ring, the scheme, and each chip's slice of the widths (:func:`check_hidden`)."""
        limits.run(self.check_quant, cfg.quant)
        check_hidden(npu, cfg, chips, limits)

    def split(self, chips, grid=None):
        return Split(shards=chips)

    def _compile(self, npu, qm, chips, *, seq, samples, microbatches, grid, reduce):
        return compile_hidden(npu, qm, chips, seq=seq, samples=samples,
                              reduce=reduce or "reduce_scatter")

    def compile_shapes(self, npu, qm, chips, *, samples, microbatches=None, grid=None,
                       only=None, emit=True):
        """On datapaths as wide as the model: the planner names the shards' width limits."""
        if grid is not None or microbatches is not None:
            raise ValueError("hidden takes no grid and no microbatches")
        cfg = qm.cfg
        wide = max(npu.d_head_max, npu.d_model_max, cfg.d_model, cfg.d_head)
        return compile_hidden(dataclasses.replace(npu, d_head_max=wide, d_model_max=wide), qm,
                              chips, seq=cfg.seq_len, samples=samples, contents=False,
                              check=False, emit=emit)

    def sections(self, prog, comms, res, spans) -> dict:
        return {"hidden": hidden_stats(prog, comms)}

    def collectives(self, npu, cfg) -> list[tuple[str, int]]:
        """One layer's collectives, ``(kind, message bytes)`` in program order: the two
        LayerNorms' statistics (all-reduces), the Q.K partial scores of split heads
        (all-reduce) and the reduce-scatters of the QKV, O, FFN1 and FFN2 partial sums (a
        gated FFN: the gate's before FFN1's)."""
        rows = cfg.batch * pad_to(cfg.seq_len, npu.array_size)
        d, f, h = cfg.d_model, cfg.d_ff, cfg.n_heads
        # QKV: Q, K and V (n_kv_heads heads each), and under RoPE the rotated Q' and K'.
        qkv = d + 2 * cfg.d_kv + (d + cfg.d_kv if cfg.rope else 0)
        gate = [("reduce_scatter", rows * f * 4)] if cfg.ffn == "gated" else []
        return [("all_reduce", rows * 16), ("reduce_scatter", rows * qkv * 4),
                ("all_reduce", rows * cfg.seq_len * h * 4), ("reduce_scatter", rows * d * 4),
                ("all_reduce", rows * 16), *gate, ("reduce_scatter", rows * f * 4),
                ("reduce_scatter", rows * d * 4)]

    def comm(self, npu, cfg, chips, grid=None):
        if chips <= 1:
            return 0, 0, []
        colls = self.collectives(npu, cfg)
        # An all-reduce sends twice a reduce-scatter's share.
        sent = sum((2 if kind == "all_reduce" else 1) * (chips - 1) * msg // chips
                   for kind, msg in colls)
        return sent, len(colls), [
            f"hidden: {len(colls)} collectives per layer: LayerNorm statistics (2), Q.K "
            "partial scores per head, and reduce-scatters of the QKV, O, "
            f"{'gate, ' if cfg.ffn == 'gated' else ''}FFN1 and FFN2 partial sums"]

    def roles(self, npu, cfg, chips, grid, picks):
        return [whole(cfg, c, 1.0 / chips) for c in picks]

    def search_limit(self, cfg, npu) -> int:
        return pad_to(cfg.d_model, npu.array_size) // npu.array_size   # a word per chip


HIDDEN = register(Hidden())
