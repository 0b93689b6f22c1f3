"""sim.models.checkpoint for the Llama family: Hugging Face Llama, Mistral and Qwen2 folders and
llama.cpp GGUF files, checked against the Hugging Face Llama forward pass in float64 NumPy
(tests/sim/llama_checkpoints.py, from the raw tensors by transformers' names); the tokenisers;
and every refusal, one line naming the key and its value.

The float reference's RMSNorm has epsilon 0 (the integer unit's); the comparisons to 1e-9
relative are against the Hugging Face arithmetic with epsilon 0, and the checkpoint's own
epsilon is measured against a bound (:func:`_eps_bound`).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import RopeScalingType
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from sim.cli import main
from sim.errors import EXIT_BAD_INPUT, BadInput
from sim.golden.float_model import model_forward, weight_names
from sim.models.checkpoint import embed, import_checkpoint, load_import, logits, tokenize
from sim.models.gguf_file import unpermute

from ..llama_checkpoints import (
    llama_config,
    llama_forward,
    llama_tensors,
    permute,
    rel_err,
    write_folder,
    write_gguf,
)

IDS = [1, 7, 30, 2, 2, 45, 11, 0, 19, 33, 8, 40]


def _imported(result, ids):
    """The float reference on the imported files: the blocks' output for ``ids``."""
    cfg = replace(result.model, seq_len=len(ids))
    with np.load(result.weights_path) as npz:
        w = {k: np.asarray(npz[k], np.float64) for k in npz.files}
    x0 = embed(result, ids, dtype=np.float64)
    return cfg, w, x0, model_forward(cfg, w, x0)


def _eps_bound(states, eps):
    """A bound on how far RMSNorm's epsilon moves the blocks: a norm's output is scaled by
    sqrt(m / (m + eps)) for a row of mean square m, a relative change of at most
    delta = eps / (2 m_min) over every norm's inputs; to first order each of the 2 L norms
    moves the output by at most delta times the sublayer's gain, taken as 4 here (measured
    below 1 on these random weights)."""
    m_min = min(float(np.mean(x * x, axis=-1).min()) for x in states[:-1])
    delta = eps / (2 * m_min)
    return 4 * 2 * (len(states) - 1) * delta, delta


# ---- Hugging Face folders ----------------------------------------------------------------------

@pytest.mark.parametrize("shards, dtype", [(1, np.float32), (3, np.float32), (1, "bfloat16")])
def test_llama_folder_matches_hf_forward(tmp_path, shards, dtype):
    """A LlamaForCausalLM folder (GQA 4 query heads on 2 K/V heads, RoPE, SwiGLU, untied LM
    head), one file, three shards or bfloat16: the imported model's float reference equals
    the Hugging Face forward pass with epsilon 0 to 1e-9 relative, block by block; with the
    checkpoint's rms_norm_eps 1e-5 the difference is below the bound; the logits of the
    imported head equal Hugging Face's."""
    seed = 11 + shards
    print(f"seed {seed}, shards {shards}, {dtype}")
    raw = llama_tensors(seed=seed)
    config = llama_config()
    if dtype == "bfloat16":     # written as bfloat16 bytes, compared with the rounded values
        raw = {k: ((v.view(np.uint32) + 0x8000) & 0xFFFF0000).view(np.float32)
               for k, v in raw.items()}
        write_folder(tmp_path / "ckpt", raw, config)
        _write_bf16(tmp_path / "ckpt" / "model.safetensors", raw)
    else:
        write_folder(tmp_path / "ckpt", raw, config, shards=shards, dtype=dtype)
    result = import_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    cfg = result.model
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, cfg.d_ff) == \
        (2, 32, 4, 2, 8, 64)
    assert (cfg.norm, cfg.norm_kind, cfg.activation, cfg.ffn, cfg.bias, cfg.causal) == \
        ("pre", "rmsnorm", "silu", "gated", False, True)
    assert (cfg.rope_theta, cfg.window, cfg.seq_len, cfg.vocab_size, cfg.tie_embeddings) == \
        (10000.0, 0, 32, 48, False)
    assert result.architecture == "llama" and result.layer_norm_eps == 1e-5
    assert result.ignored == () and result.positions == 32
    with np.load(result.weights_path) as npz:
        assert set(npz.files) == {n for i in range(2) for n in weight_names(cfg, i)}
        assert np.array_equal(npz["layers.1.attn.wk"],
                              raw["model.layers.1.self_attn.k_proj.weight"].T)
    with np.load(result.embeddings_path) as npz:
        assert np.array_equal(npz["lm_head"], raw["lm_head.weight"])
    run, w, x0, out = _imported(result, IDS)
    assert np.array_equal(x0, raw["model.embed_tokens.weight"][IDS].astype(np.float64))
    ref, _ = llama_forward(raw, config, IDS, eps=0.0)
    x = x0
    for i in range(cfg.n_layers):
        x = model_forward(replace(run, n_layers=1), {k.replace(f"layers.{i}.", "layers.0."): v
                                                     for k, v in w.items()
                                                     if k.startswith(f"layers.{i}.")}, x)
        err = rel_err(x, ref[i + 1])
        print(f"layer {i}: relative max |diff| to HF (eps 0) {err:.2e}")
        assert err < 1e-9
    assert rel_err(out, ref[-1]) < 1e-9
    own, own_logits = llama_forward(raw, config, IDS)
    bound, delta = _eps_bound(own, 1e-5)
    dev = rel_err(out, own[-1])
    print(f"vs HF with rms_norm_eps 1e-5: relative {dev:.2e} (per-norm delta {delta:.2e}, "
          f"bound {bound:.2e})")
    assert 0 < dev < bound
    assert rel_err(logits(result, own[-1]), own_logits) < 1e-9
    assert any("RMSNorm eps 1e-05" in n for n in result.notes)


def _write_bf16(path, tensors):
    """A safetensors file of bfloat16 tensors by the format's layout (NumPy cannot write
    bfloat16): 8-byte header length, the JSON header, the data."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        blob = (tensors[name].view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


@pytest.mark.parametrize("family, extra, tensors, window", [
    ("mistral", {"sliding_window": 5}, {}, 5),
    ("mistral", {"sliding_window": 4096}, {}, 0),        # wider than seq_len: full attention
    ("qwen2", {}, {"attn_bias": "qkv"}, 0),
    ("llama", {"attention_bias": True, "mlp_bias": True}, {"attn_bias": "qkvo",
                                                           "mlp_bias": True}, 0),
    ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 4}, {"tied": True,
                                                                        "kv_heads": 4}, 0),
    ("llama", {"num_key_value_heads": 1, "rope_theta": 500000.0}, {"kv_heads": 1}, 0),
])
def test_families_match_hf_forward(tmp_path, family, extra, tensors, window):
    """Mistral's sliding window (honoured as window, or full attention when it spans the whole
    sequence), Qwen2's q/k/v biases (the others written as zeros), Llama's attention_bias and
    mlp_bias, tied embeddings, multi-query attention: each equals the HF forward pass (eps 0)
    to 1e-9 relative."""
    seed = 21
    print(f"seed {seed}: {family} {extra}")
    raw = llama_tensors(seed=seed, **tensors)
    kv = tensors.get("kv_heads", 2)
    config = llama_config(family, kv_heads=kv, tied=tensors.get("tied", False), **extra)
    write_folder(tmp_path / "ckpt", raw, config)
    result = import_checkpoint(tmp_path / "ckpt", tmp_path / "out", seq_len=16)
    cfg = result.model
    assert (cfg.window, cfg.n_kv_heads, cfg.tie_embeddings) == (window, kv, config[
        "tie_word_embeddings"])
    assert cfg.bias == bool(tensors.get("attn_bias"))
    ids = IDS + [3, 4, 5]
    _, w, _, out = _imported(result, ids)
    ref, ref_logits = llama_forward(raw, config, ids, eps=0.0, window=window)
    err = rel_err(out, ref[-1])
    print(f"relative max |diff| {err:.2e}")
    assert err < 1e-9
    if family == "qwen2":
        assert not w["layers.0.attn.bo"].any() and not w["layers.1.ffn.b2"].any()
        assert np.array_equal(w["layers.0.attn.bk"],
                              raw["model.layers.0.self_attn.k_proj.bias"])
        assert any("attn.bo, ffn.bg, ffn.b1, ffn.b2 are written as zeros" in n
                   for n in result.notes)
    with np.load(result.embeddings_path) as npz:
        assert ("lm_head" in npz.files) == (not config["tie_word_embeddings"])
    own, own_logits = llama_forward(raw, config, ids, window=window)
    assert rel_err(logits(result, own[-1]), own_logits) < 1e-9
    if extra.get("sliding_window"):
        assert any("sliding_window" in n for n in result.notes)


def test_folder_without_model_prefix_and_ignored_tensors(tmp_path):
    """A bare LlamaModel save (no ``model.`` prefix, no lm_head when tied); tensors beside
    the blocks (rotary inv_freq buffers) are listed as not imported."""
    raw = llama_tensors(seed=3, tied=True)
    bare = {k.removeprefix("model."): v for k, v in raw.items()}
    bare["layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)
    config = llama_config(tied=True, architectures=["LlamaModel"])
    write_folder(tmp_path / "ckpt", bare, config)
    result = import_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    assert result.ignored == ("layers.0.self_attn.rotary_emb.inv_freq",)
    _, _, _, out = _imported(result, IDS)
    assert rel_err(out, llama_forward(raw, config, IDS, eps=0.0)[0][-1]) < 1e-9


# ---- GGUF --------------------------------------------------------------------------------------

def test_unpermute_inverts_llama_cpp_permute():
    rng = np.random.default_rng(5)
    for heads, rows in ((4, 32), (2, 16), (1, 8), (8, 64)):
        w = rng.standard_normal((rows, 6))
        assert np.array_equal(unpermute(permute(w, heads), heads), w)
        b = rng.standard_normal(rows)
        assert np.array_equal(unpermute(permute(b, heads), heads), b)
        assert not np.array_equal(permute(w, heads), w) or rows // heads == 2


#: llama.cpp-like mixed types: the embedding F16, attention Q8_0, FFN F16, norms F32.
MIXED = {f"blk.{i}.{n}.weight": Q.Q8_0 for i in range(2)
         for n in ("attn_q", "attn_k", "attn_v", "attn_output")}


def _spm_tokenizer():
    """A small SentencePiece-style vocabulary (tokenizer.ggml.model llama): special tokens,
    the 256 byte tokens, pieces with distinct scores."""
    pieces = ["▁", "a", "m", "n", "i", "s", "g", "t", "r", "u", "l", "e", "p", "y", "o", "h",
              "▁a", "an", "▁m", "▁man", "▁is", "is", "▁p", "▁pl", "ay", "▁play", "ing", "in",
              "▁g", "ui", "ar", "▁gu", "▁guit", "▁guitar", "it", "▁the", "he", "▁t"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    scores = [0.0] * 259 + [-float(k) for k in range(len(pieces))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    return tokens, scores, types


def _spm_reference(text, tokens, scores, types):
    """llama.cpp's SentencePiece BPE, directly: the text with ``▁`` for spaces and one in
    front, split into characters, then repeatedly the adjacent pair whose concatenation is a
    piece of the highest score merged (leftmost first); characters with no piece as their
    UTF-8 byte tokens; BOS in front."""
    vocab = {t: i for i, t in enumerate(tokens) if types[i] == 1}
    syms = list("▁" + text.replace(" ", "▁"))
    while True:
        best = None
        for k in range(len(syms) - 1):
            cat = syms[k] + syms[k + 1]
            if cat in vocab and (best is None or scores[vocab[cat]] > scores[vocab[best[1]]]):
                best = (k, cat)
        if best is None:
            break
        k, cat = best
        syms[k:k + 2] = [cat]
    ids = [1]
    for s in syms:
        ids += [vocab[s]] if s in vocab else [tokens.index(f"<0x{b:02X}>") for b in s.encode()]
    return ids


def _spm_fields():
    tokens, scores, types = _spm_tokenizer()
    return {"add_tokenizer_model": "llama", "add_token_list": tokens, "add_token_scores": scores,
            "add_token_types": types, "add_bos_token_id": 1, "add_eos_token_id": 2,
            "add_unk_token_id": 0, "add_add_bos_token": True}


def test_gguf_llama_matches_hf_forward(tmp_path):
    """A GGUF in llama.cpp's layout (Q/K rows permuted; attention Q8_0, FFN and embeddings F16,
    norms F32; untied output.weight): the imported weights are the file's dequantised values
    unpermuted (equal to an independent NumPy dequantisation), the float reference equals the
    HF forward pass on those values to 1e-9, and against the original float32 weights the
    output differs by less than the quantisation bound: the sum over the matrices of their
    relative (Frobenius) quantisation errors."""
    seed = 31
    print(f"seed {seed}")
    raw = llama_tensors(seed=seed)
    config = llama_config()
    path = tmp_path / "tiny.gguf"
    exact = write_gguf(path, raw, config, types=MIXED, tokenizer=_spm_fields())
    result = import_checkpoint(path, tmp_path / "out")
    cfg = result.model
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.seq_len) == \
        (2, 32, 4, 2, 64, 32)
    assert (cfg.rope_theta, cfg.tie_embeddings, cfg.bias) == (10000.0, False, False)
    assert result.architecture == "llama" and result.layer_norm_eps == 1e-5
    assert cfg.source.startswith("GGUF file ")
    assert any("tensor types: 8 F16, 5 F32, 8 Q8_0" in n for n in result.notes)
    with np.load(result.weights_path) as npz:
        for i in range(2):
            assert np.array_equal(npz[f"layers.{i}.attn.wq"],
                                  exact[f"model.layers.{i}.self_attn.q_proj.weight"].T)
            assert np.array_equal(npz[f"layers.{i}.attn.wk"],
                                  exact[f"model.layers.{i}.self_attn.k_proj.weight"].T)
    _, _, x0, out = _imported(result, IDS)
    ref, _ = llama_forward(exact, config, IDS, eps=0.0)
    err = rel_err(out, ref[-1])
    print(f"vs HF on the dequantised weights: relative {err:.2e}")
    assert err < 1e-9
    mats = [k for k in raw if raw[k].ndim == 2]
    quant = {k: float(np.linalg.norm(exact[k] - raw[k]) / np.linalg.norm(raw[k])) for k in mats}
    bound = sum(v for k, v in quant.items() if "embed" not in k and "lm_head" not in k)
    x_err = rel_err(x0, raw["model.embed_tokens.weight"][IDS])
    f32, _ = llama_forward(raw, config, IDS, eps=0.0)
    dev = rel_err(out, f32[-1])
    q8 = max(quant[k] for k in mats if "attn" in k)
    f16 = max(quant[k] for k in mats if "mlp" in k)
    print(f"quantisation: Q8_0 relative errors up to {q8:.2e}, F16 up to {f16:.2e}, embedding "
          f"{x_err:.2e}; output vs float32 weights {dev:.2e} < bound {bound + x_err:.2e}")
    assert 0 < dev < bound + x_err


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1, Q.BF16, Q.F32])
def test_gguf_tensor_types(tmp_path, kind):
    """Q4_0, Q4_1, BF16 and F32 dequantise to what ggml's block layouts say (an independent
    NumPy dequantisation); the model still equals the HF forward on those values."""
    raw = llama_tensors(seed=41)
    config = llama_config()
    types = dict.fromkeys((f"blk.{i}.{n}.weight" for i in range(2)
                           for n in ("attn_q", "attn_k", "ffn_gate", "ffn_down")), kind)
    exact = write_gguf(tmp_path / "m.gguf", raw, config, types=types)
    result = import_checkpoint(tmp_path / "m.gguf", tmp_path / "out")
    with np.load(result.weights_path) as npz:
        assert np.array_equal(npz["layers.1.ffn.w2"],
                              exact["model.layers.1.mlp.down_proj.weight"].T)
        assert np.array_equal(npz["layers.0.attn.wq"],
                              exact["model.layers.0.self_attn.q_proj.weight"].T)
    _, _, _, out = _imported(result, IDS)
    assert rel_err(out, llama_forward(exact, config, IDS, eps=0.0)[0][-1]) < 1e-9
    assert result.tokenizer.get("refused") and "missing key tokenizer.ggml.model" in \
        result.tokenizer["refused"]


def test_gguf_qwen2_and_tied(tmp_path):
    """qwen2 GGUF: Q and K not permuted (llama.cpp's NEOX RoPE is HF's halves), q/k/v biases;
    no output.weight: tied to the embedding table."""
    raw = llama_tensors(seed=51, attn_bias="qkv", tied=True)
    config = llama_config("qwen2", tied=True)
    exact = write_gguf(tmp_path / "q.gguf", raw, config, arch="qwen2")
    result = import_checkpoint(tmp_path / "q.gguf", tmp_path / "out")
    cfg = result.model
    assert result.architecture == "qwen2" and cfg.tie_embeddings and cfg.bias
    _, w, _, out = _imported(result, IDS)
    assert rel_err(out, llama_forward(exact, config, IDS, eps=0.0)[0][-1]) < 1e-9
    assert not w["layers.1.ffn.b1"].any()
    with np.load(result.embeddings_path) as npz:
        assert "lm_head" not in npz.files


# ---- tokenisers --------------------------------------------------------------------------------

SENTENCES = ["a man is playing guitar", "the man is playing", "a guitar", "é man!",
             "playing the guitar is an art"]


def test_gguf_sentencepiece_tokenizer(tmp_path):
    """tokenizer.ggml.model llama rebuilt as a tokenizers BPE equals llama.cpp's SentencePiece
    merging by score, byte fallback included, BOS in front; embed takes its ids."""
    raw = llama_tensors(seed=61, vocab=len(_spm_tokenizer()[0]))
    config = llama_config(vocab=len(_spm_tokenizer()[0]))
    exact = write_gguf(tmp_path / "t.gguf", raw, config, tokenizer=_spm_fields())
    result = import_checkpoint(tmp_path / "t.gguf", tmp_path / "out")
    assert result.tokenizer == {"kind": "tokenizers", "from": "GGUF tokenizer.ggml.*"}
    for text in SENTENCES:
        tokens = tokenize(result, text)
        want = _spm_reference(text, *_spm_tokenizer())
        print(text, tokens.pieces)
        assert list(tokens.ids) == want, text
    assert tokenize(result, "a man").pieces == ("<s>", "▁a", "▁man")
    assert np.array_equal(embed(result, tokenize(result, "a man").ids),
                          exact["model.embed_tokens.weight"][[1, 275, 278]])


def _byte_level_bpe(digits=False):
    """A byte-level BPE trained here: GPT-2's pre-tokeniser, or (``digits``) SmolLM's, each
    digit alone first."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True), tok.pre_tokenizer])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 3, trainer)
    return tok


@pytest.mark.parametrize("pre", ["default", "smollm"])
def test_gguf_byte_level_tokenizer(tmp_path, pre):
    """tokenizer.ggml.model gpt2: tokens and merges of a byte-level BPE (trained here) give the
    same ids as that BPE, with tokenizer.ggml.pre default (GPT-2's split) or smollm (digits
    apart first); an unknown tokenizer.ggml.pre is refused for --text, naming it."""
    bpe = _byte_level_bpe(digits=pre == "smollm")
    spec = json.loads(bpe.to_str())["model"]
    vocab = spec["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["merges"]]
    raw = llama_tensors(seed=71, vocab=len(tokens))
    config = llama_config(vocab=len(tokens))
    fields = {"add_tokenizer_model": "gpt2", "add_token_list": tokens,
              "add_token_merges": merges, "add_token_types": [3] + [1] * (len(tokens) - 1),
              "add_tokenizer_pre": pre}
    write_gguf(tmp_path / "b.gguf", raw, config, tokenizer=fields)
    result = import_checkpoint(tmp_path / "b.gguf", tmp_path / "out")
    for text in SENTENCES + ["new words: zebra 123", "12 guitars and 345 men"]:
        assert tokenize(result, text).ids == tuple(bpe.encode(text).ids), text
    fields["add_tokenizer_pre"] = "deepseek-coder"
    write_gguf(tmp_path / "c.gguf", raw, config, tokenizer=fields)
    result = import_checkpoint(tmp_path / "c.gguf", tmp_path / "out2")
    with pytest.raises(BadInput, match=r"--text: no tokeniser for this GGUF file: .*c\.gguf: "
                                       r"key tokenizer\.ggml\.pre='deepseek-coder' is not "
                                       r"supported \(known: "):
        tokenize(result, "hi")


def test_folder_tokenizer_json_and_cli_text(tmp_path, capsys):
    """A folder's tokenizer.json is copied and used by --text (BOS by its post-processor);
    input.npy is the embedding rows of its ids."""
    raw = llama_tensors(seed=81)
    write_folder(tmp_path / "ckpt", raw, llama_config())
    words = ["<unk>", "<s>", "</s>", "a", "man", "is", "playing", "guitar", "on", "stage"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[
        ("<s>", 1)])
    tok.save(str(tmp_path / "ckpt" / "tokenizer.json"))
    out = tmp_path / "out"
    assert main(["import", str(tmp_path / "ckpt"), "-o", str(out), "--seq-len", "16",
                 "--text", "a man is playing a banjo"]) == 0
    text = capsys.readouterr().out
    print(text)
    assert "(llama: 2 layers, d_model 32, 4 heads of 8 (2 K/V), d_ff 64, seq_len 16, " \
           "pre-norm, causal, RoPE theta 10000, silu)" in text
    assert text.rstrip().endswith("7 tokens: <s> a man is playing a <unk>")
    ids = [1, 3, 4, 5, 6, 3, 0]
    assert np.array_equal(np.load(out / "input.npy"), raw["model.embed_tokens.weight"][ids])
    assert load_import(out).tokenizer_path == out / "tokenizer.json"


def test_cli_gguf(tmp_path, capsys):
    raw = llama_tensors(seed=91, vocab=len(_spm_tokenizer()[0]))
    config = llama_config(vocab=len(_spm_tokenizer()[0]))
    write_gguf(tmp_path / "t.gguf", raw, config, types=MIXED, tokenizer=_spm_fields())
    out = tmp_path / "out"
    assert main(["import", str(tmp_path / "t.gguf"), "-o", str(out), "--text",
                 "a man is playing guitar"]) == 0
    text = capsys.readouterr().out
    print(text)
    assert text.startswith(f"{out / 'model.toml'}: out (llama: 2 layers")
    assert "note: Q and K rows unpermuted" in text
    # "ui" outscores "▁gu", so SentencePiece never reaches "▁guitar" (as llama.cpp would not)
    assert text.rstrip().endswith("10 tokens: <s> ▁a ▁man ▁is ▁play ing ▁g ui t ar")


# ---- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("family, changes, match", [
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     r"field rope_scaling=\{'rope_type': 'llama3', 'factor': 8\.0\} is not supported \(only "
     r"plain RoPE"),
    ("llama", {"rope_scaling": {"type": "linear", "factor": 2.0}},
     r"field rope_scaling=\{'type': 'linear'"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}},
     r"field rope_parameters=\{'rope_type': 'yarn'"),
    ("llama", {"architectures": ["LlavaForConditionalGeneration"]},
     r"field architectures=\['LlavaForConditionalGeneration'\] is not supported \(known for "
     r"model_type llama: LlamaForCausalLM, LlamaModel\)"),
    ("llama", {"quantization_config": {"quant_method": "gptq", "bits": 4}},
     r"field quantization_config\.quant_method='gptq' is not supported"),
    ("mistral", {"attention_bias": True}, r"field attention_bias=True is not supported"),
    ("qwen2", {"mlp_bias": True}, r"field mlp_bias=True is not supported"),
    ("qwen2", {"use_sliding_window": True}, r"field use_sliding_window=True is not supported"),
    ("llama", {"layer_types": ["full_attention", "sliding_attention"]},
     r"field layer_types=\['full_attention', 'sliding_attention'\] is not supported"),
    ("llama", {"hidden_act": "gelu_pytorch_tanh"},
     r"field hidden_act='gelu_pytorch_tanh' is not supported \(known: "),
    ("llama", {"num_key_value_heads": 3},
     r"field num_key_value_heads=3 is not supported \(must divide num_attention_heads=4\)"),
    ("llama", {"head_dim": 16}, r"field head_dim=16 is not supported \(must be hidden_size / "
                                r"num_attention_heads = 8\)"),
    ("llama", {"partial_rotary_factor": 0.5}, r"field partial_rotary_factor=0\.5 is not "
                                              r"supported"),
    ("llama", {"intermediate_size": None}, r"missing field intermediate_size \(needed for "
                                           r"llama\)"),
    ("llama", {"intermediate_size": 65}, r"tensor model\.layers\.0\.mlp\.gate_proj\.weight has "
                                         r"shape \[64, 32\], expected \[65, 32\] from "
                                         r"config\.json"),
    ("llama", {"num_key_value_heads": 4}, r"tensor model\.layers\.0\.self_attn\.k_proj\.weight "
                                          r"has shape \[16, 32\], expected \[32, 32\]"),
    ("llama", {"attention_bias": True}, r"missing tensor "
                                        r"model\.layers\.0\.self_attn\.q_proj\.bias"),
])
def test_folder_refusals_name_the_key(tmp_path, family, changes, match):
    config = llama_config(family)
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    write_folder(tmp_path / "ckpt", llama_tensors(seed=1), config)
    with pytest.raises(BadInput, match=match) as info:
        import_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    assert "\n" not in str(info.value)
    assert "config.json" in str(info.value) or "safetensors" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_untied_head_missing(tmp_path):
    raw = llama_tensors(seed=1, tied=True)
    write_folder(tmp_path / "ckpt", raw, llama_config(tied=False))
    with pytest.raises(BadInput, match=r"model\.safetensors: missing tensor lm_head\.weight"):
        import_checkpoint(tmp_path / "ckpt", tmp_path / "out")


def _gguf_with(tmp_path, *, arch="llama", types=None, extra=None, skip=(), add=None):
    raw = llama_tensors(seed=2)
    raw.update(add or {})
    path = tmp_path / "bad.gguf"
    write_gguf(path, raw, llama_config(), arch=arch, types=types, extra=extra, skip=skip)
    return path


@pytest.mark.parametrize("kw, match", [
    ({"arch": "gemma"}, r"bad\.gguf: key general\.architecture='gemma' is not supported "
                        r"\(supported: llama, qwen2\)"),
    ({"types": {"blk.1.ffn_down.weight": Q.Q5_0}},
     r"bad\.gguf: tensor blk\.1\.ffn_down\.weight has type Q5_0, which is not supported "
     r"\(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1\)"),
    ({"extra": {"add_rope_scaling_type": [RopeScalingType.LINEAR],
                "add_rope_scaling_factor": [4.0]}},
     r"key llama\.rope\.scaling\.type='linear' is not supported \(only plain RoPE"),
    ({"extra": {"add_expert_count": [4]}}, r"key llama\.expert_count=4 is not supported"),
    ({"extra": {"add_sliding_window": [8]}},
     r"key llama\.attention\.sliding_window=8 is not supported"),
    ({"add": {"rope_freqs.weight": np.ones(4, np.float32)}},
     r"tensor rope_freqs\.weight is not supported \(RoPE frequency factors"),
    ({"skip": ("blk.1.ffn_up.weight",)}, r"bad\.gguf: missing tensor blk\.1\.ffn_up\.weight"),
])
def test_gguf_refusals_name_the_key(tmp_path, kw, match):
    path = _gguf_with(tmp_path, **kw)
    with pytest.raises(BadInput, match=match) as info:
        import_checkpoint(path, tmp_path / "out")
    assert "\n" not in str(info.value)


def test_gguf_missing_key_and_bad_file(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 4)
    with pytest.raises(BadInput, match=r"x\.gguf: not a GGUF file"):
        import_checkpoint(path, tmp_path / "out")
    path.write_bytes(b"PK\x03\x04")
    with pytest.raises(BadInput, match=r"x\.gguf: not a checkpoint directory or GGUF file"):
        import_checkpoint(path, tmp_path / "out")


def test_cli_refusal_exit_2(tmp_path, capsys):
    config = llama_config(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    write_folder(tmp_path / "ckpt", llama_tensors(seed=1), config)
    status = main(["import", str(tmp_path / "ckpt"), "-o", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert status == EXIT_BAD_INPUT and out == ""
    assert err.startswith("npu import: ") and err.count("\n") == 1 and "Traceback" not in err
    assert "field rope_scaling={'rope_type': 'dynamic', 'factor': 2.0} is not supported" in err
    path = _gguf_with(tmp_path, types={"blk.0.attn_v.weight": Q.Q5_1})
    status = main(["import", str(path), "-o", str(tmp_path / "out2")])
    out, err = capsys.readouterr()
    assert status == EXIT_BAD_INPUT and err.count("\n") == 1
    assert "tensor blk.0.attn_v.weight has type Q5_1, which is not supported" in err
