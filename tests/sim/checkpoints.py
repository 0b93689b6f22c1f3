"""Test support for sim.models.checkpoint: tiny random Hugging Face checkpoints written with
safetensors,
and each family's own arithmetic in NumPy, computed from the checkpoint's raw tensors (their
names, their layouts) independently of the importer's mapping:

- :func:`bert_states`: Hugging Face ``BertModel`` (post-norm; Linear weights ``[out, in]``;
  LayerNorm with the checkpoint's epsilon; erf GELU), hidden states after the embeddings and
  after each layer;
- :func:`gpt2_states`: ``GPT2Model`` (pre-norm; Conv1D weights ``x @ W``; fused ``c_attn``;
  ``gelu_new``; causal), the embedding output and each block's output before ``ln_f``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import safetensors.numpy

#: A small WordPiece vocabulary: special tokens, words, continuation pieces, punctuation.
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "man", "is", "play", "##ing",
         "guitar", "on", "stage", ".", ",", "the", "crowd", "sing", "##s", "along", "un",
         "##believ", "##able", "cafe", "中", "文", "!", "'", "t", "don", "-", "key", "##board",
         "x", "##y"]


def _normal(rng, shape, std):
    return (std * rng.standard_normal(shape)).astype(np.float32)


def write_bert(path: Path, *, seed=0, layers=2, d=32, heads=4, d_ff=64, positions=24,
               prefix="", config=None, tokenizer_config=None, sentence_config=None,
               vocab=True) -> dict:
    """A random BERT checkpoint in ``path``; returns its raw tensors (by unprefixed name)."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    t = {"embeddings.word_embeddings.weight": _normal(rng, (len(VOCAB), d), 0.8),
         "embeddings.position_embeddings.weight": _normal(rng, (positions, d), 0.3),
         "embeddings.token_type_embeddings.weight": _normal(rng, (2, d), 0.3),
         "embeddings.LayerNorm.weight": 1 + _normal(rng, (d,), 0.1),
         "embeddings.LayerNorm.bias": _normal(rng, (d,), 0.1),
         "embeddings.position_ids": np.arange(positions, dtype=np.int64)[None, :],
         "pooler.dense.weight": _normal(rng, (d, d), 0.1),
         "pooler.dense.bias": _normal(rng, (d,), 0.1)}
    for i in range(layers):
        h = f"encoder.layer.{i}."
        for name, (o, n) in (("attention.self.query", (d, d)), ("attention.self.key", (d, d)),
                             ("attention.self.value", (d, d)),
                             ("attention.output.dense", (d, d)),
                             ("intermediate.dense", (d_ff, d)), ("output.dense", (d, d_ff))):
            t[h + name + ".weight"] = _normal(rng, (o, n), 1 / math.sqrt(n))
            t[h + name + ".bias"] = _normal(rng, (o,), 0.1)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[h + name + ".weight"] = 1 + _normal(rng, (d,), 0.1)
            t[h + name + ".bias"] = _normal(rng, (d,), 0.1)
    cfg = {"model_type": "bert", "architectures": ["BertModel"], "hidden_act": "gelu",
           "hidden_size": d, "intermediate_size": d_ff, "layer_norm_eps": 1e-12,
           "max_position_embeddings": positions, "num_attention_heads": heads,
           "num_hidden_layers": layers, "type_vocab_size": 2, "vocab_size": len(VOCAB),
           "position_embedding_type": "absolute", "pad_token_id": 0}
    cfg.update(config or {})
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    safetensors.numpy.save_file({prefix + k: v for k, v in t.items()},
                                str(path / "model.safetensors"))
    if vocab:
        (path / "vocab.txt").write_text("".join(v + "\n" for v in VOCAB), encoding="utf-8")
    if tokenizer_config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if sentence_config is not None:
        (path / "sentence_bert_config.json").write_text(json.dumps(sentence_config))
    return t


def write_gpt2(path: Path, *, seed=0, layers=2, d=32, heads=4, d_ff=None, positions=24,
               vocab=50, prefix="", config=None, mask_buffers=True) -> dict:
    """A random GPT-2 checkpoint in ``path``; returns its raw tensors (by unprefixed name)."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    inner = d_ff or 4 * d
    t = {"wte.weight": _normal(rng, (vocab, d), 0.8), "wpe.weight": _normal(rng, (positions, d),
                                                                             0.3),
         "ln_f.weight": 1 + _normal(rng, (d,), 0.1), "ln_f.bias": _normal(rng, (d,), 0.1)}
    for i in range(layers):
        h = f"h.{i}."
        for name, (n, o) in (("attn.c_attn", (d, 3 * d)), ("attn.c_proj", (d, d)),
                             ("mlp.c_fc", (d, inner)), ("mlp.c_proj", (inner, d))):
            t[h + name + ".weight"] = _normal(rng, (n, o), 1 / math.sqrt(n))
            t[h + name + ".bias"] = _normal(rng, (o,), 0.1)
        for name in ("ln_1", "ln_2"):
            t[h + name + ".weight"] = 1 + _normal(rng, (d,), 0.1)
            t[h + name + ".bias"] = _normal(rng, (d,), 0.1)
        if mask_buffers:   # the causal-mask buffers older checkpoints carry
            t[h + "attn.bias"] = np.tril(np.ones((positions, positions), np.float32))[None,
                                                                                      None]
            t[h + "attn.masked_bias"] = np.array(-1e4, np.float32)
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
           "activation_function": "gelu_new", "n_embd": d, "n_head": heads, "n_layer": layers,
           "n_positions": positions, "n_inner": d_ff, "vocab_size": vocab,
           "layer_norm_epsilon": 1e-5, "scale_attn_weights": True}
    cfg.update(config or {})
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    safetensors.numpy.save_file({prefix + k: v for k, v in t.items()},
                                str(path / "model.safetensors"))
    return t


def _ln(x, g, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * g + b


def _softmax(s):
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def gelu_erf(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _f64(t):
    return {k: np.asarray(v, np.float64) for k, v in t.items()}


def bert_states(t, config, ids, token_types=None) -> list[np.ndarray]:
    """``[embedding output, after layer 0, ..., after layer L-1]`` of BertModel (float64)."""
    t = _f64(t)
    eps = config.get("layer_norm_eps", 1e-12)
    heads = config["num_attention_heads"]
    ids = np.asarray(ids)
    types = np.zeros(len(ids), np.int64) if token_types is None else np.asarray(token_types)
    e = "embeddings."
    x = (t[e + "word_embeddings.weight"][ids] + t[e + "position_embeddings.weight"][:len(ids)]
         + t[e + "token_type_embeddings.weight"][types])
    x = _ln(x, t[e + "LayerNorm.weight"], t[e + "LayerNorm.bias"], eps)
    states = [x]
    for i in range(config["num_hidden_layers"]):
        h = f"encoder.layer.{i}."

        def lin(name, v, h=h):
            return v @ t[h + name + ".weight"].T + t[h + name + ".bias"]

        q, k, v = (lin(f"attention.self.{n}", x) for n in ("query", "key", "value"))
        s, d = x.shape
        dh = d // heads
        split = [a.reshape(s, heads, dh).transpose(1, 0, 2) for a in (q, k, v)]
        probs = _softmax(split[0] @ split[1].transpose(0, 2, 1) / math.sqrt(dh))
        ctx = (probs @ split[2]).transpose(1, 0, 2).reshape(s, d)
        a = _ln(lin("attention.output.dense", ctx) + x,
                t[h + "attention.output.LayerNorm.weight"],
                t[h + "attention.output.LayerNorm.bias"], eps)
        f = lin("output.dense", gelu_erf(lin("intermediate.dense", a)))
        x = _ln(f + a, t[h + "output.LayerNorm.weight"], t[h + "output.LayerNorm.bias"], eps)
        states.append(x)
    return states


def gpt2_states(t, config, ids, *, act=gelu_tanh, eps=None) -> list[np.ndarray]:
    """``[embedding output, after block 0, ..., after block L-1]`` of GPT2Model (float64),
    before ``ln_f``; ``act`` and ``eps`` default to the checkpoint's own (gelu_new, 1e-5)."""
    t = _f64(t)
    eps = config.get("layer_norm_epsilon", 1e-5) if eps is None else eps
    heads = config["n_head"]
    ids = np.asarray(ids)
    x = t["wte.weight"][ids] + t["wpe.weight"][:len(ids)]
    states = [x]
    s, d = x.shape
    dh = d // heads
    causal = np.tril(np.ones((s, s), bool))
    for i in range(config["n_layer"]):
        h = f"h.{i}."

        def conv(name, v, h=h):
            return v @ t[h + name + ".weight"] + t[h + name + ".bias"]

        qkv = conv("attn.c_attn", _ln(x, t[h + "ln_1.weight"], t[h + "ln_1.bias"], eps))
        q, k, v = (qkv[:, j * d:(j + 1) * d].reshape(s, heads, dh).transpose(1, 0, 2)
                   for j in range(3))
        scores = np.where(causal, q @ k.transpose(0, 2, 1) / math.sqrt(dh), -np.inf)
        ctx = (_softmax(scores) @ v).transpose(1, 0, 2).reshape(s, d)
        x = x + conv("attn.c_proj", ctx)
        m = conv("mlp.c_proj", act(conv("mlp.c_fc", _ln(x, t[h + "ln_2.weight"],
                                                        t[h + "ln_2.bias"], eps))))
        x = x + m
        states.append(x)
    return states


def cosine(a, b) -> float:
    a, b = np.ravel(a), np.ravel(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
