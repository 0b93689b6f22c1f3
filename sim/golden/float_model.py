"""Float64 reference of the transformer blocks the simulator runs (weights: ``docs/formats.md``).

``x @ W`` convention; per block (``norm = "pre"``)::

    h = LN1(x);  a = MHA(h) Wo + bo;  x = x + a
    h = LN2(x);  f = act(h W1 + b1) W2 + b2;  x = x + f

``ffn = "gated"`` (SwiGLU with ``activation = "silu"``): ``f = (act(h Wg + bg) * (h W1 + b1))
W2 + b2``, the gate ``Wg`` beside the up matrix ``W1`` (``ffn.wg``, ``ffn.bg``), ``W2`` down.

and for ``norm = "post"``: ``x = LN1(x + MHA(x) Wo + bo)``, ``x = LN2(x + FFN(x))``.
Attention masks: causal with window W sees keys ``i - W < j <= i`` (W = 0: all ``j <= i``);
bidirectional sees ``|i - j| < W`` (W = 0: every key). LayerNorm has epsilon 0 to match the
integer unit (``sim.golden.vector``); a constant row normalises to ``beta``. With
``norm_kind = "rmsnorm"`` each LN is RMSNorm, ``x / sqrt(mean(x^2)) * gamma``: no mean, no
beta (the weights have no ``ln*.bias``), epsilon 0 likewise (an all-zero row gives 0).

Grouped-query attention (``n_kv_heads`` < ``n_heads``): ``Wk`` and ``Wv`` are ``[d_model,
n_kv_heads * d_head]`` and query head ``h`` reads K/V head ``h // (n_heads / n_kv_heads)``.
RoPE (``rope_theta`` > 0, Hugging Face's half-rotation layout): each head's q and k at
position ``p`` become ``x * cos(p w) + rotate_half(x) * sin(p w)`` with ``w_i =
theta**(-2 i / d_head)`` for the two halves alike and ``rotate_half([x1, x2]) = [-x2, x1]``
(:func:`rope_angles`, :func:`rotate_half`).

``record`` (a dict) collects every intermediate tensor by name; the quantiser calibrates
activation scales from it.
"""

from __future__ import annotations

import math

import numpy as np

from hw.spec import ModelConfig

from .vector import silu_float

__all__ = ["attention_mask", "rope_angles", "rotate_half", "apply_rope", "layernorm", "rmsnorm",
           "gelu", "silu", "block_forward",
           "model_forward", "random_weights", "weight_names", "check_weights", "checked_tensor"]


def attention_mask(seq: int, window: int, causal: bool, pos_base: int = 0) -> np.ndarray:
    """[seq, seq] bool: query i may see key j."""
    i = np.arange(seq)[:, None] + pos_base
    j = np.arange(seq)[None, :] + pos_base
    if causal:
        mask = j <= i
        if window:
            mask &= j > i - window
    else:
        mask = np.ones((seq, seq), bool) if not window else np.abs(i - j) < window
    return mask


def rope_angles(d_head: int, theta: float, positions) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` [len(positions), d_head] of RoPE at ``positions`` (HF layout: the
    frequencies of the first half repeated for the second)."""
    inv = theta ** (-np.arange(0, d_head, 2, dtype=np.float64) / d_head)
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang), np.sin(ang)


def rotate_half(x):
    """``[x1, x2] -> [-x2, x1]`` over the last axis (each head's two halves)."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(cfg: ModelConfig, x, pos_base: int = 0):
    """RoPE of every head of ``x`` [seq, heads * d_head] at positions ``pos_base + row``."""
    seq, dh = x.shape[0], cfg.d_head
    cos, sin = rope_angles(dh, cfg.rope_theta, pos_base + np.arange(seq))
    heads = x.reshape(seq, -1, dh)
    return (heads * cos[:, None, :] + rotate_half(heads) * sin[:, None, :]).reshape(x.shape)


def layernorm(x, gamma, beta):
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0, (x - mean) / np.sqrt(var), 0.0)
    return z * gamma + beta


def rmsnorm(x, gamma):
    ms = np.mean(x * x, axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(ms > 0, x / np.sqrt(ms), 0.0)
    return z * gamma


def _norm(cfg: ModelConfig, w: dict, p: str, k: int, x):
    """LN ``k`` (1 or 2) of block ``p``: LayerNorm or RMSNorm by ``cfg.norm_kind``."""
    if cfg.rmsnorm:
        return rmsnorm(x, w[p + f"ln{k}.weight"])
    return layernorm(x, w[p + f"ln{k}.weight"], w[p + f"ln{k}.bias"])


def gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def silu(x):
    """x * sigmoid(x): the table's own float64 SiLU (:func:`sim.golden.vector.silu_float`)."""
    return silu_float(x)


def _act(cfg: ModelConfig, x):
    if cfg.activation == "gelu":
        return gelu(x)
    if cfg.activation == "relu":
        return np.maximum(x, 0.0)
    if cfg.activation == "silu":
        return silu(x)
    raise ValueError(f"activation={cfg.activation!r} is not simulated")


def weight_names(cfg: ModelConfig, layer: int) -> dict[str, tuple]:
    """Names and shapes of one block's tensors in the weights file."""
    d, f, kv = cfg.d_model, cfg.d_ff, cfg.d_kv
    p = f"layers.{layer}."
    names = {p + "attn.wq": (d, d), p + "attn.wk": (d, kv), p + "attn.wv": (d, kv),
             p + "attn.wo": (d, d)}
    names.update({p + "ln1.weight": (d,), p + "ln2.weight": (d,), p + "ffn.w1": (d, f),
                  p + "ffn.w2": (f, d)})
    if cfg.ffn == "gated":              # the gate, beside the up matrix w1
        names[p + "ffn.wg"] = (d, f)
        if cfg.bias:
            names[p + "ffn.bg"] = (f,)
    if not cfg.rmsnorm:                 # RMSNorm has no beta
        names.update({p + "ln1.bias": (d,), p + "ln2.bias": (d,)})
    if cfg.bias:
        names.update({p + "attn.bq": (d,), p + "attn.bk": (kv,), p + "attn.bv": (kv,),
                      p + "attn.bo": (d,)})
        names.update({p + "ffn.b1": (f,), p + "ffn.b2": (d,)})
    return names


def random_weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Float weights of a plausible scale (1/sqrt(fan-in) matrices, LN gamma near 1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(cfg.n_layers):
        for name, shape in weight_names(cfg, layer).items():
            if name.endswith(".weight"):
                out[name] = 1.0 + 0.1 * rng.standard_normal(shape)
            elif len(shape) == 2:
                out[name] = rng.standard_normal(shape) / math.sqrt(shape[0])
            else:
                out[name] = 0.05 * rng.standard_normal(shape)
    return out


def check_weights(cfg: ModelConfig, weights: dict, source: str = "weights") -> dict:
    """Validate names and shapes; return float64 arrays. Missing optional biases become 0."""
    out = {}
    for layer in range(cfg.n_layers):
        for name, shape in weight_names(cfg, layer).items():
            out[name] = checked_tensor(weights, name, shape, source)
    return out


def checked_tensor(tensors: dict, name: str, shape: tuple, source: str) -> np.ndarray:
    """``tensors[name]`` as float64, refused (naming ``source``) when it is missing, of
    another shape than ``shape`` or not finite."""
    if name not in tensors:
        raise ValueError(f"{name} missing from {source}")
    arr = np.asarray(tensors[name], np.float64)
    if arr.shape != shape:
        raise ValueError(f"{name} has shape {list(arr.shape)}, expected {list(shape)} "
                         f"({source})")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} has non-finite values ({source})")
    return arr


def _mha(cfg, w, p, h, record, pos_base):
    s, d, dh = h.shape[0], cfg.d_model, cfg.d_head
    q = h @ w[p + "attn.wq"] + w.get(p + "attn.bq", 0.0)
    k = h @ w[p + "attn.wk"] + w.get(p + "attn.bk", 0.0)
    v = h @ w[p + "attn.wv"] + w.get(p + "attn.bv", 0.0)
    record.update({p + "q": q, p + "k": k})
    if cfg.rope:
        q, k = apply_rope(cfg, q, pos_base), apply_rope(cfg, k, pos_base)
        record.update({p + "q_rope": q, p + "k_rope": k})
    mask = attention_mask(s, cfg.window, cfg.causal, pos_base)
    o = np.zeros((s, d))
    scores_max = 0.0
    for hd in range(cfg.n_heads):
        sl = slice(hd * dh, (hd + 1) * dh)
        kv = hd // cfg.kv_group
        kvs = slice(kv * dh, (kv + 1) * dh)
        sc = q[:, sl] @ k[:, kvs].T / math.sqrt(dh)
        scores_max = max(scores_max, float(np.abs(np.where(mask, sc, 0)).max(initial=0)))
        sc = np.where(mask, sc, -np.inf)
        sc = sc - sc.max(axis=1, keepdims=True)
        e = np.exp(sc)
        pr = e / e.sum(axis=1, keepdims=True)
        o[:, sl] = pr @ v[:, kvs]
    a = o @ w[p + "attn.wo"] + w.get(p + "attn.bo", 0.0)
    record.update({p + "v": v, p + "attn_o": o, p + "attn_out": a,
                   p + "scores_absmax": scores_max})
    return a


def _ffn(cfg, w, p, h, record):
    pre = h @ w[p + "ffn.w1"] + w.get(p + "ffn.b1", 0.0)
    if cfg.ffn == "gated":
        gate = h @ w[p + "ffn.wg"] + w.get(p + "ffn.bg", 0.0)
        gact = _act(cfg, gate)
        record.update({p + "ffn_gate": gate, p + "ffn_gact": gact})
        act = gact * pre
    else:
        act = _act(cfg, pre)
    f = act @ w[p + "ffn.w2"] + w.get(p + "ffn.b2", 0.0)
    record.update({p + "ffn_pre": pre, p + "ffn_act": act, p + "ffn_out": f})
    return f


def block_forward(cfg: ModelConfig, w: dict, layer: int, x, record: dict | None = None,
                  pos_base: int = 0):
    """One block on [seq, d_model] float64 activations."""
    record = {} if record is None else record
    p = f"layers.{layer}."
    record[p + "in"] = x
    if cfg.norm == "pre":
        h = _norm(cfg, w, p, 1, x)
        record[p + "ln1_out"] = h
        x = x + _mha(cfg, w, p, h, record, pos_base)
        record[p + "mid"] = x
        h = _norm(cfg, w, p, 2, x)
        record[p + "ln2_out"] = h
        x = x + _ffn(cfg, w, p, h, record)
    else:
        r = x + _mha(cfg, w, p, x, record, pos_base)
        record[p + "mid_pre"] = r
        x = _norm(cfg, w, p, 1, r)
        record[p + "mid"] = x
        r = x + _ffn(cfg, w, p, x, record)
        record[p + "out_pre"] = r
        x = _norm(cfg, w, p, 2, r)
    record[p + "out"] = x
    return x


def model_forward(cfg: ModelConfig, w: dict, x, record: dict | None = None):
    """All blocks; ``x`` is [seq, d_model] (or [batch, seq, d_model], batch rows independent)."""
    x = np.asarray(x, np.float64)
    if x.ndim == 3:
        return np.stack([model_forward(cfg, w, xb, record) for xb in x])
    for layer in range(cfg.n_layers):
        x = block_forward(cfg, w, layer, x, record)
    return x
