"""``hidden``: d_model split over the chips, cutting across heads (``sim.compiler.hidden``):
LayerNorm from partial statistics, split heads' partial scores and the projections'
partial sums reduced over the ring."""

from __future__ import annotations

import dataclasses
import math

from ..compiler.blocks import pad_to
from ..compiler.hidden import check_hidden, compile_hidden, hidden_stats
from .base import Split, Strategy, register
from .roles import Role, part

__all__ = ["HIDDEN"]


class Hidden(Strategy, name="hidden",
             splits="d_model columns, cutting across heads (uneven allowed)",
             relieves="d_head and d_model wider than the datapath", parts=("hidden",),
             quants=("int8",), options=frozenset({"reduce"})):
    def check(self, npu, cfg, chips):
        check_hidden(npu, cfg, chips)

    def split(self, chips, grid=None):
        return Split(shards=chips)

    def _compile(self, npu, qm, chips, *, seq, samples, microbatches, grid, reduce):
        return compile_hidden(npu, qm, chips, seq=seq, samples=samples,
                              reduce=reduce or "reduce_scatter")

    def compile_shapes(self, npu, qm, chips, *, samples, microbatches=None, grid=None,
                       only=None):
        """On datapaths as wide as the model: the planner names the shards' width limits."""
        if grid is not None or microbatches is not None:
            raise ValueError("hidden takes no grid and no microbatches")
        cfg = qm.cfg
        wide = max(npu.d_head_max, npu.d_model_max, cfg.d_model, cfg.d_head)
        return compile_hidden(dataclasses.replace(npu, d_head_max=wide, d_model_max=wide), qm,
                              chips, seq=cfg.seq_len, samples=samples, contents=False,
                              check=False)

    def sections(self, prog, comms, res, spans) -> dict:
        return {"hidden": hidden_stats(prog, comms)}

    def comm(self, npu, cfg, chips, grid=None):
        if chips <= 1:
            return 0, 0, []
        rows = cfg.batch * pad_to(cfg.seq_len, npu.array_size)
        d, f, h = cfg.d_model, cfg.d_ff, cfg.n_heads
        msgs = [rows * 16, rows * 3 * d * 4, rows * cfg.seq_len * h * 4, rows * d * 4,
                rows * 16, rows * f * 4, rows * d * 4]
        kinds = [2, 1, 2, 1, 2, 1, 1]      # all-reduce sends twice a reduce-scatter's share
        sent = sum(k * (chips - 1) * m // chips for k, m in zip(kinds, msgs, strict=True))
        return sent, len(msgs), [
            "hidden: 7 collectives per layer: LayerNorm statistics (2), Q.K partial scores "
            "per head, and reduce-scatters of the QKV, O, FFN1 and FFN2 partial sums"]

    def roles(self, npu, cfg, chips, grid, picks):
        n, share, tied = npu.array_size, 1.0 / chips, cfg.tie_embeddings
        words = pad_to(cfg.d_model, n) // n
        return [Role(c, cfg.n_layers, cfg.n_heads, max(1, math.ceil(cfg.d_head / chips)),
                     max(1, part(words, chips, c)) * n, max(1, part(cfg.d_ff, chips, c)),
                     chips, cfg.seq_len, (cfg.batch,), share, 0.0 if tied else share, True,
                     hidden=True) for c in picks]

    slices_widths = True

    def share_limits(self, npu, cfg, chips, tokens):
        n = npu.array_size
        words = pad_to(cfg.d_model, n) // n
        if words >= chips:
            return []
        return [("d_model", cfg.d_model, chips * n,
                 f"d_model={cfg.d_model} is {words} words of {n}: fewer than the {chips} "
                 "chips splitting it (a word each)")]

    def search_limit(self, cfg, npu) -> int:
        return pad_to(cfg.d_model, npu.array_size) // npu.array_size   # a word per chip


HIDDEN = register(Hidden())
