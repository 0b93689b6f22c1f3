"""``npu import`` as functions: a Hugging Face checkpoint folder or a llama.cpp GGUF file as
the simulator's files, and the way from text to the simulator's ``--input``.

:func:`import_checkpoint` reads a checkpoint directory (``config.json`` and ``model.safetensors``,
or a sharded ``model.safetensors.index.json``; float32, float16 or bfloat16) of a BERT-family
encoder (``model_type`` bert: post-norm, GELU, bidirectional), a GPT-2-family decoder (gpt2:
pre-norm, causal) or a Llama-family decoder (llama, mistral, qwen2: pre-norm RMSNorm, RoPE,
grouped-query attention, gated FFN), or a GGUF file (``general.architecture`` llama or qwen2,
:mod:`sim.models.gguf_file`), and writes, into an output directory (``docs/formats.md``,
"Checkpoints"):

- ``model.toml``: the shape and the quantisation scheme (:data:`IMPORT_QUANT`), loadable by
  :func:`hw.spec.load_model`;
- ``weights.npz``: every block's tensors by the names of ``docs/formats.md``, float32, ``x @ W``
  (torch Linear weights ``[out, in]`` transposed; GPT-2's Conv1D weights are ``x @ W``
  already, its fused ``c_attn`` split into Q, K and V; GGUF tensors dequantised, llama.cpp's
  Q/K row permutation undone);
- ``embeddings.npz``: ``word``, ``position`` (and BERT's ``token_type``) tables and the
  embedding LayerNorm (``norm.weight``, ``norm.bias``, ``norm.eps``); for the Llama family
  ``word``, the final RMSNorm (``final_norm.weight``, ``final_norm.eps``) and an untied
  ``lm_head``: none of them modelled by the simulator (:func:`embed` and :func:`logits` apply
  them);
- ``vocab.txt`` (WordPiece checkpoints), ``tokenizer.json`` (a folder's own, or rebuilt from a
  GGUF's vocabulary) and ``import.json`` (what was imported, from where, and what was left
  out).

:func:`tokenize` (a minimal BERT WordPiece: basic tokenisation, then greedy longest-match
word pieces, ``[CLS] ... [SEP]``; or ``tokenizer.json`` through the ``tokenizers`` package) and
:func:`embed` (the embedding output: the float input of block 0) turn a sentence into the
``[seq, d_model]`` array ``npu sim --input`` takes.

Deviations of the float reference (:mod:`sim.golden.float_model`) from a checkpoint's own
arithmetic, recorded in ``import.json`` ``notes``: LayerNorm and RMSNorm epsilon is 0 in the
blocks (BERT's 1e-12 is far below float64 rounding; GPT-2's 1e-5 changes a block's output by
about 1e-6 relative; a Llama RMSNorm scales a row of mean square m by sqrt((m + eps) / m)
more, noted per checkpoint from its embedding rows); GPT-2's ``gelu_new`` (the tanh
approximation) is recorded as ``activation = "gelu"``, the exact erf GELU the project's
reference and integer tables use (the two differ by at most 4.7e-4 at x = 2.7).

Errors are :class:`sim.errors.BadInput`, one line naming the file, the field or tensor and the
limit.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors
import safetensors.numpy
from tokenizers import Tokenizer

from hw.spec import ConfigError, ModelConfig, load_model

from ..errors import BadInput
from ..golden.float_model import check_weights
from .gguf_file import checked_value, gguf_tokenizer, read_gguf

__all__ = ["ARCHITECTURES", "IMPORT_QUANT", "ImportResult", "Tokens", "import_checkpoint",
           "load_import", "load_vocab", "wordpiece", "tokenize", "embed", "logits", "MODEL_FILE",
           "WEIGHTS_FILE", "EMBEDDINGS_FILE", "INFO_FILE", "VOCAB_FILE", "TOKENIZER_FILE"]

#: ``config.json`` ``model_type`` values that can be imported.
ARCHITECTURES = ("bert", "gpt2", "llama", "mistral", "qwen2")
MODEL_FILE = "model.toml"
WEIGHTS_FILE = "weights.npz"
EMBEDDINGS_FILE = "embeddings.npz"
INFO_FILE = "import.json"
VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"

_REQUIRED = object()


@dataclass(frozen=True)
class ImportResult:
    """What :func:`import_checkpoint` wrote (or :func:`load_import` found) in ``out_dir``."""

    model: ModelConfig
    out_dir: Path
    model_path: Path
    weights_path: Path
    embeddings_path: Path
    info_path: Path
    vocab_path: Path | None     # WordPiece vocabulary (None: no tokeniser for this model)
    architecture: str           # "bert" or "gpt2"
    source: str                 # the checkpoint directory
    activation: str             # the checkpoint's own activation name
    layer_norm_eps: float       # the checkpoint's LayerNorm epsilon
    tokenizer: dict             # WordPiece settings ({} without a vocabulary)
    notes: tuple[str, ...]      # how the float reference deviates from the checkpoint
    ignored: tuple[str, ...]    # checkpoint tensors not imported
    tokenizer_path: Path | None = None  # tokenizer.json (None: no `tokenizers` tokeniser)
    positions: int = 0          # the longest sequence the checkpoint has positions for


@dataclass(frozen=True)
class Tokens:
    """A tokenised text: vocabulary ids and the word pieces they stand for."""

    ids: tuple[int, ...]
    pieces: tuple[str, ...]


# ---- reading the checkpoint -------------------------------------------------------------------

def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read ({exc})") from None
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: bad JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: expected a JSON object")
    return data


def _bf16_tensors(path: Path) -> dict[str, np.ndarray]:
    """The BF16 tensors of a safetensors file as float32 (exactly: bfloat16 is float32's top
    half), read by the format's own header (8-byte little-endian length, then JSON with each
    tensor's dtype, shape and byte offsets after the header), which NumPy's safetensors API
    refuses (NumPy has no bfloat16)."""
    with path.open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    raw = np.memmap(path, np.uint8, mode="r")
    out = {}
    for name, spec in header.items():
        if name == "__metadata__" or spec.get("dtype") != "BF16":
            continue
        start, stop = (8 + n + k for k in spec["data_offsets"])
        half = np.frombuffer(raw[start:stop].tobytes(), "<u2").astype(np.uint32)
        out[name] = (half << 16).view(np.float32).reshape(spec["shape"])
    return out


def _load_file(path: Path) -> dict[str, np.ndarray]:
    try:
        return safetensors.numpy.load_file(str(path))
    except FileNotFoundError:
        raise BadInput(f"{path}: file not found") from None
    except TypeError as exc:
        if "bfloat16" not in str(exc):
            raise BadInput(f"{path}: not a readable safetensors file ({exc})") from None
    except Exception as exc:   # safetensors raises its own SafetensorError (an Exception)
        raise BadInput(f"{path}: not a safetensors file ({exc})") from None
    # bfloat16 tensors (most Llama-family checkpoints): the others through safetensors, one
    # by one, the bfloat16 ones from the header's offsets.
    try:
        bf16 = _bf16_tensors(path)
        with safetensors.safe_open(str(path), framework="numpy") as f:
            rest = {k: f.get_tensor(k) for k in f.keys() if k not in bf16}  # noqa: SIM118
    except Exception as exc:   # a header that safetensors read but this reader cannot
        raise BadInput(f"{path}: not a readable safetensors file ({exc})") from None
    return {**rest, **bf16}


def _load_tensors(src: Path) -> tuple[dict[str, np.ndarray], list[Path]]:
    single = src / "model.safetensors"
    if single.exists():
        return _load_file(single), [single]
    index = src / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise BadInput(f"{index}: missing field weight_map")
        files = [src / name for name in sorted(set(weight_map.values()))]
        tensors = {}
        for path in files:
            tensors.update(_load_file(path))
        return tensors, files
    other = [name for name in ("pytorch_model.bin", "tf_model.h5") if (src / name).exists()]
    hint = f" ({other[0]} is not read: convert the checkpoint to safetensors)" if other else ""
    raise BadInput(f"{single}: file not found{hint}")


class _Config:
    """``config.json`` fields, each refused with one line naming the file and the field."""

    def __init__(self, data: dict, path: Path, family: str):
        self.data, self.path, self.family = data, path, family

    def get(self, key, kind, default=_REQUIRED):
        if key not in self.data or self.data[key] is None:
            if default is _REQUIRED:
                raise BadInput(f"{self.path}: missing field {key} (needed for {self.family})")
            return default
        return checked_value(self.path, "field", key, self.data[key], kind)

    def refuse(self, key, value, why):
        raise BadInput(f"{self.path}: field {key}={value!r} is not supported ({why})")

    def expect(self, key, value, why):
        """Refuse the field ``key`` unless it is absent or equal to ``value``."""
        got = self.get(key, type(value), value)
        if got != value:
            self.refuse(key, got, why)


class _Tensors:
    """Checkpoint tensors by name, with an optional prefix; records which were taken."""

    def __init__(self, tensors, path: str, prefix: str, origin: str = "config.json"):
        self.tensors, self.path, self.prefix, self.origin = tensors, path, prefix, origin
        self.used: set[str] = set()

    def take(self, name: str, shape: tuple, *, prefixed: bool = True) -> np.ndarray:
        full = self.prefix + name if prefixed else name
        if full not in self.tensors:
            raise BadInput(f"{self.path}: missing tensor {full}")
        arr = self.tensors[full]
        if tuple(arr.shape) != tuple(shape):
            raise BadInput(f"{self.path}: tensor {full} has shape {list(arr.shape)}, expected "
                           f"{list(shape)} from {self.origin}")
        if arr.dtype.kind != "f":
            raise BadInput(f"{self.path}: tensor {full} has dtype {arr.dtype}, expected float")
        self.used.add(full)
        return np.asarray(arr, np.float32)

    def has(self, name: str, *, prefixed: bool = True) -> bool:
        return (self.prefix + name if prefixed else name) in self.tensors

    def ignored(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.tensors) - self.used))


def _prefix(tensors: dict, probe: str, prefixes: tuple[str, ...]) -> str:
    for prefix in prefixes:
        if prefix + probe in tensors:
            return prefix
    return ""


# ---- the two families --------------------------------------------------------------------------

_BERT_ACTS = {"gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu",
              "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu"}
_GPT2_ACTS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu", "relu": "relu",
              "silu": "silu", "swish": "silu"}
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")


def _activation(cfg: _Config, key: str, table: dict, default: str) -> tuple[str, str]:
    act = cfg.get(key, str, default)
    if act not in table:
        cfg.refuse(key, act, f"known: {', '.join(sorted(table))}")
    return act, table[act]


def _dims(cfg: _Config, layers: str, width: str, heads: str, positions: str):
    """The shape fields every architecture has, by this architecture's names, and the vocabulary
    size; refuses a width that the heads do not divide."""
    L, d, h, n = (cfg.get(key, int) for key in (layers, width, heads, positions))
    if d % h:
        cfg.refuse(width, d, f"not a multiple of {heads}={h}")
    return L, d, h, n, cfg.get("vocab_size", int)


def _bert(cfg: _Config, t: _Tensors):
    L, d, heads, positions, vocab = _dims(cfg, "num_hidden_layers", "hidden_size",
                                          "num_attention_heads", "max_position_embeddings")
    d_ff = cfg.get("intermediate_size", int)
    types = cfg.get("type_vocab_size", int, 2)
    eps = float(cfg.get("layer_norm_eps", float, 1e-12))
    act, ours = _activation(cfg, "hidden_act", _BERT_ACTS, "gelu")
    cfg.expect("position_embedding_type", "absolute", "only absolute position embeddings")
    cfg.expect("is_decoder", False, "BERT is imported as a bidirectional encoder")
    w = {}
    for i in range(L):
        h, p = f"encoder.layer.{i}.", f"layers.{i}."
        for ours_w, theirs in (("q", "attention.self.query"), ("k", "attention.self.key"),
                               ("v", "attention.self.value"), ("o", "attention.output.dense")):
            w[p + f"attn.w{ours_w}"] = t.take(h + theirs + ".weight", (d, d)).T
            w[p + f"attn.b{ours_w}"] = t.take(h + theirs + ".bias", (d,))
        for ln, theirs in (("ln1", "attention.output.LayerNorm"), ("ln2", "output.LayerNorm")):
            w[p + f"{ln}.weight"] = t.take(h + theirs + ".weight", (d,))
            w[p + f"{ln}.bias"] = t.take(h + theirs + ".bias", (d,))
        w[p + "ffn.w1"] = t.take(h + "intermediate.dense.weight", (d_ff, d)).T
        w[p + "ffn.b1"] = t.take(h + "intermediate.dense.bias", (d_ff,))
        w[p + "ffn.w2"] = t.take(h + "output.dense.weight", (d, d_ff)).T
        w[p + "ffn.b2"] = t.take(h + "output.dense.bias", (d,))
    e = "embeddings."
    emb = {"word": t.take(e + "word_embeddings.weight", (vocab, d)),
           "position": t.take(e + "position_embeddings.weight", (positions, d)),
           "token_type": t.take(e + "token_type_embeddings.weight", (types, d)),
           "norm.weight": t.take(e + "LayerNorm.weight", (d,)),
           "norm.bias": t.take(e + "LayerNorm.bias", (d,)),
           "norm.eps": np.array(eps)}
    shape = {"n_layers": L, "d_model": d, "n_heads": heads, "d_ff": d_ff, "causal": False,
             "norm": "post", "activation": ours, "bias": True, "vocab_size": vocab,
             "tie_embeddings": False}
    notes = [f"LayerNorm eps {eps:g} of the blocks is taken as 0 by the float reference"]
    if act in _TANH_GELU:
        notes.append(f"hidden_act {act} (tanh approximation) is recorded as gelu, the exact erf "
                     "GELU of the float reference and the integer tables (max |difference| "
                     "4.7e-4)")
    return shape, w, emb, positions, act, eps, notes


def _gpt2(cfg: _Config, t: _Tensors):
    L, d, heads, positions, vocab = _dims(cfg, "n_layer", "n_embd", "n_head", "n_positions")
    d_ff = cfg.get("n_inner", int, 4 * d)
    eps = float(cfg.get("layer_norm_epsilon", float, 1e-5))
    act, ours = _activation(cfg, "activation_function", _GPT2_ACTS, "gelu_new")
    cfg.expect("scale_attn_weights", True, "scores are always scaled by 1/sqrt(d_head)")
    cfg.expect("scale_attn_by_inverse_layer_idx", False, "no per-layer score scaling")
    cfg.expect("add_cross_attention", False, "decoder-only blocks")
    w = {}
    for i in range(L):
        h, p = f"h.{i}.", f"layers.{i}."
        qkv = t.take(h + "attn.c_attn.weight", (d, 3 * d))
        qkv_b = t.take(h + "attn.c_attn.bias", (3 * d,))
        for k, name in enumerate("qkv"):
            w[p + f"attn.w{name}"] = qkv[:, k * d:(k + 1) * d]
            w[p + f"attn.b{name}"] = qkv_b[k * d:(k + 1) * d]
        w[p + "attn.wo"] = t.take(h + "attn.c_proj.weight", (d, d))
        w[p + "attn.bo"] = t.take(h + "attn.c_proj.bias", (d,))
        for ln, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
            w[p + f"{ln}.weight"] = t.take(h + theirs + ".weight", (d,))
            w[p + f"{ln}.bias"] = t.take(h + theirs + ".bias", (d,))
        w[p + "ffn.w1"] = t.take(h + "mlp.c_fc.weight", (d, d_ff))
        w[p + "ffn.b1"] = t.take(h + "mlp.c_fc.bias", (d_ff,))
        w[p + "ffn.w2"] = t.take(h + "mlp.c_proj.weight", (d_ff, d))
        w[p + "ffn.b2"] = t.take(h + "mlp.c_proj.bias", (d,))
    emb = {"word": t.take("wte.weight", (vocab, d)),
           "position": t.take("wpe.weight", (positions, d))}
    shape = {"n_layers": L, "d_model": d, "n_heads": heads, "d_ff": d_ff, "causal": True,
             "norm": "pre", "activation": ours, "bias": True, "vocab_size": vocab,
             "tie_embeddings": bool(cfg.get("tie_word_embeddings", bool, True))}
    notes = [f"LayerNorm eps {eps:g} of the blocks is taken as 0 by the float reference",
             "the final LayerNorm ln_f and the LM head are not imported (planner only)"]
    if act in _TANH_GELU:
        notes.append(f"activation_function {act} (tanh approximation) is recorded as gelu, the "
                     "exact erf GELU of the float reference and the integer tables (max "
                     "|difference| 4.7e-4)")
    return shape, w, emb, positions, act, eps, notes


# ---- Llama, Mistral, Qwen2 (Hugging Face folders and GGUF files) -------------------------------

#: Activations of the gated FFN, by Hugging Face's ``hidden_act``.
_GATED_ACTS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "relu": "relu"}

#: One block's matrices: ours, transformers' module under ``layers.N.``, llama.cpp's under
#: ``blk.N.``; each is stored ``[out, in]`` (torch Linear) and transposed to ``x @ W``. A
#: bias is ours with ``.b`` for ``.w`` (``attn.bq``), theirs with ``.bias`` for ``.weight``.
_LLAMA_MATRICES = (("attn.wq", "self_attn.q_proj", "attn_q"),
                   ("attn.wk", "self_attn.k_proj", "attn_k"),
                   ("attn.wv", "self_attn.v_proj", "attn_v"),
                   ("attn.wo", "self_attn.o_proj", "attn_output"),
                   ("ffn.wg", "mlp.gate_proj", "ffn_gate"),
                   ("ffn.w1", "mlp.up_proj", "ffn_up"),
                   ("ffn.w2", "mlp.down_proj", "ffn_down"))
_LLAMA_NORMS = (("ln1.weight", "input_layernorm", "attn_norm"),
                ("ln2.weight", "post_attention_layernorm", "ffn_norm"))
#: The tensors around the blocks: embedding table, final RMSNorm, LM head (untied only).
_LLAMA_GLOBALS = {"embed": ("embed_tokens.weight", "token_embd.weight"),
                  "norm": ("norm.weight", "output_norm.weight"),
                  "head": ("lm_head.weight", "output.weight")}
_LLAMA_ARCHS = {"llama": ("LlamaForCausalLM", "LlamaModel"),
                "mistral": ("MistralForCausalLM", "MistralModel"),
                "qwen2": ("Qwen2ForCausalLM", "Qwen2Model")}
_ATTN_MATRICES = ("attn.wq", "attn.wk", "attn.wv", "attn.wo")
_FFN_MATRICES = ("ffn.wg", "ffn.w1", "ffn.w2")


@dataclass(frozen=True)
class _LlamaDims:
    """A Llama-family shape, read from ``config.json`` or from GGUF metadata."""

    layers: int
    d: int
    heads: int
    kv_heads: int
    d_ff: int
    positions: int
    vocab: int
    theta: float
    eps: float
    tied: bool
    window: int                 # Mistral's sliding window (0: full causal attention)
    act: str                    # the checkpoint's activation name
    biases: tuple[str, ...]     # our matrices whose bias the checkpoint has


def _llama_blocks(dims: _LlamaDims, t: _Tensors, gguf: bool):
    """The model's shape, every block's tensors by our names, the tensors around the blocks
    (``embeddings.npz``) and the notes."""
    col = 2 if gguf else 1
    d, f = dims.d, dims.d_ff
    kv = dims.kv_heads * (d // dims.heads)
    out_in = {"attn.wq": (d, d), "attn.wk": (kv, d), "attn.wv": (kv, d), "attn.wo": (d, d),
              "ffn.wg": (f, d), "ffn.w1": (f, d), "ffn.w2": (d, f)}
    bias = bool(dims.biases)
    w = {}
    for i in range(dims.layers):
        h, p = (f"blk.{i}." if gguf else f"layers.{i}."), f"layers.{i}."
        for entry in _LLAMA_MATRICES:
            ours, theirs = entry[0], entry[col]
            rows, cols = out_in[ours]
            w[p + ours] = t.take(h + theirs + ".weight", (rows, cols)).T
            if ours in dims.biases:
                w[p + ours.replace(".w", ".b")] = t.take(h + theirs + ".bias", (rows,))
            elif bias:
                w[p + ours.replace(".w", ".b")] = np.zeros(rows, np.float32)
        for entry in _LLAMA_NORMS:
            w[p + entry[0]] = t.take(h + entry[col] + ".weight", (d,))
    g = {k: v[col - 1] for k, v in _LLAMA_GLOBALS.items()}
    emb = {"word": t.take(g["embed"], (dims.vocab, d)),
           "final_norm.weight": t.take(g["norm"], (d,)),
           "final_norm.eps": np.array(dims.eps)}
    if not dims.tied:           # transformers' lm_head is beside model., not under it
        emb["lm_head"] = t.take(g["head"], (dims.vocab, d), prefixed=False)
    shape = {"n_layers": dims.layers, "d_model": d, "n_heads": dims.heads,
             "n_kv_heads": dims.kv_heads, "d_ff": f, "causal": True, "norm": "pre",
             "norm_kind": "rmsnorm", "activation": _GATED_ACTS[dims.act], "ffn": "gated",
             "bias": bias, "rope_theta": float(dims.theta), "window": dims.window,
             "vocab_size": dims.vocab, "tie_embeddings": dims.tied}
    ms = float(np.median(np.mean(np.square(emb["word"], dtype=np.float64), axis=1)))
    notes = [f"RMSNorm eps {dims.eps:g} of the blocks is taken as 0 by the float reference (a "
             f"row of mean square m is scaled by sqrt((m + eps) / m) more: the median embedding"
             f" row has m = {ms:.3g}, so block 0's first RMSNorm is "
             f"{math.sqrt(1 + dims.eps / ms) - 1 if ms > 0 else math.inf:.2g} larger relative)"]
    zeros = [ours.replace(".w", ".b") for ours, *_ in _LLAMA_MATRICES
             if bias and ours not in dims.biases]
    if zeros:
        have = ", ".join(ours.replace(".w", ".b") for ours in dims.biases)
        notes.append(f"the checkpoint has biases {have} only: {', '.join(zeros)} are written as "
                     "zeros (bias = true gives every projection one)")
    notes.append("the final RMSNorm and the " + ("tied LM head (the embedding table)"
                 if dims.tied else "untied LM head (embeddings.npz lm_head)") + " are outside "
                 "the simulator: sim.models.checkpoint.logits applies them")
    return shape, w, emb, notes


def _llama(cfg: _Config, t: _Tensors):
    """A Hugging Face ``LlamaForCausalLM``, ``MistralForCausalLM`` or ``Qwen2ForCausalLM``."""
    family = cfg.family
    archs = cfg.get("architectures", list, [])
    for arch in archs:
        if arch not in _LLAMA_ARCHS[family]:
            cfg.refuse("architectures", archs, f"known for model_type {family}: "
                       f"{', '.join(_LLAMA_ARCHS[family])}")
    quant = cfg.data.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        raise BadInput(f"{cfg.path}: field quantization_config.quant_method={method!r} is not "
                       "supported (a quantised checkpoint: import its float weights, or a GGUF "
                       "file)")
    L, d, heads, positions, vocab = _dims(cfg, "num_hidden_layers", "hidden_size",
                                          "num_attention_heads", "max_position_embeddings")
    kv = cfg.get("num_key_value_heads", int, heads)
    if heads % kv:
        cfg.refuse("num_key_value_heads", kv, f"must divide num_attention_heads={heads}")
    head_dim = cfg.get("head_dim", int, d // heads)
    if head_dim != d // heads:
        cfg.refuse("head_dim", head_dim, f"must be hidden_size / num_attention_heads = "
                                         f"{d // heads}")
    d_ff = cfg.get("intermediate_size", int)
    eps = float(cfg.get("rms_norm_eps", float, 1e-6))
    act = cfg.get("hidden_act", str, "silu")
    if act not in _GATED_ACTS:
        cfg.refuse("hidden_act", act, f"known: {', '.join(sorted(_GATED_ACTS))}")
    theta = float(cfg.get("rope_theta", float, 10000.0))
    for key in ("rope_scaling", "rope_parameters"):      # rope_parameters: transformers 5
        rope = cfg.data.get(key)
        if rope is None:
            continue
        kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else rope
        if kind != "default":
            cfg.refuse(key, rope, "only plain RoPE (rope_type default): no RoPE scaling")
        theta = float(rope.get("rope_theta", theta))
    if theta <= 1:
        cfg.refuse("rope_theta", theta, "RoPE needs a base above 1")
    if cfg.get("partial_rotary_factor", float, 1.0) != 1:
        cfg.refuse("partial_rotary_factor", cfg.data["partial_rotary_factor"],
                   "RoPE rotates the whole head")
    biases: tuple[str, ...] = ()
    if family == "llama":
        if cfg.get("attention_bias", bool, False):
            biases += _ATTN_MATRICES
        if cfg.get("mlp_bias", bool, False):
            biases += _FFN_MATRICES
    else:
        for key in ("attention_bias", "mlp_bias"):
            cfg.expect(key, False, f"{family} has fixed biases")
    if family == "qwen2":
        biases = ("attn.wq", "attn.wk", "attn.wv")      # Qwen2Attention: q, k, v only
        cfg.expect("use_sliding_window", False, "Qwen2's per-layer sliding windows "
                                                "(max_window_layers) are not modelled")
    window = 0
    if family == "mistral":
        window = cfg.get("sliding_window", int, 0)
    layer_types = cfg.get("layer_types", list, None)
    if layer_types is not None:
        allowed = {"full_attention"} | ({"sliding_attention"} if window else set())
        if not set(layer_types) <= allowed or len(set(layer_types)) > 1:
            cfg.refuse("layer_types", sorted(set(layer_types)), "one kind of attention in every "
                       "layer" + (" (sliding_attention with sliding_window)" if window else
                                  ": full_attention"))
    dims = _LlamaDims(layers=L, d=d, heads=heads, kv_heads=kv, d_ff=d_ff, positions=positions,
                      vocab=vocab, theta=theta, eps=eps,
                      tied=bool(cfg.get("tie_word_embeddings", bool, False)), window=window,
                      act=act, biases=biases)
    shape, w, emb, notes = _llama_blocks(dims, t, gguf=False)
    return shape, w, emb, positions, act, eps, notes


_FAMILIES = {"bert": (_bert, "embeddings.word_embeddings.weight", ("", "bert.")),
             "gpt2": (_gpt2, "wte.weight", ("", "transformer.")),
             **dict.fromkeys(_LLAMA_ARCHS, (_llama, "embed_tokens.weight", ("model.", "")))}


# ---- the tokeniser ----------------------------------------------------------------------------

def _tokenizer_settings(src: Path, vocab: bool) -> dict:
    if not vocab:
        return {}
    settings = {"kind": "wordpiece", "do_lower_case": True, "strip_accents": None,
                "tokenize_chinese_chars": True, "cls_token": "[CLS]", "sep_token": "[SEP]",
                "unk_token": "[UNK]", "max_input_chars_per_word": 100}
    path = src / "tokenizer_config.json"
    if path.exists():
        data = _read_json(path)
        for key in ("do_lower_case", "strip_accents", "tokenize_chinese_chars", "cls_token",
                    "sep_token", "unk_token"):
            value = data.get(key)
            if isinstance(value, dict):        # {"content": "[CLS]", ...} in newer files
                value = value.get("content")
            if value is not None or key == "strip_accents":
                settings[key] = value
    return settings


def _seq_len(src: Path | None, positions: int, seq_len: int | None) -> int:
    """The position table's length, capped by a sentence-transformers ``max_seq_length``."""
    if seq_len is not None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int):
            raise BadInput(f"seq_len must be an integer, not {seq_len!r}")
        if not 1 <= seq_len <= positions:
            raise BadInput(f"seq_len={seq_len} is outside 1..{positions} (the checkpoint's "
                           "position embeddings)")
        return seq_len
    cap_files = () if src is None else (src / "sentence_bert_config.json",
                                         src.parent / "sentence_bert_config.json")
    for path in cap_files:
        if path.exists():
            cap = _read_json(path).get("max_seq_length")
            if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1:
                return min(positions, cap)
    return positions


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)


_TOML_KEYS = ("name", "description", "source", "n_layers", "d_model", "n_heads", "n_kv_heads",
              "d_head", "d_ff", "seq_len", "window", "causal", "norm", "norm_kind", "rope_theta",
              "activation", "ffn", "bias", "batch", "vocab_size", "tie_embeddings", "quant")

#: The quantisation scheme ``model.toml`` gets, by family: smooth16 where it was measured to
#: be needed (all-MiniLM-L6-v2: int8 loses 0.026 of cosine over six layers, smooth16 0.0013;
#: ``docs/accuracy.md``), llm16c for the Llama family (SmolLM2-135M: int8's worst block 0.40
#: and its greedy text unrelated; llm16's worst block 0.99895, llm16c's every block above
#: 0.9997; llm16c makes no assumption about a family beyond pre-norm, so Mistral and Qwen2,
#: whose massive activations int8's one residual scale cannot hold either, get it too
#: although no checkpoint of theirs was measured here); GPT-2 keeps int8 until a real GPT-2 is
#: measured.
IMPORT_QUANT = {"bert": "smooth16", "gpt2": "int8", "llama": "llm16c", "mistral": "llm16c",
                "qwen2": "llm16c"}
_WHAT = {"bert": "BERT encoder", "gpt2": "GPT-2 decoder", "llama": "Llama decoder",
         "mistral": "Mistral decoder", "qwen2": "Qwen2 decoder"}


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _mkdir(out: Path):
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create output directory {out}: {exc.strerror}") from None


@dataclass
class _Read:
    """A checkpoint read and mapped, before anything is written."""

    family: str
    shape: dict
    weights: dict
    emb: dict
    positions: int
    act: str
    eps: float
    notes: list
    tensors: _Tensors
    files: list
    source: str              # "Hugging Face checkpoint DIR (model_type ...)" without the digest
    config_path: Path        # named in a refusal of the whole shape
    seq_cap: Path | None     # where a sentence-transformers max_seq_length may be


def _read_folder(src: Path) -> _Read:
    config_path = src / "config.json"
    data = _read_json(config_path)
    family = data.get("model_type")
    if family not in _FAMILIES:
        raise BadInput(f"{config_path}: field model_type={family!r} is not supported (supported:"
                       f" {', '.join(ARCHITECTURES)})")
    tensors, files = _load_tensors(src)
    convert, probe, prefixes = _FAMILIES[family]
    t = _Tensors(tensors, ", ".join(str(f) for f in files), _prefix(tensors, probe, prefixes))
    shape, weights, emb, positions, act, eps, notes = convert(
        _Config(data, config_path, family), t)
    return _Read(family, shape, weights, emb, positions, act, eps, notes, t, files,
                 f"Hugging Face checkpoint {src.resolve()} (model_type {family}",
                 config_path, src)


def _read_gguf(src: Path) -> tuple[_Read, object]:
    ckpt = read_gguf(src)
    t = _Tensors(ckpt.tensors, str(src), "", origin="the GGUF metadata")
    dims = _LlamaDims(**ckpt.dims)
    shape, weights, emb, notes = _llama_blocks(dims, t, gguf=True)
    types = ", ".join(f"{n} {k}" for k, n in sorted(ckpt.types().items()))
    notes = [*ckpt.notes, f"tensor types: {types} (dequantised to float32)", *notes]
    read = _Read(ckpt.arch, shape, weights, emb, dims.positions, dims.act, dims.eps, notes, t,
                 [src], f"GGUF file {src.resolve()} (general.architecture {ckpt.arch}", src,
                 None)
    return read, ckpt


def _is_gguf(src: Path) -> bool:
    if not src.is_file():
        return False
    with src.open("rb") as f:
        return f.read(4) == b"GGUF"


def import_checkpoint(src: str | Path, out_dir: str | Path, *, name: str | None = None,
                      seq_len: int | None = None) -> ImportResult:
    """Import the checkpoint ``src`` (a Hugging Face folder, or a GGUF file) into ``out_dir``
    (created; files there are replaced).

    ``name`` defaults to the output directory's name. ``seq_len`` defaults to the position
    table's length (``max_position_embeddings``, GPT-2's ``n_positions``, GGUF's
    ``{arch}.context_length``), capped by a sentence-transformers ``max_seq_length``
    (``sentence_bert_config.json`` in ``src`` or its parent: the length the sentence model is
    used at); it may be set to anything from 1 to the table's length.
    """
    src, out = Path(src), Path(out_dir)
    ckpt = None
    if _is_gguf(src):
        read, ckpt = _read_gguf(src)
    elif src.is_dir():
        read = _read_folder(src)
    elif src.is_file():
        raise BadInput(f"{src}: not a checkpoint directory or GGUF file (no GGUF magic)")
    else:
        raise BadInput(f"{src}: not a checkpoint directory")
    family, shape, notes = read.family, read.shape, list(read.notes)
    shape["seq_len"] = _seq_len(read.seq_cap, read.positions, seq_len)
    if shape.get("window", 0) >= shape["seq_len"]:
        notes.append(f"sliding_window {shape['window']} is at least seq_len "
                     f"{shape['seq_len']}: full causal attention, the same masks")
        shape["window"] = 0
    elif shape.get("window"):
        notes.append(f"sliding_window {shape['window']}: window = {shape['window']} (query i "
                     "sees keys i - window < j <= i, as Mistral's mask)")
    kind = f"{shape['n_layers']}-layer {shape['norm']}-norm {_WHAT[family]}"
    digest = _digest(read.files)
    fields = {"window": 0, "norm_kind": "layernorm", "ffn": "mlp", **shape,
              "name": name or out.resolve().name, "batch": 1,
              "d_head": shape["d_model"] // shape["n_heads"], "quant": IMPORT_QUANT[family],
              "description": f"imported by npu import: {kind} ({read.act})",
              "source": f"{read.source}, sha256 {digest[:16]})"}
    fields.setdefault("n_kv_heads", shape["n_heads"])
    fields.setdefault("rope_theta", 0.0)
    try:
        ModelConfig(**fields)
    except ConfigError as exc:
        raise BadInput(f"{read.config_path}: {exc}") from None
    try:
        check_weights(ModelConfig(**fields), read.weights, str(read.files[0]))
    except ValueError as exc:
        raise BadInput(str(exc)) from None

    # The tokeniser: BERT's WordPiece vocabulary, a folder's tokenizer.json, or one rebuilt
    # from the GGUF's vocabulary (or the reason it cannot be, for --text to give).
    vocab_src = None if ckpt is not None else src / VOCAB_FILE
    has_vocab = family == "bert" and vocab_src.exists()
    tokenizer = _tokenizer_settings(src, has_vocab)
    tok_src, built = None, None
    if ckpt is not None:
        try:
            built = gguf_tokenizer(ckpt)
            tokenizer = {"kind": "tokenizers", "from": "GGUF tokenizer.ggml.*"}
        except BadInput as exc:
            tokenizer = {"kind": None, "refused": str(exc)}
    elif family != "bert" and (src / TOKENIZER_FILE).exists():
        tok_src = src / TOKENIZER_FILE
        tokenizer = {"kind": "tokenizers", "from": TOKENIZER_FILE}

    _mkdir(out)
    paths = {k: out / f for k, f in (("model", MODEL_FILE), ("weights", WEIGHTS_FILE),
                                     ("embeddings", EMBEDDINGS_FILE), ("info", INFO_FILE))}
    toml = "".join(f"{k} = {_toml_value(fields[k])}\n" for k in _TOML_KEYS)
    has_tok = tok_src is not None or built is not None
    try:
        paths["model"].write_text(toml, encoding="utf-8")
        np.savez(paths["weights"],
                 **{k: np.ascontiguousarray(v) for k, v in read.weights.items()})
        np.savez(paths["embeddings"], **read.emb)
        if has_vocab and vocab_src.resolve() != (out / VOCAB_FILE).resolve():
            shutil.copyfile(vocab_src, out / VOCAB_FILE)
        if tok_src is not None and tok_src.resolve() != (out / TOKENIZER_FILE).resolve():
            shutil.copyfile(tok_src, out / TOKENIZER_FILE)
        if built is not None:
            built.save(str(out / TOKENIZER_FILE))
        info = {"architecture": family, "source": str(src.resolve()),
                "files": [f.name for f in read.files], "sha256": digest,
                "activation": read.act, "layer_norm_eps": read.eps, "positions": read.positions,
                "tokenizer": tokenizer, "notes": notes, "ignored": list(read.tensors.ignored()),
                "model": MODEL_FILE, "weights": WEIGHTS_FILE, "embeddings": EMBEDDINGS_FILE,
                "vocab": VOCAB_FILE if has_vocab else None,
                "tokenizer_file": TOKENIZER_FILE if has_tok else None}
        paths["info"].write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot write into {out}: {exc.strerror}") from None
    return load_import(out)


def load_import(out_dir: str | Path) -> ImportResult:
    """The :class:`ImportResult` of a directory :func:`import_checkpoint` wrote."""
    out = Path(out_dir)
    info_path = out / INFO_FILE
    info = _read_json(info_path)
    try:
        model = load_model(out / info["model"])
        vocab, tok = info["vocab"], info.get("tokenizer_file")
        return ImportResult(
            model=model, out_dir=out, model_path=out / info["model"],
            weights_path=out / info["weights"], embeddings_path=out / info["embeddings"],
            info_path=info_path, vocab_path=None if vocab is None else out / vocab,
            architecture=info["architecture"], source=info["source"],
            activation=info["activation"], layer_norm_eps=float(info["layer_norm_eps"]),
            tokenizer=dict(info["tokenizer"]), notes=tuple(info["notes"]),
            ignored=tuple(info["ignored"]),
            tokenizer_path=None if tok is None else out / tok,
            positions=int(info.get("positions", 0)))
    except KeyError as exc:
        raise BadInput(f"{info_path}: missing field {exc.args[0]}") from None
    except ConfigError as exc:
        raise BadInput(str(exc)) from None


def _result(result_or_dir) -> ImportResult:
    if isinstance(result_or_dir, ImportResult):
        return result_or_dir
    return load_import(result_or_dir)


# ---- WordPiece ---------------------------------------------------------------------------------

def load_vocab(path: str | Path) -> dict[str, int]:
    """``vocab.txt``: one token per line, the line number is its id (as Hugging Face reads
    it: universal newlines, the trailing newline stripped; a repeated token keeps its last id)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except FileNotFoundError:
        raise BadInput(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read ({exc})") from None
    return {line.rstrip("\n"): i for i, line in enumerate(lines)}


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def _basic(text: str, *, lower: bool, strip_accents, chinese: bool) -> list[str]:
    """BERT's basic tokenisation: clean, split CJK characters, whitespace, case and accents,
    punctuation."""
    cleaned = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD:
            continue
        if ch in " \t\n\r" or unicodedata.category(ch) == "Zs":
            cleaned.append(" ")
        elif unicodedata.category(ch).startswith("C"):
            continue
        elif chinese and _is_cjk(cp):
            cleaned.append(f" {ch} ")
        else:
            cleaned.append(ch)
    words = []
    for word in "".join(cleaned).split():
        if lower:
            word = word.lower()
        if strip_accents or (strip_accents is None and lower):
            word = "".join(c for c in unicodedata.normalize("NFD", word)
                           if unicodedata.category(c) != "Mn")
        current = ""
        for ch in word:
            if _is_punctuation(ch):
                if current:
                    words.append(current)
                words.append(ch)
                current = ""
            else:
                current += ch
        if current:
            words.append(current)
    return words


def wordpiece(text: str, vocab: dict[str, int], *, do_lower_case: bool = True,
              strip_accents=None, tokenize_chinese_chars: bool = True, unk_token: str = "[UNK]",
              max_input_chars_per_word: int = 100) -> list[str]:
    """The word pieces of ``text`` (no special tokens): basic tokenisation, then greedy
    longest-match-first pieces (continuations prefixed ``##``); a word with no match, or
    longer than ``max_input_chars_per_word``, is ``unk_token``."""
    pieces = []
    for word in _basic(text, lower=do_lower_case, strip_accents=strip_accents,
                       chinese=tokenize_chinese_chars):
        if len(word) > max_input_chars_per_word:
            pieces.append(unk_token)
            continue
        start, sub = 0, []
        while start < len(word):
            end, found = len(word), None
            while start < end:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    found = piece
                    break
                end -= 1
            if found is None:
                sub = [unk_token]
                break
            sub.append(found)
            start = end
        pieces += sub
    return pieces


def tokenize(result_or_dir, text: str) -> Tokens:
    """The tokens of ``text``: ``[CLS] pieces [SEP]`` with a BERT import's WordPiece
    vocabulary, or the imported ``tokenizer.json`` (a Hugging Face folder's own, or one rebuilt
    from a GGUF file's vocabulary) through the ``tokenizers`` package, special tokens (BOS) as
    its post-processor adds them."""
    result = _result(result_or_dir)
    if result.tokenizer_path is not None:
        try:
            tok = Tokenizer.from_file(str(result.tokenizer_path))
            enc = tok.encode(text)
        except Exception as exc:   # tokenizers raises its own Exception types
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BadInput(f"{result.tokenizer_path}: cannot tokenise ({first})") from None
        return Tokens(ids=tuple(enc.ids), pieces=tuple(enc.tokens))
    if result.tokenizer.get("refused"):
        raise BadInput(f"--text: no tokeniser for this GGUF file: {result.tokenizer['refused']}")
    if result.vocab_path is None or not result.tokenizer:
        raise BadInput(f"{result.out_dir}: no tokeniser (a BERT vocab.txt or a tokenizer.json); "
                       "give token ids to embed() instead")
    vocab = load_vocab(result.vocab_path)
    s = result.tokenizer
    pieces = [s["cls_token"], *wordpiece(
        text, vocab, do_lower_case=s["do_lower_case"], strip_accents=s["strip_accents"],
        tokenize_chinese_chars=s["tokenize_chinese_chars"], unk_token=s["unk_token"],
        max_input_chars_per_word=s["max_input_chars_per_word"]), s["sep_token"]]
    missing = [p for p in pieces if p not in vocab]
    if missing:
        raise BadInput(f"{result.vocab_path}: has no token {missing[0]!r}")
    return Tokens(ids=tuple(vocab[p] for p in pieces), pieces=tuple(pieces))


# ---- embeddings --------------------------------------------------------------------------------

def embed(result_or_dir, token_ids, *, token_type_ids=None, dtype=np.float32) -> np.ndarray:
    """The embedding output for ``token_ids`` (positions 0, 1, ...): the ``[seq, d_model]``
    float input of block 0, as ``npu sim --input`` takes it (``dtype`` float32 by default).

    BERT: ``LayerNorm(word[id] + position[p] + token_type[t])`` with the checkpoint's epsilon
    (``token_type_ids`` default 0); GPT-2: ``wte[id] + wpe[p]``; the Llama family:
    ``embed_tokens[id]`` (positions enter the blocks by RoPE). Computed in float64.
    """
    result = _result(result_or_dir)
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise BadInput(f"token ids must be a non-empty 1-D integer sequence, not "
                       f"{ids.dtype} of shape {list(ids.shape)}")
    with np.load(result.embeddings_path) as npz:
        tables = {k: np.asarray(npz[k], np.float64) for k in npz.files}
    word = tables["word"]
    if ids.min() < 0 or ids.max() >= len(word):
        bad = int(ids[(ids < 0) | (ids >= len(word))][0])
        raise BadInput(f"token id {bad} is outside the vocabulary 0..{len(word) - 1}")
    if "position" in tables:
        position = tables["position"]
        if len(ids) > len(position):
            raise BadInput(f"{len(ids)} tokens exceed the {len(position)} position embeddings")
        x = word[ids] + position[:len(ids)]
    else:
        if result.positions and len(ids) > result.positions:
            raise BadInput(f"{len(ids)} tokens exceed the checkpoint's {result.positions} "
                           "positions")
        x = word[ids]
    if "token_type" in tables:
        types = np.zeros(len(ids), np.int64) if token_type_ids is None else \
            np.asarray(token_type_ids)
        if types.shape != ids.shape or types.min() < 0 or types.max() >= len(
                tables["token_type"]):
            raise BadInput(f"token_type_ids must be {len(ids)} ids in 0.."
                           f"{len(tables['token_type']) - 1}")
        x = x + tables["token_type"][types]
    elif token_type_ids is not None:
        raise BadInput(f"{result.architecture} has no token type embeddings")
    if "norm.weight" in tables:
        mean = x.mean(axis=-1, keepdims=True)
        var = x.var(axis=-1, keepdims=True)
        eps = float(tables["norm.eps"])
        x = (x - mean) / np.sqrt(var + eps) * tables["norm.weight"] + tables["norm.bias"]
    if not math.isfinite(float(np.abs(x).max())):
        raise BadInput(f"{result.embeddings_path}: the embedding output is not finite")
    return x.astype(dtype)


def logits(result_or_dir, hidden) -> np.ndarray:
    """The Llama family's head on the blocks' output ``hidden`` [seq, d_model]: the final
    RMSNorm with the checkpoint's own epsilon, then the LM head (the untied ``lm_head``, or the
    embedding table when tied): ``[seq, vocab_size]`` float64 logits."""
    result = _result(result_or_dir)
    with np.load(result.embeddings_path) as npz:
        tables = {k: np.asarray(npz[k], np.float64) for k in npz.files}
    if "final_norm.weight" not in tables:
        raise BadInput(f"{result.architecture}: the final norm and LM head are not imported")
    h = np.asarray(hidden, np.float64)
    d = tables["word"].shape[1]
    if h.ndim != 2 or h.shape[1] != d:
        raise BadInput(f"hidden states must be [seq, {d}], not {list(h.shape)}")
    eps = float(tables["final_norm.eps"])
    z = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + eps) * tables["final_norm.weight"]
    return z @ tables.get("lm_head", tables["word"]).T
