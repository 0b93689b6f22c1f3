"""llama.cpp's GGUF files as the checkpoint importer reads them (:func:`read_gguf`).

A GGUF file holds metadata (``general.architecture``, then ``{arch}.``-prefixed
hyperparameters and ``tokenizer.ggml.*``) and tensors in GGML's block formats, read with the
``gguf`` package (``GGUFReader``, ``gguf.quants.dequantize``). :func:`read_gguf` gives:

- the Llama-family shape from the metadata (architectures ``llama`` and ``qwen2``), each key
  refused with one line naming it;
- the tensors by llama.cpp's names (``blk.N.attn_q.weight``, ...), dequantised to float32 when
  read (:data:`TENSOR_TYPES`: F32, F16, BF16, Q8_0, Q4_0, Q4_1; any other type is refused
  naming it), ``[out, in]`` like torch's Linear, and for ``llama`` with llama.cpp's row
  permutation of Q and K undone (:func:`unpermute`);
- a :class:`tokenizers.Tokenizer` rebuilt from ``tokenizer.ggml.*`` (:func:`gguf_tokenizer`):
  SentencePiece-style BPE (``tokenizer.ggml.model = "llama"``: merges by the merged piece's
  score, byte fallback, the ``▁`` space prefix) or byte-level BPE (``"gpt2"``, with
  ``tokenizer.ggml.merges`` and the pre-tokeniser of ``tokenizer.ggml.pre``: ``default``,
  ``gpt-2``, ``llama-bpe``, ``qwen2``, ``smollm``, ``starcoder``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from ..errors import BadInput

__all__ = ["ARCHITECTURES", "TENSOR_TYPES", "GgufCheckpoint", "read_gguf", "unpermute",
           "gguf_tokenizer"]

#: ``general.architecture`` values that can be imported.
ARCHITECTURES = ("llama", "qwen2")
#: GGML tensor types that are dequantised (by name: ``gguf.GGMLQuantizationType``).
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")

# SentencePiece token types (tokenizer.ggml.token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

#: Pre-tokeniser regular expressions of byte-level BPE, by ``tokenizer.ggml.pre`` (as
#: llama.cpp's llama-vocab.cpp splits): None is GPT-2's own, the ``ByteLevel`` pre-tokeniser's
#: default; ``DIGITS`` is each digit alone first, then GPT-2's (llama.cpp's SMOLLM and
#: STARCODER, Hugging Face's ``Digits(individual_digits=True)`` before ``ByteLevel``).
DIGITS = "digits"
_PRE = {
    "default": None,
    "gpt-2": None,
    "smollm": DIGITS,
    "starcoder": DIGITS,
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                 r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
             r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
_PRE["llama3"] = _PRE["llama-bpe"]


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of Q and K rows (``convert_hf_to_gguf.py``: ``w.reshape(
    n_head, 2, rows // n_head // 2, ...).swapaxes(1, 2).reshape(w.shape)``, which turns
    Hugging Face's half-rotation RoPE layout into GGML's interleaved pairs) exactly: rows
    (or bias entries) back in Hugging Face's order. K is permuted with the K/V head count."""
    rows = w.shape[0]
    return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


class _Tensors(Mapping):
    """The file's tensors by name, dequantised to float32 (and unpermuted) when read."""

    def __init__(self, path: Path, reader, permute: dict[str, int]):
        self.path, self.permute = path, permute
        self.by_name = {t.name: t for t in reader.tensors}

    def __getitem__(self, name: str) -> np.ndarray:
        # Deferred: the gguf package costs 0.15 s to import, only GGUF imports need it.
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        t = self.by_name[name]
        kind = GGMLQuantizationType(t.tensor_type).name
        if kind not in TENSOR_TYPES:
            raise BadInput(f"{self.path}: tensor {name} has type {kind}, which is not supported "
                           f"(supported: {', '.join(TENSOR_TYPES)})")
        arr = np.asarray(dequantize(t.data, t.tensor_type), np.float32)
        arr = arr.reshape([int(n) for n in reversed(t.shape.tolist())])   # GGML: ne0 first
        heads = self.permute.get(name.rsplit(".", 2)[-2]) if name.startswith("blk.") else None
        return unpermute(arr, heads) if heads else arr

    def __iter__(self):
        return iter(self.by_name)

    def __len__(self):
        return len(self.by_name)

    def type_of(self, name: str) -> str:
        # Deferred, as above.
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.by_name[name].tensor_type).name


@dataclass
class GgufCheckpoint:
    """What :func:`read_gguf` found: the architecture, the shape (the keyword arguments of the
    importer's Llama shape), the tensors (a lazy mapping), the metadata and notes."""

    path: Path
    arch: str
    dims: dict
    tensors: _Tensors
    fields: dict
    notes: list

    def types(self) -> dict[str, int]:
        """How many tensors of each GGML type the file has."""
        out: dict[str, int] = {}
        for name in self.tensors:
            kind = self.tensors.type_of(name)
            out[kind] = out.get(kind, 0) + 1
        return out


def _fields(reader) -> dict:
    out = {}
    for name, field in reader.fields.items():
        try:
            out[name] = field.contents()
        except Exception:       # a value this gguf version cannot decode: left out
            continue
    return out


def checked_value(path, word: str, key: str, value, kind):
    """``value`` of the metadata ``word`` (key, field) ``key`` if it is a ``kind`` (bool, int
    at least 1, float (an int too), or another type); else one line naming the file."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = (isinstance(value, bool) if kind is bool else
          number and isinstance(value, int) if kind is int else
          number if kind is float else isinstance(value, kind))
    if not ok:
        raise BadInput(f"{path}: {word} {key}={value!r} must be {kind.__name__}")
    if kind is int and value < 1:
        raise BadInput(f"{path}: {word} {key}={value!r} must be at least 1")
    return value


class _Meta:
    """GGUF metadata keys, each refused with one line naming the file and the key."""

    def __init__(self, fields: dict, path: Path):
        self.fields, self.path = fields, path

    def get(self, key, kind, default=None):
        if key not in self.fields:
            if default is None:
                raise BadInput(f"{self.path}: missing key {key}")
            return default
        return checked_value(self.path, "key", key, self.fields[key], kind)

    def refuse(self, key, value, why):
        raise BadInput(f"{self.path}: key {key}={value!r} is not supported ({why})")


def read_gguf(path: str | Path) -> GgufCheckpoint:
    """The shape, tensors and metadata of the GGUF file ``path``."""
    # Deferred, as in _Tensors.
    from gguf import GGUFReader

    path = Path(path)
    try:
        reader = GGUFReader(str(path), "r")
    except FileNotFoundError:
        raise BadInput(f"{path}: file not found") from None
    except Exception as exc:       # gguf raises ValueError and others on a bad file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadInput(f"{path}: not a GGUF file ({first})") from None
    fields = _fields(reader)
    m = _Meta(fields, path)
    arch = m.get("general.architecture", str)
    if arch not in ARCHITECTURES:
        m.refuse("general.architecture", arch, f"supported: {', '.join(ARCHITECTURES)}")
    a = f"{arch}."
    layers = m.get(a + "block_count", int)
    d = m.get(a + "embedding_length", int)
    heads = m.get(a + "attention.head_count", int)
    kv = m.get(a + "attention.head_count_kv", int, heads)
    if d % heads:
        m.refuse(a + "embedding_length", d, f"not a multiple of {a}attention.head_count={heads}")
    if heads % kv:
        m.refuse(a + "attention.head_count_kv", kv, f"must divide {a}attention.head_count="
                                                   f"{heads}")
    d_head = d // heads
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        value = m.get(a + key, int, d_head)
        if value != d_head:
            m.refuse(a + key, value, f"must be {a}embedding_length / {a}attention.head_count = "
                                     f"{d_head}: RoPE rotates the whole head")
    experts = fields.get(a + "expert_count", 0)
    if experts:
        m.refuse(a + "expert_count", experts, "mixture-of-experts FFNs are not modelled")
    scaling = fields.get(a + "rope.scaling.type")
    if scaling not in (None, "none"):
        m.refuse(a + "rope.scaling.type", scaling, "only plain RoPE: no RoPE scaling")
    factor = fields.get(a + "rope.scaling.factor")
    if factor not in (None, 0, 1) and scaling != "none":
        m.refuse(a + "rope.scaling.factor", factor, "only plain RoPE: no RoPE scaling")
    for key in ("attention.sliding_window", "attention.layer_norm_epsilon"):
        if a + key in fields:
            m.refuse(a + key, fields[a + key], "sliding windows are not read from GGUF"
                     if "sliding" in key else "RMSNorm blocks have no LayerNorm epsilon")
    theta = float(m.get(a + "rope.freq_base", float, 10000.0))
    if theta <= 1:
        m.refuse(a + "rope.freq_base", theta, "RoPE needs a base above 1")
    eps = float(str(np.float32(m.get(a + "attention.layer_norm_rms_epsilon", float))))
    permute = {"attn_q": heads, "attn_k": kv} if arch == "llama" else {}
    tensors = _Tensors(path, reader, permute)
    if "rope_freqs.weight" in tensors:
        raise BadInput(f"{path}: tensor rope_freqs.weight is not supported (RoPE frequency "
                       "factors: RoPE scaling)")
    if "token_embd.weight" not in tensors:
        raise BadInput(f"{path}: missing tensor token_embd.weight")
    rows = int(tensors.by_name["token_embd.weight"].shape[-1])
    vocab = m.get(a + "vocab_size", int, rows)
    tokens = fields.get("tokenizer.ggml.tokens")
    biases = tuple(ours for ours, theirs in (
        ("attn.wq", "attn_q"), ("attn.wk", "attn_k"), ("attn.wv", "attn_v"),
        ("attn.wo", "attn_output"), ("ffn.wg", "ffn_gate"), ("ffn.w1", "ffn_up"),
        ("ffn.w2", "ffn_down")) if f"blk.0.{theirs}.bias" in tensors)
    dims = {"layers": layers, "d": d, "heads": heads, "kv_heads": kv,
            "d_ff": m.get(a + "feed_forward_length", int),
            "positions": m.get(a + "context_length", int), "vocab": vocab, "theta": theta,
            "eps": eps, "tied": "output.weight" not in tensors, "window": 0, "act": "silu",
            "biases": biases}
    notes = []
    if arch == "llama":
        notes.append("Q and K rows unpermuted (llama.cpp's interleaved RoPE pairs back to "
                     "Hugging Face's halves)")
    if tokens is not None and len(tokens) != vocab:
        notes.append(f"tokenizer.ggml.tokens has {len(tokens)} tokens, the embedding table "
                     f"{vocab} rows")
    return GgufCheckpoint(path=path, arch=arch, dims=dims, tensors=tensors, fields=fields,
                          notes=notes)


# ---- the tokeniser ----------------------------------------------------------------------------

def _spm_merges(tokens: list[str], scores: list[float], vocab: dict[str, int]):
    """SentencePiece BPE as ranked merges: every split of a piece into two pieces of the
    vocabulary, ranked by the merged piece's score (highest first), then by the two ids
    (transformers' SentencePieceExtractor does the same)."""
    merges = []
    for piece, score in zip(tokens, scores, strict=True):
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges += local
    merges.sort(key=lambda m: -m[2])
    return [(left, right) for left, right, _ in merges]


def gguf_tokenizer(ckpt: GgufCheckpoint):
    """A :class:`tokenizers.Tokenizer` equivalent to the file's ``tokenizer.ggml.*``."""
    f, path = ckpt.fields, ckpt.path
    m = _Meta(f, path)
    kind = m.get("tokenizer.ggml.model", str)
    tokens = m.get("tokenizer.ggml.tokens", list)
    types = f.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        m.refuse("tokenizer.ggml.token_type", f"{len(types)} entries",
                 f"tokenizer.ggml.tokens has {len(tokens)}")
    vocab: dict[str, int] = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    if kind == "llama":
        scores = m.get("tokenizer.ggml.scores", list)
        if len(scores) != len(tokens):
            m.refuse("tokenizer.ggml.scores", f"{len(scores)} entries",
                     f"tokenizer.ggml.tokens has {len(tokens)}")
        unk = tokens[f.get("tokenizer.ggml.unknown_token_id", 0)]
        byte_fallback = any(t == _BYTE for t in types)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=_spm_merges(tokens, scores, vocab),
                                   unk_token=unk, fuse_unk=True, byte_fallback=byte_fallback))
        steps = [normalizers.Replace(" ", "▁")]
        if f.get("tokenizer.ggml.add_space_prefix", True):
            steps.insert(0, normalizers.Prepend("▁"))
        tok.normalizer = normalizers.Sequence(steps)
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        add_bos_default = True
    elif kind == "gpt2":
        merges = [tuple(line.split(" ", 1)) for line in m.get("tokenizer.ggml.merges", list)]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        pre = m.get("tokenizer.ggml.pre", str, "default")
        if pre not in _PRE:
            m.refuse("tokenizer.ggml.pre", pre, f"known: {', '.join(sorted(_PRE))}")
        if _PRE[pre] is None:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        elif _PRE[pre] == DIGITS:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_PRE[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        add_bos_default = False
    else:
        m.refuse("tokenizer.ggml.model", kind, "tokenisers rebuilt from GGUF: llama "
                                               "(SentencePiece BPE), gpt2 (byte-level BPE)")
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types, strict=True) if ty == _CONTROL]
    tok.add_special_tokens(special)
    tok.add_tokens([AddedToken(t, normalized=False) for t, ty in zip(tokens, types, strict=True)
                    if ty == _USER_DEFINED])
    if f.get("tokenizer.ggml.add_bos_token", add_bos_default):
        bos_id = f.get("tokenizer.ggml.bos_token_id", 1)
        if not isinstance(bos_id, int) or not 0 <= bos_id < len(tokens):
            m.refuse("tokenizer.ggml.bos_token_id", bos_id, f"not a token id 0..{len(tokens) - 1}")
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)])
    return tok
