"""Test support for the Llama family in sim.models.checkpoint: tiny random checkpoints in
transformers' layout (a folder: config.json, safetensors, optionally sharded) and in llama.cpp's
(a GGUF file written with ``gguf.GGUFWriter``: Q and K rows permuted as convert_hf_to_gguf.py
permutes them, quantised tensors), and the Hugging Face Llama forward pass in float64 NumPy,
computed from the raw ``[out, in]`` tensors by transformers' names, independently of the
importer's mapping (:func:`llama_forward`): RMSNorm with an epsilon, RoPE with rotate_half,
grouped-query attention by repeating K/V heads, SwiGLU, causal (optionally sliding-window)
masks, the final RMSNorm and the LM head.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import safetensors.numpy
from gguf import GGMLQuantizationType as Q
from gguf import quants

#: Model types and the architecture name of their CausalLM class.
CAUSAL_LM = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
             "qwen2": "Qwen2ForCausalLM"}


def _normal(rng, shape, std):
    return (std * rng.standard_normal(shape)).astype(np.float32)


def llama_tensors(*, seed=0, layers=2, d=32, heads=4, kv_heads=2, d_ff=64, vocab=48,
                  tied=False, attn_bias=(), mlp_bias=False) -> dict[str, np.ndarray]:
    """Random tensors by transformers' names (``model.`` prefix, ``lm_head`` beside it),
    torch's ``[out, in]`` for every Linear. ``attn_bias``: which of q, k, v, o carry a bias."""
    rng = np.random.default_rng(seed)
    kv = kv_heads * (d // heads)
    t = {"model.embed_tokens.weight": _normal(rng, (vocab, d), 1.0),
         "model.norm.weight": 1 + _normal(rng, (d,), 0.1)}
    if not tied:
        t["lm_head.weight"] = _normal(rng, (vocab, d), 1 / math.sqrt(d))
    for i in range(layers):
        h = f"model.layers.{i}."
        for name, (o, n) in (("self_attn.q_proj", (d, d)), ("self_attn.k_proj", (kv, d)),
                             ("self_attn.v_proj", (kv, d)), ("self_attn.o_proj", (d, d)),
                             ("mlp.gate_proj", (d_ff, d)), ("mlp.up_proj", (d_ff, d)),
                             ("mlp.down_proj", (d, d_ff))):
            t[h + name + ".weight"] = _normal(rng, (o, n), 1 / math.sqrt(n))
            if (name.startswith("self_attn") and name[10] in attn_bias) or (
                    mlp_bias and name.startswith("mlp")):
                t[h + name + ".bias"] = _normal(rng, (o,), 0.1)
        for name in ("input_layernorm", "post_attention_layernorm"):
            t[h + name + ".weight"] = 1 + _normal(rng, (d,), 0.1)
    return t


def llama_config(family="llama", *, layers=2, d=32, heads=4, kv_heads=2, d_ff=64, vocab=48,
                 positions=32, theta=10000.0, eps=1e-5, tied=False, **extra) -> dict:
    cfg = {"model_type": family, "architectures": [CAUSAL_LM[family]], "hidden_act": "silu",
           "hidden_size": d, "intermediate_size": d_ff, "num_hidden_layers": layers,
           "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "max_position_embeddings": positions, "rms_norm_eps": eps, "rope_theta": theta,
           "rope_scaling": None, "tie_word_embeddings": tied, "vocab_size": vocab,
           "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    if family == "llama":
        cfg.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    if family == "mistral":
        cfg["sliding_window"] = None
    if family == "qwen2":
        cfg.update(use_sliding_window=False, sliding_window=4096, max_window_layers=28)
    cfg.update(extra)
    return cfg


def write_folder(path: Path, tensors: dict, config: dict, *, shards: int = 1,
                 dtype=np.float32) -> Path:
    """config.json and model.safetensors, or ``shards`` files named by
    model.safetensors.index.json (as save_pretrained splits a large model)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    t = {k: v.astype(dtype) for k, v in tensors.items()}
    if shards == 1:
        safetensors.numpy.save_file(t, str(path / "model.safetensors"))
        return path
    names = sorted(t)
    weight_map = {}
    for k in range(shards):
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = names[k::shards]
        safetensors.numpy.save_file({n: t[n] for n in part}, str(path / file))
        weight_map.update(dict.fromkeys(part, file))
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum(v.nbytes for v in t.values())},
         "weight_map": weight_map}))
    return path


# ---- the Hugging Face forward pass -------------------------------------------------------------

def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def llama_forward(t: dict, config: dict, ids, *, eps=None, window=None):
    """``(states, logits)``: the embedding output and each decoder layer's output of
    ``LlamaModel`` (float64; ``eps`` defaults to the config's ``rms_norm_eps``), and the LM
    head's logits after the final norm (always with the config's epsilon)."""
    t = {k: np.asarray(v, np.float64) for k, v in t.items()}
    cfg_eps = config["rms_norm_eps"]
    eps = cfg_eps if eps is None else eps
    H, KV = config["num_attention_heads"], config["num_key_value_heads"]
    d = config["hidden_size"]
    dh = d // H
    ids = np.asarray(ids)
    s = len(ids)
    x = t["model.embed_tokens.weight"][ids]
    states = [x]
    inv = 1.0 / config["rope_theta"] ** (np.arange(0, dh, 2, dtype=np.float64) / dh)
    freqs = np.outer(np.arange(s, dtype=np.float64), inv)
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    mask = j <= i
    if window:
        mask &= j > i - window
    for layer in range(config["num_hidden_layers"]):
        h = f"model.layers.{layer}."

        def lin(name, v, h=h):
            out = v @ t[h + name + ".weight"].T
            return out + t[h + name + ".bias"] if h + name + ".bias" in t else out

        a = _rms(x, t[h + "input_layernorm.weight"], eps)
        q = lin("self_attn.q_proj", a).reshape(s, H, dh).transpose(1, 0, 2)
        k = lin("self_attn.k_proj", a).reshape(s, KV, dh).transpose(1, 0, 2)
        v = lin("self_attn.v_proj", a).reshape(s, KV, dh).transpose(1, 0, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k, v = np.repeat(k, H // KV, axis=0), np.repeat(v, H // KV, axis=0)   # repeat_kv
        scores = np.where(mask, q @ k.transpose(0, 2, 1) / math.sqrt(dh), -np.inf)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(s, d)
        x = x + lin("self_attn.o_proj", ctx)
        m = _rms(x, t[h + "post_attention_layernorm.weight"], eps)
        x = x + lin("mlp.down_proj", _silu(lin("mlp.gate_proj", m)) * lin("mlp.up_proj", m))
        states.append(x)
    head = t.get("lm_head.weight", t["model.embed_tokens.weight"])
    logits = _rms(x, t["model.norm.weight"], cfg_eps) @ head.T
    return states, logits


def rel_err(got, want) -> float:
    return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


# ---- llama.cpp's layout ------------------------------------------------------------------------

def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: Hugging Face's RoPE halves to GGML's
    interleaved pairs (K with the K/V head count)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
               "post_attention_layernorm": "ffn_norm"}


def gguf_name(hf: str) -> str:
    """llama.cpp's name of a transformers tensor (a name of neither kind, e.g.
    ``rope_freqs.weight``, is llama.cpp's already)."""
    if not hf.startswith(("model.", "lm_head.")):
        return hf
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_GGUF_NAMES[module]}.{kind}"


_NUMPY_TYPES = (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1)


def dequantize_numpy(raw: np.ndarray, kind: Q, shape) -> np.ndarray:
    """BF16, and Q8_0, Q4_0, Q4_1 blocks of 32 by ggml's layout, in NumPy (independent of gguf's own
    dequantize): Q8_0 = f16 d, 32 int8 q: d q; Q4_0 = f16 d, 16 bytes of nibbles (low nibbles
    are elements 0..15, high 16..31): d (q - 8); Q4_1 = f16 d, f16 m, nibbles: d q + m."""
    if kind == Q.BF16:          # the top half of float32
        half = np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32)
        return (half << 16).view(np.float32).reshape(shape)
    blocks = np.ascontiguousarray(raw).reshape(-1, {Q.Q8_0: 34, Q.Q4_0: 18, Q.Q4_1: 20}[kind])
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    if kind == Q.Q8_0:
        x = d * blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    else:
        start = 2 if kind == Q.Q4_0 else 4
        nib = blocks[:, start:]
        q = np.concatenate([nib & 0xF, nib >> 4], axis=1).astype(np.float32)
        if kind == Q.Q4_0:
            x = d * (q - 8)
        else:
            x = d * q + blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    return x.reshape(shape)


def write_gguf(path: Path, tensors: dict, config: dict, *, arch="llama", types=None,
               tokenizer=None, extra=None, skip=()) -> dict[str, np.ndarray]:
    """The checkpoint as llama.cpp's converter writes it: GGUF names, Q and K rows permuted
    (``arch="llama"``; qwen2 is not permuted), each tensor in ``types[gguf_name]`` (default:
    F32 for vectors, F16 for matrices). Returns the tensors by transformers' names as the file
    holds them after dequantisation (unpermuted): what an exact import must give back."""
    H, KV = config["num_attention_heads"], config["num_key_value_heads"]
    types = types or {}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(config["rope_theta"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_dimension_count(config["hidden_size"] // H)
    w.add_file_type(1)
    for key, value in (extra or {}).items():
        getattr(w, key)(*value)
    for key, value in (tokenizer or {}).items():
        getattr(w, key)(value)
    exact = {}
    for hf, arr in tensors.items():
        name = gguf_name(hf)
        if name in skip:
            continue
        a = np.asarray(arr, np.float32)
        heads = {"attn_q": H, "attn_k": KV}.get(name.split(".")[2]) if name.startswith(
            "blk.") else None
        if arch == "llama" and heads:
            a = permute(a, heads)
        kind = types.get(name, Q.F32 if a.ndim == 1 else Q.F16)
        if kind == Q.F32:
            data, back = a, a
        elif kind == Q.F16:
            data = a.astype(np.float16)
            back = data.astype(np.float32)
        else:
            data = quants.quantize(a, kind)
            back = (dequantize_numpy(data, kind, a.shape) if kind in _NUMPY_TYPES else
                    quants.dequantize(data, kind))      # types the importer refuses
        w.add_tensor(name, data, raw_dtype=kind if kind not in (Q.F32, Q.F16) else None)
        exact[hf] = (np.ascontiguousarray(_unpermute_ref(back, heads)) if arch == "llama"
                     and heads else back)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return exact


def _unpermute_ref(w, n_head):
    """The inverse of :func:`permute` by its definition: the row permutation's argsort."""
    order = permute(np.arange(w.shape[0]), n_head)
    inverse = np.argsort(order)
    return w[inverse]
