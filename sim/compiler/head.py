"""Head (tensor) parallelism (``--strategy head``): every layer split across the chips.

Chip c holds the Q, K and V columns of its heads and the matching rows of Wo, and its share of
the FFN columns (of W1, and the rows of W2), Megatron-style. Heads and FFN columns are split
like ``numpy.array_split`` (4 heads on 3 chips: 2, 1, 1). Every chip runs every block on the
whole (replicated) residual: LayerNorms and residual adds are computed on each chip alike;
the O and FFN2 projections give int32 partial sums that an all-reduce SUM over all chips adds
before they are requantised per channel (``sim.compiler.blocks``). The result equals one
chip's integers bit for bit: int32 sums wrap modulo 2**32 in any order, and chip 0 alone adds
the biases.
"""

from __future__ import annotations

import numpy as np

from hw.spec import ConfigError, NpuConfig

from .alloc import Allocator
from .assembler import Assembler
from .blocks import BlockEmitter, Shard
from .program import ChipProgram, Placement, SystemProgram
from .quantize import QModel
from .single import check_single_chip, finish

__all__ = ["head_shards", "compile_head"]


def head_shards(cfg, chips: int) -> list[Shard]:
    """Each chip's heads and FFN columns (``numpy.array_split`` order); ConfigError when there
    are more chips than heads."""
    if chips > cfg.n_heads:
        raise ConfigError(f"is less than the {chips} chips: head parallelism needs a head per "
                          "chip", path=cfg.path, key="n_heads", value=cfg.n_heads)
    heads = np.array_split(np.arange(cfg.n_heads), chips)
    ffn = np.array_split(np.arange(cfg.d_ff), chips)
    group = (0, chips, chips) if chips > 1 else None
    return [Shard(tuple(int(h) for h in heads[c]), tuple(int(f) for f in ffn[c]), group,
                  bias=c == 0) for c in range(chips)]


def compile_head(npu: NpuConfig, qm: QModel, chips: int, *, seq: int | None = None,
                 samples: int = 1) -> SystemProgram:
    """Programs for ``chips`` chips that split every layer of ``qm`` by heads."""
    cfg = qm.cfg
    check_single_chip(npu, cfg)
    seq = cfg.seq_len if seq is None else seq
    shards = head_shards(cfg, chips)
    programs, comms = [], []
    inputs = [[] for _ in range(samples)]
    outputs = []
    for c, shard in enumerate(shards):
        al, asm = Allocator(npu), Assembler()
        em = BlockEmitter(npu, qm, asm, al, seq=seq, chip=c)
        weights = [em.place_layer(i, shard) for i in range(cfg.n_layers)]
        x = em.alloc_residual("x", samples)
        acts = em.alloc_activations(x.rows, shard)
        al.check_capacity()
        if cfg.norm == "post":
            em.requant_input(x, acts.x8, qm.in_mult, qm.in_shift)
        for i in range(cfg.n_layers):
            em.emit_block(i, weights[i], shard, acts, x, samples)
        programs.append(finish(npu, ChipProgram(c, asm, al, role={
            "layers": list(range(cfg.n_layers)), "heads": list(shard.heads),
            "ffn_columns": len(shard.ffn)})))
        for s in range(samples):
            place = Placement(c, x.base + s * em.seq_pad * x.row_words, em.seq_pad, x.cols,
                              x.row_words)
            inputs[s].append(place)       # every chip holds the whole residual
            if c == 0:
                outputs.append(place)
        if c == 0:
            comms = em.comms
    meta = {"heads_per_chip": [len(s.heads) for s in shards],
            "ffn_columns_per_chip": [len(s.ffn) for s in shards]}
    return SystemProgram(npu, cfg, "head", programs, seq, em.seq_pad, inputs, outputs, meta,
                         comms)
