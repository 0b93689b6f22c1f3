"""Pipeline parallelism (``--strategy pipeline``): the layers split across the chips, in stages.

Stage s runs on chip s and holds its layers' weights (layers split like ``numpy.array_split``:
4 layers on 3 chips = 2, 1, 1). The batch is split into ``microbatches`` (likewise uneven)
that flow through the stages in a static GPipe schedule: stage s receives microbatch m from
stage s - 1 (``RECV``), runs its layers on it, and sends it to stage s + 1 (``SEND``). Only the
two neighbours take part in a transfer, so the stages overlap: while stage s computes m, it
already receives m + 1 (posted as soon as m has arrived) and stage s + 1 computes m - 1. Each
stage keeps one residual buffer per microbatch, so no transfer waits for a buffer to be free.
With p stages and m microbatches of equal cost the pipeline is busy for ``m + p - 1`` stage
times of which each stage works ``m``: the bubble is ``(p - 1) / (m + p - 1)``.
"""

from __future__ import annotations

import numpy as np

from hw.spec import ConfigError, NpuConfig
from hw.spec.collective import word_bytes
from hw.spec.isa import Op, Unit

from . import p2p_launch as pl
from .alloc import Allocator
from .assembler import Assembler
from .blocks import BlockEmitter, Shard
from .program import ChipProgram, Placement, SystemProgram
from .quantize import QModel
from .single import check_single_chip, finish

__all__ = ["stage_layers", "split_batch", "compile_pipeline"]


def stage_layers(cfg, stages: int) -> list[list[int]]:
    """The layers of each stage; ConfigError when there are more stages than layers."""
    if stages > cfg.n_layers:
        raise ConfigError(f"is less than the {stages} chips: pipeline parallelism needs a layer "
                          "per chip", path=cfg.path, key="n_layers", value=cfg.n_layers)
    return [[int(i) for i in part] for part in np.array_split(np.arange(cfg.n_layers), stages)]


def split_batch(samples: int, microbatches: int) -> list[list[int]]:
    """The samples of each microbatch (``numpy.array_split``: the first ones one longer)."""
    if not 1 <= microbatches <= samples:
        raise ValueError(f"microbatches={microbatches} must be 1..{samples} (the batch)")
    return [[int(i) for i in part]
            for part in np.array_split(np.arange(samples), microbatches)]


def compile_pipeline(npu: NpuConfig, qm: QModel, chips: int, *, seq: int | None = None,
                     samples: int = 1, microbatches: int | None = None) -> SystemProgram:
    """Programs for ``chips`` pipeline stages over ``samples`` sequences in ``microbatches``
    (default ``min(samples, chips)``). The microbatches' residual buffers, which the send and
    receive units stream while the stage computes, get a bank of their own when there is room
    (:class:`~sim.compiler.alloc.Allocator`)."""
    try:
        return _compile(npu, qm, chips, seq, samples, microbatches, transfer_bank=True)
    except ConfigError as exc:
        if "regions overlap" not in str(exc):
            raise
        return _compile(npu, qm, chips, seq, samples, microbatches, transfer_bank=False)


def _compile(npu, qm, chips, seq, samples, microbatches, *, transfer_bank):
    cfg = qm.cfg
    check_single_chip(npu, cfg)
    seq = cfg.seq_len if seq is None else seq
    stages = stage_layers(cfg, chips)
    microbatches = min(samples, chips) if microbatches is None else microbatches
    batches = split_batch(samples, microbatches)
    n = npu.array_size
    ratio = word_bytes(npu.link_bytes_per_cycle) // n
    shard = Shard.whole(cfg)
    programs, comms = [], []
    inputs = [[] for _ in range(samples)]
    outputs = [None] * samples
    for s, layers in enumerate(stages):
        al, asm = Allocator(npu, transfer_bank=transfer_bank), Assembler()
        em = BlockEmitter(npu, qm, asm, al, seq=seq, chip=s)
        weights = {i: em.place_layer(i, shard) for i in layers}
        xs = [em.alloc_residual(f"x{m}", len(b), multiple=ratio, transfer=True)
              for m, b in enumerate(batches)]
        acts = em.alloc_activations(max(x.rows for x in xs), shard)
        al.check_capacity()

        def message(x):
            return pl.contiguous(x.base, pl.message_words(x.words, n, npu.link_bytes_per_cycle))

        def recv(m, s=s, xs=xs, asm=asm):
            pl.emit(asm, pl.recv_launch(src=s - 1, desc=message(xs[m]), size=n,
                                        link_bytes=npu.link_bytes_per_cycle))

        if s > 0:
            recv(0)
        per_batch = []       # compute launches of each microbatch (the report's stage spans)

        def launches(asm=asm):
            return {unit: sum(1 for insn in asm.insns if insn.op == op)
                    for unit, op in (("matmul", Op.MATMUL), ("attention", Op.ATTN),
                                     ("vector", Op.VEC))}

        for m, batch in enumerate(batches):
            x = xs[m]
            if s > 0:
                asm.wait(Unit.RECV)
                if m + 1 < len(batches):
                    recv(m + 1)
            before = launches()
            if cfg.norm == "post":
                first = layers[0]
                mult, shift = (qm.in_mult, qm.in_shift) if first == 0 else \
                    (qm.layers[first - 1].ln2.mult, qm.layers[first - 1].ln2.shift)
                em.requant_input(x, acts.x8, mult, shift)
            for i in layers:
                em.emit_block(i, weights[i], shard, acts, x, len(batch))
            after = launches()
            per_batch.append({u: after[u] - before[u] for u in after})
            if s + 1 < len(stages):
                launch = pl.send_launch(dest=s + 1, desc=message(x), size=n,
                                        link_bytes=npu.link_bytes_per_cycle)
                pl.emit(asm, launch)
                comms.append({"kind": "send", "from": s, "to": s + 1, "microbatch": m,
                              "bytes": launch.words * n})
            for k, sample in enumerate(batch):
                place = Placement(s, x.base + k * em.seq_pad * x.row_words, em.seq_pad, x.cols,
                                  x.row_words)
                if s == 0:
                    inputs[sample].append(place)
                if s + 1 == len(stages):
                    outputs[sample] = place
        programs.append(finish(npu, ChipProgram(s, asm, al, role={"layers": layers}, spans={
            "microbatch_launches": per_batch})))
    meta = {"stages": chips, "layers_per_stage": [len(ls) for ls in stages],
            "microbatches": len(batches),
            "microbatch_samples": [len(b) for b in batches]}
    return SystemProgram(npu, cfg, "pipeline", programs, seq, em.seq_pad, inputs,
                         outputs, meta, comms)
