"""One compiler for data, pipeline and head parallelism and every grid of them.

A grid has ``replicas x stages x shards`` chips. Chip ``(r, s, h)`` is chip
``(r * stages + s) * shards + h`` on the ring:

- **data** (``replicas``): replica r holds the whole model (its stages and shards) and runs its
  share of the batch (``numpy.array_split``); replicas never communicate;
- **pipeline** (``stages``): stage s holds layers ``numpy.array_split(layers, stages)[s]``; the
  replica's batch is split into ``microbatches`` that flow through the stages in a static
  GPipe schedule, each stage sending its residual to the same shard of the next stage
  (``SEND``/``RECV``, only those two chips take part);
- **head** (``shards``): the consecutive chips of a stage split its layers by heads and FFN
  columns (:func:`head_shards`); the partial O and FFN2 sums are all-reduced inside that group,
  and groups of different stages and replicas, which share no chip, run at the same time.

The strategies are grids: ``single`` (1, 1, 1), ``head`` (1, 1, N), ``pipeline`` (1, N, 1),
``data`` (N, 1, 1), ``head+pipeline`` A x B (1, B, A), ``data+head`` A x B (A, 1, B),
``data+pipeline`` A x B (A, B, 1). Every one gives the single-chip integers bit for bit: a
sample's layers run in order on chips that hold their weights, int32 partial sums wrap modulo
2**32 in any order, and chip 0 of a head group alone adds the biases.

With p stages and m microbatches of equal cost, a pipeline is busy ``m + p - 1`` stage times of
which each stage works ``m``: the bubble is ``(p - 1) / (m + p - 1)``. Each stage keeps one
residual buffer per microbatch (in the allocator's transfer bank, so that the send and receive
units stream it while the stage computes), so no transfer waits for a buffer to be free, and it
posts the receive of microbatch m + 1 as soon as m has arrived.
"""

from __future__ import annotations

from dataclasses import dataclass

from hw.spec import ConfigError, NpuConfig
from hw.spec.collective import word_bytes
from hw.spec.isa import Op, Unit

from . import attention_launch as al_
from . import p2p_launch as pl
from .alloc import Allocator
from .assembler import Assembler
from .blocks import BlockEmitter, Shard, pad_to
from .compat import Limit, check_ring_port, check_single_chip
from .program import ChipProgram, Placement, SystemProgram, finish, split_ranges
from .quantize import QModel

__all__ = ["Grid", "head_shards", "stage_layers", "split_batch", "compile_grid"]


@dataclass(frozen=True)
class Grid:
    replicas: int = 1
    stages: int = 1
    shards: int = 1

    @property
    def chips(self) -> int:
        return self.replicas * self.stages * self.shards

    def chip(self, r: int, s: int, h: int) -> int:
        return (r * self.stages + s) * self.shards + h


def head_shards(cfg, shards: int, first: int = 0, chips: int | None = None) -> list[Shard]:
    """Each of ``shards`` chips' heads and FFN columns (``numpy.array_split`` order), the group
    of chips ``first .. first + shards - 1`` of a ring of ``chips``; ConfigError when there are
    more shards than heads."""
    if shards > cfg.n_heads:
        raise Limit(f"is less than the {shards} chips: head parallelism needs a head per chip",
                    path=cfg.path, key="n_heads", value=cfg.n_heads, limit=shards)
    chips = shards if chips is None else chips
    heads, ffn = split_ranges(cfg.n_heads, shards), split_ranges(cfg.d_ff, shards)
    group = (first, shards, chips) if shards > 1 else None
    return [Shard(heads[c], ffn[c], group, bias=c == 0) for c in range(shards)]


def stage_layers(cfg, stages: int) -> list[list[int]]:
    """The layers of each stage; ConfigError when there are more stages than layers."""
    if stages > cfg.n_layers:
        raise Limit(f"is less than the {stages} chips: pipeline parallelism needs a layer per "
                    "chip", path=cfg.path, key="n_layers", value=cfg.n_layers, limit=stages)
    return [list(part) for part in split_ranges(cfg.n_layers, stages)]


def split_batch(samples: int, parts: int, what: str = "microbatches") -> list[list[int]]:
    """The samples of each part (``numpy.array_split``: the first ones one longer)."""
    if not 1 <= parts <= samples:
        raise ValueError(f"{what}={parts} must be 1..{samples} (the batch)")
    return [list(part) for part in split_ranges(samples, parts)]


def _launch_counts(asm) -> dict[str, int]:
    return {unit: sum(1 for insn in asm.insns if insn.op == op)
            for unit, op in (("matmul", Op.MATMUL), ("attention", Op.ATTN), ("vector", Op.VEC))}


def compile_grid(npu: NpuConfig, qm: QModel, grid: Grid, *, strategy: str,
                 seq: int | None = None, samples: int = 1, microbatches: int | None = None,
                 contents: bool = True, check: bool = True,
                 only: set[int] | None = None, emit: bool = True) -> SystemProgram:
    """Programs for every chip of ``grid``; ``microbatches`` per replica (default
    ``min(its samples, stages)``; 1 without a pipeline). The microbatches' buffers get a bank
    of their own when there is room (:class:`~sim.compiler.alloc.Allocator`).

    ``contents=False``: the weights placed without their contents (the planner's shapes-only
    compile: ``qm`` needs no weight arrays; the same layout and program but for the SET
    values of the scales); ``check=False`` skips the compatibility, capacity and program-size
    checks (the planner collects every violated limit itself); ``only``: compile just those
    chips (the others' programs are None: the planner's one chip per distinct share);
    ``emit=False``: lay out each chip's scratchpad and stop (empty programs: the planner's
    capacity, which needs no instruction and so no ring port, on any number of chips)."""
    kw = {"contents": contents, "check": check, "only": only, "emit": emit}
    if not check:
        prog = _compile(npu, qm, grid, strategy, seq, samples, microbatches,
                        transfer_bank=True, **kw)
        chips = [c for c in prog.chips if c is not None]
        if any(c.alloc.overflows for c in chips) and \
                all(c.alloc.next_word <= npu.sram_words for c in chips):
            prog = _compile(npu, qm, grid, strategy, seq, samples, microbatches,
                            transfer_bank=False, **kw)
        return prog
    try:
        return _compile(npu, qm, grid, strategy, seq, samples, microbatches, transfer_bank=True,
                        **kw)
    except ConfigError as exc:
        if "regions overlap" not in str(exc):
            raise
        return _compile(npu, qm, grid, strategy, seq, samples, microbatches,
                        transfer_bank=False, **kw)


def _compile(npu, qm, grid, strategy, seq, samples, microbatches, *, transfer_bank, contents,
             check, only, emit):
    cfg = qm.cfg
    if check:
        check_single_chip(npu, cfg, passes=True)
        check_ring_port(npu, grid.chips)
    seq = cfg.seq_len if seq is None else seq
    stages = stage_layers(cfg, grid.stages)
    replica_samples = split_batch(samples, grid.replicas, "replicas (data parallelism)")
    n, link = npu.array_size, npu.link_bytes_per_cycle
    ratio = max(1, word_bytes(link, n) // n)   # 0: no ring port (only one chip is planned)
    programs = [None] * grid.chips
    comms, inputs, outputs = [], [[] for _ in range(samples)], [None] * samples
    replica_batches = []
    for r, rs in enumerate(replica_samples):
        m = (min(len(rs), grid.stages) if grid.stages > 1 else 1) if microbatches is None \
            else microbatches
        batches = [[rs[i] for i in part] for part in split_batch(len(rs), m)]
        replica_batches.append(batches)
        for s, layers in enumerate(stages):
            first = grid.chip(r, s, 0)
            shards = head_shards(cfg, grid.shards, first, grid.chips)
            for h, shard in enumerate(shards):
                chip = grid.chip(r, s, h)
                if only is not None and chip not in only:
                    continue
                programs[chip], chip_comms = _stage_program(
                    npu, qm, seq, chip, layers, shard, batches, inputs, outputs,
                    prev=grid.chip(r, s - 1, h) if s > 0 else None,
                    nxt=grid.chip(r, s + 1, h) if s + 1 < grid.stages else None,
                    ratio=ratio, transfer_bank=transfer_bank, contents=contents, check=check,
                    emit=emit, role={"replica": r, "stage": s, "shard": h})
                # Each all-reduce once (from its group's first chip), every send.
                comms += [c for c in chip_comms if h == 0 or c["kind"] == "send"]
    meta = {"grid": {"replicas": grid.replicas, "stages": grid.stages, "shards": grid.shards},
            "stages": grid.stages, "layers_per_stage": [len(ls) for ls in stages],
            "microbatches": len(replica_batches[0]),
            "microbatch_samples": [len(b) for b in replica_batches[0]],
            "replica_samples": [len(rs) for rs in replica_samples],
            "heads_per_chip": [len(s.heads) for s in head_shards(cfg, grid.shards)],
            "ffn_columns_per_chip": [len(s.ffn) for s in head_shards(cfg, grid.shards)]}
    if (order := al_.long_order(npu, cfg, seq)) is not None:
        # Long context in passes: the merge order of the key chunks (the golden's kv_order).
        meta["kv_order"] = order
    return SystemProgram(npu, cfg, strategy, programs, seq, pad_to(seq, n), inputs, outputs,
                         meta, comms)


def _stage_program(npu, qm, seq, chip, layers, shard, batches, inputs, outputs, *, prev, nxt,
                   ratio, transfer_bank, contents, check, emit, role):
    """One chip's program: its share of its stage's layers over every microbatch of its
    replica; receives from ``prev`` and sends to ``nxt`` (chip ids, None at the ends)."""
    cfg = qm.cfg
    n, link = npu.array_size, npu.link_bytes_per_cycle
    al, asm = Allocator(npu, transfer_bank=transfer_bank), Assembler()
    em = BlockEmitter(npu, qm, asm, al, seq=seq, chip=chip, contents=contents)
    weights = {i: em.place_layer(i, shard) for i in layers}
    piped = prev is not None or nxt is not None
    xs = [em.alloc_residual(f"x{m}", len(b), multiple=ratio, transfer=piped)
          for m, b in enumerate(batches)]
    acts = em.alloc_activations(max(x.rows for x in xs), shard)
    if check:
        al.check_capacity()
    role = {**role, "layers": list(layers), "heads": list(shard.heads),
            "ffn_columns": len(shard.ffn)}
    if cfg.n_kv_heads != cfg.n_heads:
        # Grouped-query attention: the K/V heads this chip projects and holds (a K/V head
        # whose query heads lie on several chips is held by each of them).
        role["kv_heads"] = em.kv_heads(shard)
    if not emit:
        return ChipProgram(chip, asm, al, role=role), []
    comms = []

    def message(x):
        return pl.contiguous(x.base, pl.message_words(x.words, n, link))

    def recv(m):
        pl.emit(asm, pl.recv_launch(src=prev, desc=message(xs[m]), size=n, link_bytes=link))

    if prev is not None:
        recv(0)
    per_batch = []       # compute launches of each microbatch (the report's stage spans)
    for m, batch in enumerate(batches):
        x = xs[m]
        if prev is not None:
            asm.wait(Unit.RECV)
            if m + 1 < len(batches):
                recv(m + 1)
        before = _launch_counts(asm)
        if cfg.norm == "post":
            em.requant_input(x, acts.x8, layers[0])
        for i in layers:
            em.emit_block(i, weights[i], shard, acts, x, len(batch))
        em.gather_residual(x, shard, len(batch))
        after = _launch_counts(asm)
        per_batch.append({u: after[u] - before[u] for u in after})
        if nxt is not None:
            launch = pl.send_launch(dest=nxt, desc=message(x), size=n, link_bytes=link)
            pl.emit(asm, launch)
            comms.append({"kind": "send", "from": chip, "to": nxt, "microbatch": m,
                          "bytes": launch.words * n})
        for k, sample in enumerate(batch):
            place = Placement(chip, x.base + k * em.seq_pad * x.row_words, em.seq_pad, x.cols,
                              x.row_words)
            if prev is None:
                inputs[sample].append(place)       # every shard of the first stage holds it
            if nxt is None and shard.bias:         # the group's first shard gives the output
                outputs[sample] = place
    program = finish(npu, ChipProgram(chip, asm, al, role=role,
                                      spans={"microbatch_launches": per_batch}), check=check)
    return program, em.comms + comms
