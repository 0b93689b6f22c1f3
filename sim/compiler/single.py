"""The whole model on one chip (``--strategy single``): every block's weights, one program.

The block program and its padding are :mod:`sim.compiler.blocks`'s; a batch of samples runs as
one program whose tensors hold every sample's rows. :func:`check_single_chip` is the
compatibility check every strategy makes for what each chip runs.
"""

from __future__ import annotations

from hw.spec import ConfigError, ModelConfig, NpuConfig

from .alloc import Allocator
from .assembler import Assembler
from .attention_launch import plan_schedule
from .blocks import BlockEmitter, Shard
from .program import ChipProgram, Placement, SystemProgram
from .quantize import QModel

__all__ = ["check_single_chip", "compile_single", "finish"]


def check_single_chip(npu: NpuConfig, cfg: ModelConfig):
    """Compatibility of a model with one chip's datapath; :class:`ConfigError` otherwise."""
    def refuse(key, value, problem, path):
        raise ConfigError(problem, path=path, key=key, value=value)

    for key, bad, what in (("norm_kind", "rmsnorm", "the vector unit has LayerNorm only"),
                           ("ffn", "gated", "the compiler maps two-matrix MLP FFNs only"),
                           ("activation", "silu", "the activation LUT is built for GELU/ReLU")):
        if getattr(cfg, key) == bad:
            refuse(key, bad, f"is not supported by the simulator: {what}", cfg.path)
    if cfg.d_head > npu.d_head_max:
        refuse("d_head", cfg.d_head, f"exceeds datapath width d_head_max={npu.d_head_max}",
               npu.path)
    if cfg.d_model > npu.d_model_max:
        refuse("d_model", cfg.d_model, f"exceeds d_model_max={npu.d_model_max}", npu.path)
    if cfg.seq_len > npu.max_seq_len:
        refuse("seq_len", cfg.seq_len, f"exceeds max_seq_len={npu.max_seq_len}", npu.path)
    try:
        plan_schedule(seq=cfg.seq_len, window=cfg.window, causal=cfg.causal,
                      ring=npu.attn_window)
    except ValueError as exc:
        key, value = ("window", cfg.window) if cfg.window else ("seq_len", cfg.seq_len)
        refuse(key, value, f"does not fit attn_window={npu.attn_window}: {exc}", npu.path)
    if npu.vector_lanes != npu.array_size:
        refuse("vector_lanes", npu.vector_lanes,
               f"must equal array_size={npu.array_size} for the chip's word-wide vector path",
               npu.path)


def finish(npu: NpuConfig, chip: ChipProgram):
    """Halt, check the capacity and the program size, encode the program."""
    chip.asm.halt()
    chip.alloc.check_capacity()
    chip.program = chip.asm.words()
    if len(chip.program) > npu.imem_words:
        raise ConfigError(f"is too small: chip {chip.chip}'s program has {len(chip.program)} "
                          "instructions", path=npu.path, key="imem_words", value=npu.imem_words)
    return chip


def compile_single(npu: NpuConfig, qm: QModel, *, seq: int | None = None,
                   samples: int = 1) -> SystemProgram:
    """Memory image and program that run every block of ``qm`` on one chip, for ``samples``
    sequences of ``seq`` tokens (default ``seq_len``)."""
    cfg = qm.cfg
    check_single_chip(npu, cfg)
    seq = cfg.seq_len if seq is None else seq
    al, asm = Allocator(npu), Assembler()
    em = BlockEmitter(npu, qm, asm, al, seq=seq)
    shard = Shard.whole(cfg)
    weights = [em.place_layer(i, shard) for i in range(cfg.n_layers)]
    x = em.alloc_residual("x", samples)
    acts = em.alloc_activations(x.rows, shard)
    al.check_capacity()
    if cfg.norm == "post":
        em.requant_input(x, acts.x8, qm.in_mult, qm.in_shift)
    for i in range(cfg.n_layers):
        em.emit_block(i, weights[i], shard, acts, x, samples)
    chip = finish(npu, ChipProgram(0, asm, al, role={"layers": list(range(cfg.n_layers))}))
    places = [Placement(0, x.base + s * em.seq_pad * x.row_words, em.seq_pad, x.cols,
                        x.row_words) for s in range(samples)]
    return SystemProgram(npu, cfg, "single", [chip], seq, em.seq_pad,
                         inputs=[[p] for p in places], outputs=places)
