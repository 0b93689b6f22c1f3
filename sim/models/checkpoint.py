"""``npu import`` as functions: a Hugging Face checkpoint as the simulator's files, and the way
from text to the simulator's ``--input``.

:func:`import_checkpoint` reads a checkpoint directory (``config.json`` and ``model.safetensors``,
or a sharded ``model.safetensors.index.json``) of a BERT-family encoder (``model_type`` bert:
post-norm, GELU, bidirectional) or a GPT-2-family decoder (gpt2: pre-norm, causal) and writes,
into an output directory (``docs/formats.md``, "Checkpoints"):

- ``model.toml``: the shape and the quantisation scheme (:data:`IMPORT_QUANT`), loadable by
  :func:`hw.spec.load_model`;
- ``weights.npz``: every block's tensors by the names of ``docs/formats.md``, float32, ``x @ W``
  (BERT's Linear weights ``[out, in]`` transposed; GPT-2's Conv1D weights are ``x @ W``
  already, its fused ``c_attn`` split into Q, K and V);
- ``embeddings.npz``: ``word``, ``position`` (and BERT's ``token_type``) tables and the
  embedding LayerNorm (``norm.weight``, ``norm.bias``, ``norm.eps``), which the simulator does
  not model;
- ``vocab.txt`` (WordPiece checkpoints) and ``import.json`` (what was imported, from where,
  and what was left out).

:func:`tokenize` (a minimal BERT WordPiece: basic tokenisation, then greedy longest-match
word pieces, ``[CLS] ... [SEP]``) and :func:`embed` (the embedding output: the float input of
block 0) turn a sentence into the ``[seq, d_model]`` array ``npu sim --input`` takes.

Deviations of the float reference (:mod:`sim.golden.float_model`) from a checkpoint's own
arithmetic, recorded in ``import.json`` ``notes``: LayerNorm epsilon is 0 in the blocks
(BERT's 1e-12 is far below float64 rounding; GPT-2's 1e-5 changes a block's output by
about 1e-6 relative); GPT-2's ``gelu_new`` (the tanh approximation) is recorded as
``activation = "gelu"``, the exact erf GELU the project's reference and integer tables use
(the two differ by at most 4.7e-4 at x = 2.7).

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
import safetensors.numpy

from hw.spec import ConfigError, ModelConfig, load_model

from ..errors import BadInput
from ..golden.float_model import check_weights

__all__ = ["ARCHITECTURES", "IMPORT_QUANT", "ImportResult", "Tokens", "import_checkpoint",
           "load_import", "load_vocab", "wordpiece", "tokenize", "embed", "MODEL_FILE",
           "WEIGHTS_FILE", "EMBEDDINGS_FILE", "INFO_FILE", "VOCAB_FILE"]

#: ``config.json`` ``model_type`` values that can be imported.
ARCHITECTURES = ("bert", "gpt2")
MODEL_FILE = "model.toml"
WEIGHTS_FILE = "weights.npz"
EMBEDDINGS_FILE = "embeddings.npz"
INFO_FILE = "import.json"
VOCAB_FILE = "vocab.txt"

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


def _load_file(path: Path) -> dict[str, np.ndarray]:
    try:
        return safetensors.numpy.load_file(str(path))
    except FileNotFoundError:
        raise BadInput(f"{path}: file not found") from None
    except TypeError as exc:
        if "bfloat16" in str(exc):
            raise BadInput(f"{path}: has bfloat16 tensors, which NumPy cannot hold; save the "
                           "checkpoint in float32 or float16") from None
        raise BadInput(f"{path}: not a readable safetensors file ({exc})") from None
    except Exception as exc:   # safetensors raises its own SafetensorError (an Exception)
        raise BadInput(f"{path}: not a safetensors file ({exc})") from None


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
        value = self.data[key]
        ok = (isinstance(value, bool) if kind is bool else
              isinstance(value, int) and not isinstance(value, bool) if kind is int else
              isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float
              else isinstance(value, kind))
        if not ok:
            raise BadInput(f"{self.path}: field {key}={value!r} must be {kind.__name__}")
        if kind is int and value < 1:
            raise BadInput(f"{self.path}: field {key}={value!r} must be at least 1")
        return value

    def refuse(self, key, value, why):
        raise BadInput(f"{self.path}: field {key}={value!r} is not supported ({why})")

    def expect(self, key, value, why):
        """Refuse the field ``key`` unless it is absent or equal to ``value``."""
        got = self.get(key, type(value), value)
        if got != value:
            self.refuse(key, got, why)


class _Tensors:
    """Checkpoint tensors by name, with an optional prefix; records which were taken."""

    def __init__(self, tensors: dict, path: str, prefix: str):
        self.tensors, self.path, self.prefix = tensors, path, prefix
        self.used: set[str] = set()

    def take(self, name: str, shape: tuple) -> np.ndarray:
        full = self.prefix + name
        if full not in self.tensors:
            raise BadInput(f"{self.path}: missing tensor {full}")
        arr = self.tensors[full]
        if tuple(arr.shape) != tuple(shape):
            raise BadInput(f"{self.path}: tensor {full} has shape {list(arr.shape)}, expected "
                           f"{list(shape)} from config.json")
        if arr.dtype.kind != "f":
            raise BadInput(f"{self.path}: tensor {full} has dtype {arr.dtype}, expected float")
        self.used.add(full)
        return np.asarray(arr, np.float32)

    def has(self, name: str) -> bool:
        return self.prefix + name in self.tensors

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


_FAMILIES = {"bert": (_bert, "embeddings.word_embeddings.weight", ("", "bert.")),
             "gpt2": (_gpt2, "wte.weight", ("", "transformer."))}


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


def _seq_len(src: Path, positions: int, seq_len: int | None) -> int:
    """The position table's length, capped by a sentence-transformers ``max_seq_length``."""
    if seq_len is not None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int):
            raise BadInput(f"seq_len must be an integer, not {seq_len!r}")
        if not 1 <= seq_len <= positions:
            raise BadInput(f"seq_len={seq_len} is outside 1..{positions} (the checkpoint's "
                           "position embeddings)")
        return seq_len
    for path in (src / "sentence_bert_config.json", src.parent / "sentence_bert_config.json"):
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
    return json.dumps(str(value), ensure_ascii=False)


_TOML_KEYS = ("name", "description", "source", "n_layers", "d_model", "n_heads", "d_head",
              "d_ff", "seq_len", "window", "causal", "norm", "norm_kind", "activation", "ffn",
              "bias", "batch", "vocab_size", "tie_embeddings", "quant")

#: The quantisation scheme ``model.toml`` gets, by family: smooth16 where it was measured to
#: be needed (all-MiniLM-L6-v2: int8 loses 0.026 of cosine over six layers, smooth16 0.0013;
#: ``docs/accuracy.md``); GPT-2 keeps int8 until a real checkpoint is measured.
IMPORT_QUANT = {"bert": "smooth16", "gpt2": "int8"}


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


def import_checkpoint(src: str | Path, out_dir: str | Path, *, name: str | None = None,
                      seq_len: int | None = None) -> ImportResult:
    """Import the checkpoint in ``src`` into ``out_dir`` (created; files there are replaced).

    ``name`` defaults to the output directory's name. ``seq_len`` defaults to the position
    table's length (``max_position_embeddings``, GPT-2's ``n_positions``), capped by a
    sentence-transformers ``max_seq_length`` (``sentence_bert_config.json`` in ``src`` or its
    parent: the length the sentence model is used at); it may be set to anything from 1 to
    the table's length.
    """
    src, out = Path(src), Path(out_dir)
    if not src.is_dir():
        raise BadInput(f"{src}: not a checkpoint directory")
    config_path = src / "config.json"
    data = _read_json(config_path)
    family = data.get("model_type")
    if family not in _FAMILIES:
        raise BadInput(f"{config_path}: field model_type={family!r} is not supported (supported:"
                       f" {', '.join(ARCHITECTURES)})")
    tensors, files = _load_tensors(src)
    convert, probe, prefixes = _FAMILIES[family]
    t = _Tensors(tensors, ", ".join(str(f) for f in files),
                 _prefix(tensors, probe, prefixes))
    shape, weights, emb, positions, act, eps, notes = convert(
        _Config(data, config_path, family), t)
    vocab_src = src / VOCAB_FILE
    has_vocab = family == "bert" and vocab_src.exists()
    shape["seq_len"] = _seq_len(src, positions, seq_len)
    what = "GPT-2 decoder" if family == "gpt2" else "BERT encoder"
    kind = f"{shape['n_layers']}-layer {shape['norm']}-norm {what}"
    digest = _digest(files)
    fields = dict(shape, name=name or out.resolve().name, window=0, norm_kind="layernorm",
                  ffn="mlp", batch=1, d_head=shape["d_model"] // shape["n_heads"],
                  quant=IMPORT_QUANT[family],
                  description=f"imported by npu import: {kind} ({act})",
                  source=f"Hugging Face checkpoint {src.resolve()} (model_type {family}, "
                         f"sha256 {digest[:16]})")
    try:
        ModelConfig(**fields)
    except ConfigError as exc:
        raise BadInput(f"{config_path}: {exc}") from None
    try:
        check_weights(ModelConfig(**fields), weights, str(files[0]))
    except ValueError as exc:
        raise BadInput(str(exc)) from None

    _mkdir(out)
    paths = {k: out / f for k, f in (("model", MODEL_FILE), ("weights", WEIGHTS_FILE),
                                     ("embeddings", EMBEDDINGS_FILE), ("info", INFO_FILE))}
    toml = "".join(f"{k} = {_toml_value(fields[k])}\n" for k in _TOML_KEYS)
    tokenizer = _tokenizer_settings(src, has_vocab)
    try:
        paths["model"].write_text(toml, encoding="utf-8")
        np.savez(paths["weights"], **{k: np.ascontiguousarray(v) for k, v in weights.items()})
        np.savez(paths["embeddings"], **emb)
        vocab_path = None
        if has_vocab:
            vocab_path = out / VOCAB_FILE
            if vocab_src.resolve() != vocab_path.resolve():
                shutil.copyfile(vocab_src, vocab_path)
        info = {"architecture": family, "source": str(src.resolve()),
                "files": [f.name for f in files], "sha256": digest,
                "activation": act, "layer_norm_eps": eps, "tokenizer": tokenizer,
                "notes": notes, "ignored": list(t.ignored()),
                "model": MODEL_FILE, "weights": WEIGHTS_FILE, "embeddings": EMBEDDINGS_FILE,
                "vocab": VOCAB_FILE if has_vocab else None}
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
        vocab = info["vocab"]
        return ImportResult(
            model=model, out_dir=out, model_path=out / info["model"],
            weights_path=out / info["weights"], embeddings_path=out / info["embeddings"],
            info_path=info_path, vocab_path=None if vocab is None else out / vocab,
            architecture=info["architecture"], source=info["source"],
            activation=info["activation"], layer_norm_eps=float(info["layer_norm_eps"]),
            tokenizer=dict(info["tokenizer"]), notes=tuple(info["notes"]),
            ignored=tuple(info["ignored"]))
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
    """``[CLS] pieces [SEP]`` of ``text`` with the imported model's WordPiece vocabulary."""
    result = _result(result_or_dir)
    if result.vocab_path is None or not result.tokenizer:
        raise BadInput(f"{result.out_dir}: no WordPiece vocabulary ({VOCAB_FILE}); only BERT "
                       "checkpoints bring one: give token ids to embed() instead")
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
    (``token_type_ids`` default 0); GPT-2: ``wte[id] + wpe[p]``. Computed in float64.
    """
    result = _result(result_or_dir)
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
        raise BadInput(f"token ids must be a non-empty 1-D integer sequence, not "
                       f"{ids.dtype} of shape {list(ids.shape)}")
    with np.load(result.embeddings_path) as npz:
        tables = {k: np.asarray(npz[k], np.float64) for k in npz.files}
    word, position = tables["word"], tables["position"]
    if ids.min() < 0 or ids.max() >= len(word):
        bad = int(ids[(ids < 0) | (ids >= len(word))][0])
        raise BadInput(f"token id {bad} is outside the vocabulary 0..{len(word) - 1}")
    if len(ids) > len(position):
        raise BadInput(f"{len(ids)} tokens exceed the {len(position)} position embeddings")
    x = word[ids] + position[:len(ids)]
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
