"""Compile whole transformer blocks for one chip: memory image + program.

Shapes are padded to the array: the sequence to whole blocks of N tokens, d_model and d_ff to
whole words, and every head's Q/K/V columns to a multiple of N (zero weights, so the padding
changes no integer). Tensors are token-major. Per block (pre-norm)::

    VEC  LN1     x (int16)        -> h (int8)
    MM   QKV     h @ Wqkv         -> qkv (int8, per-head padded columns)
    ATTN head i  qkv[q_i, k_i, v_i] -> o[:, head i]   (one launch per head)
    MM   O       o @ Wo           -> a (int16, residual scale)
    VEC  ADD     x + a            -> x
    VEC  LN2     x                -> h
    VEC  LOAD_LUT (overlaps the next matmul)
    MM   FFN1    h @ W1           -> f (int8)
    VEC  LUT     f                -> f
    MM   FFN2    f @ W2           -> a (int16)
    VEC  ADD     x + a            -> x

Post-norm reads an int8 copy of the residual (from the previous LayerNorm, or a REQUANT for
block 0) and normalises after each residual add, writing both the int16 residual and the int8
copy. A ``WAIT`` precedes each launch that reads what the previous one writes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw.spec import ConfigError, ModelConfig, NpuConfig
from hw.spec.formats import OutMode
from hw.spec.isa import Unit
from hw.spec.memory import pack_params, pack_rows, pack_weight_blocks
from hw.spec.vector import pack_gamma_beta

from . import attention_launch as al_
from . import vector_launch as vl
from .alloc import Allocator, Tensor
from .assembler import Assembler
from .attention_launch import plan_schedule
from .descriptors import emit_matmul, matmul_launch
from .quantize import QLinear, QModel
from .vector_launch import Rows

__all__ = ["Compiled", "check_single_chip", "compile_single", "emit_tensor_matmul",
           "input_image"]


def _cdiv(a, b):
    return -(-a // b)


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


@dataclass
class Compiled:
    npu: NpuConfig
    cfg: ModelConfig
    program: list            # instruction words
    asm: Assembler
    alloc: Allocator
    x: Tensor                # the int16 residual stream, [seq_pad, d] (input and output)
    seq: int
    seq_pad: int


def emit_tensor_matmul(asm: Assembler, n: int, a: Tensor, w: Tensor, p: Tensor, c: Tensor,
                       k: int, cols: int, mode: OutMode):
    """``c[:, :cols] = requant(a @ w)``: one MATMUL launch over all rows of ``a``."""
    emit_matmul(asm, matmul_launch(size=n, m=a.rows, k=k, n=cols, a_base=a.base,
                                   a_row_words=a.row_words, b_base=w.base, p_base=p.base,
                                   c_base=c.base, c_row_words=c.row_words, mode=mode))


def _place_linear(al: Allocator, name: str, ql: QLinear, k_pad: int, col_map=None,
                  cols_pad=None):
    """Store weights block-major (rows zero-padded to ``k_pad``) and per-column parameters.

    ``col_map`` places output column j at padded column ``col_map[j]`` (head padding).
    """
    n = al.n
    k, cols = ql.w.shape
    cols_pad = cols_pad or _cdiv(cols, n) * n
    col_map = np.arange(cols) if col_map is None else np.asarray(col_map)
    w = np.zeros((k_pad, cols_pad), np.int64)
    w[:k, col_map] = ql.w
    bias = np.zeros(cols_pad, np.int64)
    mult = np.zeros(cols_pad, np.int64)
    shift = np.ones(cols_pad, np.int64)
    bias[col_map], mult[col_map], shift[col_map] = ql.bias, ql.mult, ql.shift
    wt = al.alloc_words(name + ".w", pack_weight_blocks(w, n), "weights", low=True)
    pt = al.alloc_words(name + ".p", pack_params(bias, mult, shift, n), "weights")
    return wt, pt, cols_pad


def compile_single(npu: NpuConfig, qm: QModel, *, seq: int | None = None) -> Compiled:
    """Memory image and program that run every block of ``qm`` on one chip."""
    cfg = qm.cfg
    check_single_chip(npu, cfg)
    n = npu.array_size
    seq = cfg.seq_len if seq is None else seq
    seq_pad = _cdiv(seq, n) * n
    d, f, heads, dh = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.d_head
    d_pad, f_pad, dh_pad = _cdiv(d, n) * n, _cdiv(f, n) * n, _cdiv(dh, n) * n
    al = Allocator(npu)
    asm = Assembler()

    # Weights of every block (the single chip holds them all).
    placed = []
    for i, L in enumerate(qm.layers):
        p = f"layers.{i}."
        qkv_map = np.concatenate([
            np.arange(dh) + part * heads * dh_pad + h * dh_pad
            for part in range(3) for h in range(heads)])
        ql = QLinear(np.concatenate([L.q.w, L.k.w, L.v.w], axis=1),
                     np.concatenate([L.q.bias, L.k.bias, L.v.bias]),
                     np.concatenate([L.q.mult, L.k.mult, L.v.mult]),
                     np.concatenate([L.q.shift, L.k.shift, L.v.shift]), OutMode.INT8)
        qkv = _place_linear(al, p + "qkv", ql, d_pad, qkv_map, 3 * heads * dh_pad)
        o_map = np.concatenate([np.arange(dh) + h * dh_pad for h in range(heads)])
        wo_rows = np.zeros((heads * dh_pad, d), np.int64)
        wo_rows[o_map] = L.o.w
        o = _place_linear(al, p + "o", QLinear(wo_rows, L.o.bias, L.o.mult, L.o.shift,
                                               OutMode.INT16), heads * dh_pad)
        f1 = _place_linear(al, p + "ffn1", L.ffn1, d_pad)
        f2 = _place_linear(al, p + "ffn2", L.ffn2, f_pad)
        placed.append({"qkv": qkv, "o": o, "ffn1": f1, "ffn2": f2})

    # Activations, reused by every block.
    x = al.alloc("x", seq_pad, d_pad, 2, "activations")
    h = al.alloc("h", seq_pad, d_pad, 1, "activations")
    qkv_t = al.alloc("qkv", seq_pad, 3 * heads * dh_pad, 1, "kv_cache")
    o_t = al.alloc("o", seq_pad, heads * dh_pad, 1, "activations")
    a = al.alloc("a", seq_pad, d_pad, 2, "activations")
    ff = al.alloc("f", seq_pad, f_pad, 1, "activations")
    x8 = al.alloc("x8", seq_pad, d_pad, 1, "activations") if cfg.norm == "post" else None
    al.check_capacity()

    ctx = {"asm": asm, "al": al, "npu": npu, "cfg": cfg, "qm": qm, "seq": seq, "n": n,
           "x": x, "h": h, "qkv": qkv_t, "o": o_t, "a": a, "f": ff, "x8": x8,
           "dh_pad": dh_pad}
    for i in range(cfg.n_layers):
        _emit_block(ctx, i, placed[i])
    asm.halt()
    al.check_capacity()
    program = asm.words()
    if len(program) > npu.imem_words:
        raise ConfigError(f"is too small: the program has {len(program)} instructions",
                          path=npu.path, key="imem_words", value=npu.imem_words)
    return Compiled(npu, cfg, program, asm, al, x, seq, seq_pad)


def _emit_block(ctx, i, w):
    asm, cfg, qm, n = ctx["asm"], ctx["cfg"], ctx["qm"], ctx["n"]
    L = qm.layers[i]
    vec, attn = emit_vector, emit_attention_head
    x, h, qkv, o, a, f, x8 = (ctx[k] for k in ("x", "h", "qkv", "o", "a", "f", "x8"))
    d_pad = x.cols
    heads, dh_pad = cfg.n_heads, ctx["dh_pad"]
    al = ctx["al"]

    def matmul(src, weights, dst, k, mode):
        wt, pt, cols = weights
        emit_tensor_matmul(asm, n, src, wt, pt, dst, k, cols, mode)

    def attention():
        for hd in range(heads):
            attn(asm, al, ctx, L, hd, qkv, o)

    def residual_add(delta):
        vec(asm, al, ctx, "add", src=x, other=delta, out=x)
        asm.wait(Unit.VEC)

    def attention_block(h_in):
        matmul(h_in, w["qkv"], qkv, d_pad, OutMode.INT8)
        asm.wait(Unit.MATMUL)
        attention()
        asm.wait(Unit.ATTN)
        matmul(o, w["o"], a, heads * dh_pad, OutMode.INT16)
        asm.wait(Unit.MATMUL)
        residual_add(a)

    def ffn_block(h_in):
        matmul(h_in, w["ffn1"], f, d_pad, OutMode.INT8)
        vec(asm, al, ctx, "load_lut", layer=i)      # overlaps the FFN1 matmul
        asm.wait(Unit.MATMUL | Unit.VEC)
        vec(asm, al, ctx, "lut", src=f, out=f)
        asm.wait(Unit.VEC)
        matmul(f, w["ffn2"], a, f.cols, OutMode.INT16)
        asm.wait(Unit.MATMUL)
        residual_add(a)

    def layernorm(which, q_out, y_out=None):
        vec(asm, al, ctx, "ln", layer=i, which=which, src=x, q_out=q_out, y_out=y_out)
        asm.wait(Unit.VEC)

    if cfg.norm == "pre":
        layernorm(1, h)
        attention_block(h)
        layernorm(2, h)
        ffn_block(h)
    else:
        if i == 0:
            vec(asm, al, ctx, "requant", src=x, out=x8, mult=qm.in_mult, shift=qm.in_shift)
            asm.wait(Unit.VEC)
        attention_block(x8)
        layernorm(1, h, x)
        ffn_block(h)
        layernorm(2, x8, x)


def _rows(t: Tensor):
    return Rows(t.base, t.rows, t.row_words, t.eb)


def emit_vector(asm, al: Allocator, ctx: dict, kind: str, *, layer: int = 0, which: int = 1,
                src: Tensor | None = None, other: Tensor | None = None,
                out: Tensor | None = None, q_out: Tensor | None = None,
                y_out: Tensor | None = None, mult: int = 1, shift: int = 1):
    """One VEC launch over every row of ``src`` (``length`` = the model's real width)."""

    n, cfg, qm = ctx["n"], ctx["cfg"], ctx["qm"]
    if kind == "ln":
        ln = qm.layers[layer].ln1 if which == 1 else qm.layers[layer].ln2
        gb = pack_gamma_beta(ln.gamma, ln.beta)
        t = al.alloc_words(f"layers.{layer}.ln{which}.gamma_beta", pack_rows(gb[None, :], 4, n),
                           "weights")
        launch = vl.ln_launch(size=n, length=cfg.d_model, x=_rows(src), gamma_beta_base=t.base,
                              q=_rows(q_out) if q_out is not None else None,
                              y=_rows(y_out) if y_out is not None else None,
                              gshift=ln.gshift, mult=ln.mult, shift=ln.shift)
    elif kind == "add":
        launch = vl.add_launch(size=n, length=cfg.d_model, a=_rows(src), b=_rows(other),
                               out=_rows(out))
    elif kind == "load_lut":
        table = qm.layers[layer].lut
        t = al.alloc_words(f"layers.{layer}.lut", pack_rows(table[None, :], 1, n), "weights")
        launch = vl.load_lut_launch(size=n, base=t.base)
    elif kind == "lut":
        launch = vl.lut_launch(size=n, length=cfg.d_ff, a=_rows(src), out=_rows(out))
    elif kind == "requant":
        launch = vl.requant_launch(size=n, length=cfg.d_model, a=_rows(src), out=_rows(out),
                                   mult=mult, shift=shift)
    else:
        raise ValueError(f"unknown vector launch {kind!r}")
    vl.emit(asm, launch)


def emit_attention_head(asm, al: Allocator, ctx: dict, layer, head: int, qkv: Tensor,
                        o: Tensor, pos_base: int = 0):
    """One ATTN launch: head ``head`` of the fused Q|K|V tensor into its columns of ``o``."""

    npu, cfg, n, dh_pad = ctx["npu"], ctx["cfg"], ctx["n"], ctx["dh_pad"]
    seq = ctx["seq"]
    part = cfg.n_heads * dh_pad // n          # words of one of Q, K, V in a qkv row
    sched = al_.plan_schedule(seq=seq, window=cfg.window, causal=cfg.causal,
                              ring=npu.attn_window)
    launch = al_.attention_launch(
        size=n, d_head=dh_pad, queries=seq, keys=seq,
        q_base=qkv.base, k_base=qkv.base + part, v_base=qkv.base + 2 * part, o_base=o.base,
        q_row_words=qkv.row_words, k_row_words=qkv.row_words, v_row_words=qkv.row_words,
        o_row_words=o.row_words, col=head * dh_pad, q_pos=pos_base, k_pos=pos_base,
        bidirectional=not cfg.causal, interleaved=sched.interleaved, halo=sched.halo,
        window=sched.window, score_mult=layer.score_mult, score_shift=layer.score_shift,
        out_mult=layer.out_mult, out_shift=layer.out_shift)
    al_.emit(asm, launch)


def input_image(comp: Compiled, x_int) -> tuple[int, np.ndarray]:
    """The residual input [seq, d] int16 as scratchpad words at ``comp.x``."""
    x = np.zeros((comp.seq_pad, comp.x.cols), np.int64)
    x_int = np.asarray(x_int, np.int64)
    x[:x_int.shape[0], :x_int.shape[1]] = x_int
    return comp.x.base, pack_rows(x, 2, comp.npu.array_size)

