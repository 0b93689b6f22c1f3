"""Integer golden model of whole transformer blocks, built from the block golden models.

This is what the chip computes, bit for bit, for any strategy and chip count: int16 residual
stream in, int16 residual stream out (``sim.compiler.quantize`` supplies the integer
parameters). Attention sees keys by absolute position (``sim.golden.float_model.attention_mask``);
softmax and P.V do not depend on the order of the keys, so the attention buffer's ring order
gives the same integers. With ``norm_kind = "rmsnorm"`` every LayerNorm is RMSNorm
(``sim.golden.vector.rmsnorm``: the unit's RMS op, beta 0 from the quantiser).

Under ``quant = "smooth16"`` (``sim.compiler.quantize``) a post-norm block makes its int8 QKV
and FFN1 inputs with a per-lane requantisation of the int16 LayerNorm output (the smoothing),
and every block's FFN keeps its hidden in int16::

    pre16 = requant16(h @ W1 + b1)                    (matmul, int16 out)
    act16 = GELU16(pre16)                             (sim.golden.vector.gelu16_apply)
    x     = linear16(act16, W2, b2, x)                (two int8 passes, two residual adds)

Grouped-query attention: query head ``h`` reads K/V head ``h // kv_group``. RoPE
(``rope_theta`` > 0) rotates Q and K after the projection at positions ``pos_base + row``
(:func:`sim.golden.rope.rope_int`, from the rotated projections ``L.rope.qr``, ``L.rope.kr``).

A gated FFN (``ffn = "gated"``) runs the gate and the up matmul on the same input,
the activation LUT (SiLU) on the gate and the vector unit's MUL on the two::

    act = gated_mul(lut[h @ Wg + bg], requant8(h @ W1 + b1), mul_mult, mul_shift)
    x   = x + requant16(act @ W2 + b2)

Under ``quant = "llm16"`` the product is int16, exact (``mul_mult, mul_shift = 2, 1``), GELU16
with identity knots writes its two int8 planes and FFN2 runs two passes as under smooth16::

    act16 = GELU16_identity(gated_mul(lut[h @ Wg + bg], requant8(h @ W1 + b1), 2, 1, bits=16))
    x     = linear16(act16, W2, b2, x)

and every block after the first starts by requantising the int16 residual from the previous
block's scale to its own (``L.res_req``, per tensor; ``sim.compiler.quantize``).
"""

from __future__ import annotations

import numpy as np

from .float_model import attention_mask
from .matmul import linear16, matmul_unit, requant, wrap
from .ring_softmax import chunked_attention
from .rope import rope_int, rope_tables
from .softmax import softmax
from .vector import (
    SPLIT16_G,
    gated_mul,
    gelu16_apply,
    layernorm,
    ln_normalise,
    ln_stats,
    lut_apply,
    residual_add,
    rmsnorm,
    split16_table,
)

__all__ = ["linear", "layernorm_rows", "norm_rows", "digits", "gated16_product", "qkv_int",
           "attention_int", "ffn_int", "layer_int", "model_int"]


def linear(x, ql):
    return matmul_unit(x, ql.w, ql.bias, ql.mult, ql.shift, ql.mode)


def layernorm_rows(x, ln, rms: bool = False):
    """LayerNorm (``rms``: RMSNorm) of every row: ``(y16, q8)``."""
    norm = rmsnorm if rms else layernorm
    out = [norm(row, ln.gamma, ln.beta, ln.gshift, ln.mult, ln.shift) for row in x]
    return (np.array([o[0] for o in out], np.int64), np.array([o[1] for o in out], np.int64))


def norm_rows(L, x, ln, rms: bool):
    """Block ``L``'s norm ``ln`` of every row of ``x``: :func:`layernorm_rows`, or under
    llm16c (``L.norm_req``) RMSNorm of a residual at per-channel scales, from the statistics
    of its copy at one scale: ``REQUANT`` (per lane) into y, ``LN_STATS`` of y, ``RMS_APPLY``
    of x with y's sum of squares and ``L.norm_n`` elements. ``(y16, q8)``."""
    if L.norm_req is None:
        return layernorm_rows(x, ln, rms)
    y = requant(x, *L.norm_req, 16)
    out = [ln_normalise(row, 0, ln_stats(yr)[1], L.norm_n, ln.gamma, ln.beta, ln.gshift,
                        ln.mult, ln.shift, rms=True) for row, yr in zip(x, y, strict=True)]
    return (np.array([o[0] for o in out], np.int64), np.array([o[1] for o in out], np.int64))


def digits(x, table=None, g: int = SPLIT16_G) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The balanced byte digits of int16 ``y = GELU16(table, x)`` (default: the split table,
    ``y = x``): ``(y, yl, yh)`` with ``yl = int8(y & 0xFF)`` (GELU16's low byte) and ``yh =
    requant(y, 1, 8, 8) = round(y / 256)`` (REQUANT), so ``y = 256 yh + yl`` up to
    :data:`~sim.golden.vector.SPLIT16_EXACT_MAX`."""
    y = gelu16_apply(split16_table() if table is None else table, x, g)
    return y, wrap(y, 8), requant(y, 1, 8, 8)


def gated16_product(G, gate16, up16) -> np.ndarray:
    """llm16c's int16 product (``sim.compiler.quantize.QGated16``) of the int16 gate and up
    outputs: SiLU by GELU16, both operands' digits, four MULs (int16 out) added by saturating
    ADDs in the order hh, hl (yh ul), hl (yl uh), ll."""
    _, yl, yh = digits(gate16, G.silu, G.silu_g)
    _, ul, uh = digits(up16)
    p = gated_mul(yh, uh, *G.hh, bits=16)
    for a, b, (mult, shift) in ((yh, ul, G.hl), (yl, uh, G.hl), (yl, ul, G.ll)):
        p = residual_add(p, gated_mul(a, b, mult, shift, bits=16))
    return p


def qkv_int(cfg, layer, h, pos_base: int = 0, record: dict | None = None):
    """The int8 Q [seq, d_model], K and V [seq, d_kv] of the int8 input ``h``: the projections,
    then RoPE of Q and K (``record`` keeps the unrotated ones as ``q_proj``, ``k_proj``)."""
    q, k, v = linear(h, layer.q), linear(h, layer.k), linear(h, layer.v)
    if layer.rope is not None:
        r = layer.rope
        cos8, sin8 = rope_tables(cfg.d_head, cfg.rope_theta, pos_base + np.arange(h.shape[0]))
        if record is not None:
            record.update(q_proj=q, k_proj=k)
        q = rope_int(q, linear(h, r.qr), cos8, sin8, *r.q_req)
        k = rope_int(k, linear(h, r.kr), cos8, sin8, *r.k_req)
    return q, k, v


def attention_int(cfg, layer, q, k, v, pos_base: int = 0, mask=None, kv_order=None):
    """Multi-head attention on int8 Q [seq, d_model], K, V [keys, d_kv] -> int8 [seq, d_model]
    (query head ``h`` on K/V head ``h // kv_group``); ``mask`` [seq, keys] (true = visible)
    defaults to the model's over ``seq`` keys at ``pos_base``. ``kv_order`` (long context:
    runs of query rows and their key chunks in merge order,
    :func:`sim.golden.ring_softmax.chunked_attention`) merges partial softmaxes instead of one
    softmax per row."""
    dh = cfg.d_head
    if mask is None:
        mask = attention_mask(q.shape[0], cfg.window, cfg.causal, pos_base)
    out = np.zeros(q.shape, np.int64)
    for h in range(cfg.n_heads):
        sl = slice(h * dh, (h + 1) * dh)
        g = h // cfg.kv_group
        kvs = slice(g * dh, (g + 1) * dh)
        raw = wrap(q[:, sl] @ k[:, kvs].T)
        scores = np.where(mask, requant(raw, layer.score_mult, layer.score_shift, 16), 0)
        if kv_order is not None:
            out[:, sl] = chunked_attention(scores, mask, v[:, kvs], kv_order, layer.out_mult,
                                           layer.out_shift)
            continue
        probs = softmax(scores, mask).astype(np.int64)
        acc = wrap(np.where(mask, probs, 0) @ v[:, kvs])
        out[:, sl] = requant(acc, layer.out_mult, layer.out_shift, 8)
    return out


def ffn_int(L, x, h, record: dict | None = None, prefix: str = ""):
    """The FFN on the int8 input ``h`` added into the int16 residual ``x``: int8 hidden and
    the activation LUT, or (``L.ffn16``) the int16 hidden, GELU16 and two FFN2 passes; a
    gated FFN (``L.gate``) multiplies the activated gate into FFN1's output (MUL)."""
    pre = linear(h, L.ffn1)
    if L.gated16 is not None:
        act = gelu16_apply(L.lut16, gated16_product(L.gated16, linear(h, L.gate), pre), L.gelu_g)
        out = linear16(act, L.ffn2.w, L.ffn2.bias, L.ffn2.mult, L.ffn2.shift, x)
    elif L.gate is not None:
        gact = lut_apply(L.lut, linear(h, L.gate))
        if L.ffn16:
            act = gelu16_apply(L.lut16, gated_mul(gact, pre, L.mul_mult, L.mul_shift, bits=16),
                               L.gelu_g)
            out = linear16(act, L.ffn2.w, L.ffn2.bias, L.ffn2.mult, L.ffn2.shift, x)
        else:
            act = gated_mul(gact, pre, L.mul_mult, L.mul_shift)
            out = residual_add(x, linear(act, L.ffn2))
        if record is not None:
            record[prefix + "ffn_gact"] = gact
    elif L.ffn16:
        act = gelu16_apply(L.lut16, pre, L.gelu_g)
        out = linear16(act, L.ffn2.w, L.ffn2.bias, L.ffn2.mult, L.ffn2.shift, x)
    else:
        act = lut_apply(L.lut, pre)
        out = residual_add(x, linear(act, L.ffn2))
    if record is not None:
        record.update({prefix + "ffn_pre": pre, prefix + "ffn_act": act})
    return out


def layer_int(qm, i: int, x, x8=None, record: dict | None = None, *, pos_base: int = 0,
              attend=None, kv_order=None):
    """Block ``i`` on the int16 residual ``x`` [seq, d] at positions ``pos_base ..``; returns
    ``(x, x8)``.

    ``x8`` is the int8 copy of the residual that a post-norm block reads (None for pre-norm,
    and under smooth16, where each block requantises the residual per lane itself).
    ``attend(q, k, v)`` replaces the attention over these rows alone (decode: over a KV cache);
    ``kv_order`` merges partial softmaxes over key chunks (:func:`attention_int`).
    """
    if attend is None:
        def attend(q, k, v):
            return attention_int(qm.cfg, qm.layers[i], q, k, v, pos_base, kv_order=kv_order)
    cfg, L = qm.cfg, qm.layers[i]
    rms = cfg.rmsnorm
    record = {} if record is None else record
    p = f"layers.{i}."
    if L.res_req is not None:
        x = requant(x, *L.res_req, 16)
    if cfg.norm == "pre":
        _, h = norm_rows(L, x, L.ln1, rms)
        q, k, v = qkv_int(cfg, L, h, pos_base)
        o = attend(q, k, v)
        x = residual_add(x, linear(o, L.o))
        _, h2 = norm_rows(L, x, L.ln2, rms)
        x = ffn_int(L, x, h2, record, p)
        x8 = None
    else:
        if L.qkv_req is not None:
            x8 = requant(x, *L.qkv_req, 8)
        elif x8 is None:
            x8 = requant(x, qm.in_mult, qm.in_shift, 8)
        q, k, v = qkv_int(cfg, L, x8, pos_base)
        o = attend(q, k, v)
        x, h = layernorm_rows(residual_add(x, linear(o, L.o)), L.ln1, rms)
        if L.ffn_req is not None:
            h = requant(x, *L.ffn_req, 8)
        x, x8 = layernorm_rows(ffn_int(L, x, h, record, p), L.ln2, rms)
        if L.qkv_req is not None:
            x8 = None
    record.update({p + "q": q, p + "k": k, p + "v": v, p + "attn_o": o, p + "out": x})
    return x, x8


def model_int(qm, x, record: dict | None = None, kv_order=None):
    """Every block on the int16 residual [seq, d] (or [batch, seq, d]); ``kv_order``: long
    context's merge order of key chunks, the same in every block (:func:`attention_int`)."""
    x = np.asarray(x, np.int64)
    if x.ndim == 3:
        return np.stack([model_int(qm, xb, record, kv_order) for xb in x])
    x8 = None
    for i in range(qm.cfg.n_layers):
        x, x8 = layer_int(qm, i, x, x8, record, kv_order=kv_order)
    return x

