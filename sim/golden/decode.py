"""Golden models of greedy autoregressive decode: float64 reference and the integer chip model.

A decoder generates tokens one at a time: a **prefill** runs the prompt's ``P`` tokens through
every block at once, then each **decode step** runs one token, at position ``P + t``, through
every block, its attention reading the K and V that earlier tokens left in a **KV cache** (per
block: the rotated int8 K and the int8 V of every earlier position, ``[positions, d_kv]``; K/V
head ``g`` is lanes ``g * d_head .. (g + 1) * d_head``). Generating ``n`` tokens is a prefill
(which picks the first) and ``n - 1`` decode steps (each picks one more); the last token is not
fed back.

The integer model (what the chip computes, bit for bit):

- **Embedding:** the table is int8 ``[vocab, d_model]`` at one scale ``s_e``; token ``t``'s row
  becomes the int16 residual by ``REQUANT(E8[t], emb_req, 16)``. Models with learned positions
  (every model without RoPE) add ``REQUANT(P8[pos], pos_req, 16)`` with the saturating int16
  ``ADD``; RoPE models rotate Q and K at the token's position instead.
- **Blocks:** :func:`block_step`, the pre-norm block of :func:`sim.golden.layer.layer_int` with
  the attention over the cache (:func:`cached_attention`). Every operation but the attention is
  row by row and the integer softmax ignores masked lanes, so the logits at each position equal
  a prefill of the whole sequence at that position, bit for bit (:func:`prefill_logits`).
- **Head:** the final norm (LayerNorm or RMSNorm, int8 out) and the LM head, an int8 matmul
  (the embedding table transposed when tied, else its own int8 matrix) requantised per column
  to int16 logits.
- **Argmax** (:func:`argmax_int`): the largest int16 logit; **the lowest index wins a tie**.

The parameters (``qm``: :class:`sim.compiler.quantize.QModel`; ``head``:
:class:`sim.compiler.decode_quant.QHead`) are calibrated once, on the float prefill of the prompt,
and stay fixed for every step.
"""

from __future__ import annotations

import numpy as np

from hw.spec import ModelConfig
from hw.spec.attention import chunk_order

from .float_model import layernorm as layernorm_float
from .float_model import model_forward
from .float_model import rmsnorm as rmsnorm_float
from .layer import attention_int, layer_int, linear, model_int, norm_rows
from .matmul import requant
from .vector import residual_add

__all__ = ["head_weight_names", "random_head_weights", "learned_positions", "check_decode",
           "embed_float", "logits_float", "generate_float", "argmax_int", "embed_int",
           "cached_attention", "block_step", "head_int", "KVCache", "generate_int",
           "prefill_logits", "split_kv_order", "prefill_order"]


def learned_positions(cfg: ModelConfig) -> bool:
    """A model without RoPE adds a learned position embedding to the token's row."""
    return not cfg.rope


def check_decode(cfg: ModelConfig, context: int):
    """ValueError (one line) unless ``cfg`` can decode a ``context``-token sequence here."""
    if not cfg.causal:
        raise ValueError("decode needs a causal model (causal = false)")
    if cfg.norm != "pre":
        raise ValueError(f'decode supports pre-norm models, not norm = "{cfg.norm}"')
    if cfg.vocab_size < 1:
        raise ValueError(f"decode needs vocab_size >= 1, not {cfg.vocab_size}")
    if learned_positions(cfg) and context > cfg.seq_len:
        raise ValueError(f"context {context} exceeds the {cfg.seq_len} learned positions "
                         "(seq_len)")


def head_weight_names(cfg: ModelConfig) -> dict[str, tuple]:
    """Names and shapes of the embedding, final norm and LM head tensors (``x @ W``)."""
    d, v = cfg.d_model, cfg.vocab_size
    names = {"embed.weight": (v, d), "norm.weight": (d,)}
    if learned_positions(cfg):
        names["pos.weight"] = (cfg.seq_len, d)
    if not cfg.rmsnorm:
        names["norm.bias"] = (d,)
    if not cfg.tie_embeddings:
        names["lm_head.weight"] = (d, v)
    return names


def random_head_weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Float head tensors of a plausible scale (seeded)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in head_weight_names(cfg).items():
        if name == "norm.weight":
            out[name] = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "norm.bias":
            out[name] = 0.05 * rng.standard_normal(shape)
        elif name == "lm_head.weight":
            out[name] = rng.standard_normal(shape) / np.sqrt(shape[0])
        else:
            out[name] = rng.standard_normal(shape)
    return out


def _ids(cfg: ModelConfig, ids) -> np.ndarray:
    ids = np.asarray(ids, np.int64).reshape(-1)
    bad = np.flatnonzero((ids < 0) | (ids >= cfg.vocab_size))
    if bad.size:
        raise ValueError(f"token id {int(ids[bad[0]])} at index {int(bad[0])} is outside "
                         f"0..{cfg.vocab_size - 1} (vocab_size)")
    return ids


def embed_float(cfg: ModelConfig, hw: dict, ids, pos_base: int = 0) -> np.ndarray:
    """Float embedding rows [len(ids), d_model] (positions added when learned)."""
    ids = _ids(cfg, ids)
    x = np.asarray(hw["embed.weight"], np.float64)[ids]
    if learned_positions(cfg):
        x = x + np.asarray(hw["pos.weight"], np.float64)[pos_base + np.arange(len(ids))]
    return x


def logits_float(cfg: ModelConfig, hw: dict, x, record: dict | None = None) -> np.ndarray:
    """Float final norm and LM head of the blocks' output rows."""
    if cfg.rmsnorm:
        h = rmsnorm_float(x, hw["norm.weight"])
    else:
        h = layernorm_float(x, hw["norm.weight"], hw["norm.bias"])
    w = hw["embed.weight"].T if cfg.tie_embeddings else hw["lm_head.weight"]
    out = h @ w
    if record is not None:
        record.update(final_norm=h, logits=out)
    return out


def generate_float(cfg: ModelConfig, weights: dict, hw: dict, prompt, n: int) -> dict:
    """Float64 greedy decode (each step recomputes the whole sequence): ``ids`` (the ``n``
    generated) and ``logits`` [n, vocab] (the logits each was picked from)."""
    seq = list(_ids(cfg, prompt))
    ids, rows = [], []
    for _ in range(n):
        x = model_forward(cfg, weights, embed_float(cfg, hw, seq))
        row = logits_float(cfg, hw, x[-1:])[0]
        rows.append(row)
        ids.append(int(np.argmax(row)))
        seq.append(ids[-1])
    return {"ids": np.array(ids, np.int64), "logits": np.array(rows)}


def argmax_int(logits) -> tuple[int, int]:
    """``(index, value)`` of the largest integer logit; the lowest index wins a tie."""
    logits = np.asarray(logits, np.int64).reshape(-1)
    if logits.size == 0:
        raise ValueError("argmax of an empty logit row")
    i = int(np.argmax(logits))           # numpy returns the first maximum
    return i, int(logits[i])


def embed_int(cfg: ModelConfig, head, ids, pos_base: int = 0) -> np.ndarray:
    """The int16 residual rows of ``ids`` at positions ``pos_base ..``."""
    ids = _ids(cfg, ids)
    x = requant(head.emb8[ids], *head.emb_req, 16)
    if learned_positions(cfg):
        pos = pos_base + np.arange(len(ids))
        x = residual_add(x, requant(head.pos8[pos], *head.pos_req, 16))
    return x


def cached_attention(cfg: ModelConfig, layer, q, keys, values, pos_base: int,
                     kv_order=None) -> np.ndarray:
    """Attention of the int8 queries ``q`` [rows, d_model] at positions ``pos_base ..`` over the
    cache ``keys``, ``values`` [positions, d_kv] (position j in row j; causal, windowed where the
    model is) -> int8 [rows, d_model]. Masked lanes take no part in the integer softmax, so
    the cache's length beyond the visible positions does not change a bit. ``kv_order``
    (long context): runs of query rows (from 0) and their key chunks (cache positions) in
    merge order, the partial softmaxes merged (:func:`sim.golden.ring_softmax.chunked_attention`)
    instead of one softmax per row."""
    rows = q.shape[0]
    if keys.shape[0] < 2:               # the softmax takes rows of 2 lanes or more: pad, masked
        pad = np.zeros((2 - keys.shape[0], keys.shape[1]), np.int64)
        keys, values = np.concatenate([keys, pad]), np.concatenate([values, pad])
    i = pos_base + np.arange(rows)[:, None]
    j = np.arange(keys.shape[0])[None, :]
    mask = j <= i
    if cfg.window:
        mask &= j > i - cfg.window
    return attention_int(cfg, layer, q, keys, values, mask=mask, kv_order=kv_order)


def prefill_order(prompt_len: int, ring: int | None) -> list | None:
    """The merge order of a prefill of ``prompt_len`` tokens on a chip whose K/V ring holds
    ``ring`` keys: None (one softmax per row) when the prompt fits the ring, else one chip in
    passes of ``ring`` queries over chunks of ``ring`` keys (``hw.spec.attention.chunk_order``,
    causal)."""
    if ring is None or prompt_len <= ring:
        return None
    return chunk_order(prompt_len, ring, causal=True, ring=ring)


def split_kv_order(chunks, pos: int) -> list:
    """The key chunks of a decode query at position ``pos`` over a KV cache split in
    ``chunks`` (``[(start, stop), ...]`` of positions, chip by chip) in merge order: the chunks
    that hold a position up to ``pos`` (each cut at ``pos``), **from the last chip to the
    first** (the order the state rows travel down the chain of chips: the last chip, which
    caches the generated tokens, starts the merge and chip 0 normalises)."""
    out = [(a, min(b, pos + 1)) for a, b in reversed(list(chunks)) if a <= pos]
    if not out or out[-1][0] != 0:
        raise ValueError(f"the chunks {list(chunks)} do not start at position 0")
    return out


class KVCache:
    """Per block, the int8 K (rotated) and V of every position so far, ``[positions, d_kv]``."""

    def __init__(self, cfg: ModelConfig):
        empty = np.zeros((0, cfg.d_kv), np.int64)
        self.keys = [empty] * cfg.n_layers
        self.values = [empty] * cfg.n_layers

    @property
    def length(self) -> int:
        return self.keys[0].shape[0]

    def bytes(self) -> int:
        """int8 bytes held (K and V of every block)."""
        return sum(k.size + v.size for k, v in zip(self.keys, self.values, strict=True))


def block_step(qm, i: int, x, cache: KVCache, pos_base: int, record: dict | None = None,
               kv_order=None):
    """Pre-norm block ``i`` on the int16 rows ``x`` at positions ``pos_base ..``: appends their
    K and V to ``cache`` (which must hold exactly the positions below ``pos_base``);
    ``kv_order``: the attention's merge order (:func:`cached_attention`)."""
    if cache.keys[i].shape[0] != pos_base:
        raise ValueError(f"block {i}'s cache holds {cache.keys[i].shape[0]} positions, the rows "
                         f"start at {pos_base}")

    def attend(q, k, v):
        cache.keys[i] = np.concatenate([cache.keys[i], k])
        cache.values[i] = np.concatenate([cache.values[i], v])
        return cached_attention(qm.cfg, qm.layers[i], q, cache.keys[i], cache.values[i],
                                pos_base, kv_order)
    return layer_int(qm, i, x, None, record, pos_base=pos_base, attend=attend)[0]


def head_int(cfg: ModelConfig, head, x) -> np.ndarray:
    """The int16 logits [rows, vocab] of the blocks' int16 output rows (llm16c: the final
    norm as the blocks', :func:`sim.golden.layer.norm_rows`)."""
    _, h = norm_rows(head, x, head.norm, cfg.rmsnorm)
    return linear(h, head.lm)


def _forward(qm, head, ids, cache: KVCache, kv_order=None) -> np.ndarray:
    pos = cache.length
    x = embed_int(qm.cfg, head, ids, pos)
    for i in range(qm.cfg.n_layers):
        x = block_step(qm, i, x, cache, pos, kv_order=kv_order)
    return head_int(qm.cfg, head, x)


def generate_int(qm, head, prompt, n: int, *, ring: int | None = None,
                 kv_chunks=None) -> dict:
    """Integer greedy decode: the prefill of ``prompt``, then ``n - 1`` one-token steps.

    Long context (split-KV decode, ``sim.compiler.decode_split``): ``ring`` (the chip's
    ``attn_window``) runs a prompt longer than it in passes (:func:`prefill_order`), and
    ``kv_chunks`` (the positions each chip caches) merges each step's attention over the chips'
    chunks (:func:`split_kv_order`); one chunk (a step whose keys one chip holds) is one
    softmax.

    Returns ``ids`` [n] (the generated tokens), ``logits`` [n, vocab] (the int16 row each was
    picked from: the prefill's last row, then each step's), ``prefill`` (the prefill's logits,
    [P, vocab]) and ``cache`` (the :class:`KVCache` after the last step).
    """
    cfg = qm.cfg
    prompt = _ids(cfg, prompt)
    if n < 1:
        raise ValueError(f"the number of generated tokens must be >= 1, not {n}")
    if prompt.size < 1:
        raise ValueError("the prompt needs at least one token")
    check_decode(cfg, prompt.size + n - 1)
    cache = KVCache(cfg)
    pre = _forward(qm, head, prompt, cache, prefill_order(prompt.size, ring))
    rows = [pre[-1]]
    ids = [argmax_int(pre[-1])[0]]
    for _ in range(n - 1):
        order = None
        if kv_chunks is not None:
            chunks = split_kv_order(kv_chunks, cache.length)
            order = [(0, 1, chunks)] if len(chunks) > 1 else None
        rows.append(_forward(qm, head, [ids[-1]], cache, order)[0])
        ids.append(argmax_int(rows[-1])[0])
    return {"ids": np.array(ids, np.int64), "logits": np.array(rows, np.int64),
            "prefill": pre, "cache": cache}


def prefill_logits(qm, head, ids) -> np.ndarray:
    """The int16 logits at every position of one prefill of the whole sequence ``ids``, by the
    prefill golden model (:func:`sim.golden.layer.model_int`, no cache)."""
    ids = _ids(qm.cfg, ids)
    check_decode(qm.cfg, ids.size)
    return head_int(qm.cfg, head, model_int(qm, embed_int(qm.cfg, head, ids)))
