"""``npu import``: a Hugging Face checkpoint folder or a llama.cpp GGUF file as the simulator's
files (:func:`sim.api.import_checkpoint`), and optionally a sentence as its ``--input``."""

from __future__ import annotations

import numpy as np

from ..errors import EXIT_OK, BadInput
from ..models.checkpoint import embed, import_checkpoint, tokenize
from .common import positive

__all__ = ["add_parser", "run", "INPUT_FILE"]

#: Where ``--text`` writes the embedding output, in the output directory.
INPUT_FILE = "input.npy"


def add_parser(sub):
    p = sub.add_parser("import", help="convert a Hugging Face checkpoint (config.json + "
                                      "model.safetensors) or a GGUF file into model, weights "
                                      "and embeddings")
    p.add_argument("checkpoint", metavar="CHECKPOINT_DIR|FILE.gguf")
    p.add_argument("-o", "--output", required=True, metavar="OUT_DIR")
    p.add_argument("--name", help="the model's name (default: OUT_DIR's name)")
    p.add_argument("--seq-len", type=positive,
                   help="tokens per sequence (default: the position table's length, capped by "
                        "a sentence-transformers max_seq_length)")
    p.add_argument("--text", help=f"also write OUT_DIR/{INPUT_FILE}: this sentence's embedding "
                                  "output, float32 [seq, d_model], for npu sim --input")
    p.set_defaults(run=run)


def run(args) -> int:
    result = import_checkpoint(args.checkpoint, args.output, name=args.name,
                               seq_len=args.seq_len)
    cfg = result.model
    x = None
    if args.text is not None:
        # Before any output: a refused --text is one line on stderr, nothing on stdout.
        tokens = tokenize(result, args.text)
        if len(tokens.ids) > cfg.seq_len:
            raise BadInput(f"--text: {len(tokens.ids)} tokens exceed seq_len {cfg.seq_len}")
        x = embed(result, tokens.ids)
    kv = f" ({cfg.n_kv_heads} K/V)" if cfg.n_kv_heads != cfg.n_heads else ""
    rope = f", RoPE theta {cfg.rope_theta:g}" if cfg.rope else ""
    print(f"{result.model_path}: {cfg.name} ({result.architecture}: {cfg.n_layers} layers, "
          f"d_model {cfg.d_model}, {cfg.n_heads} heads of {cfg.d_head}{kv}, d_ff {cfg.d_ff}, "
          f"seq_len {cfg.seq_len}, {cfg.norm}-norm, {'causal' if cfg.causal else 'bidirectional'}"
          f"{rope}, {result.activation})")
    with np.load(result.weights_path) as npz:
        print(f"{result.weights_path}: {len(npz.files)} tensors (float32, x @ W)")
    with np.load(result.embeddings_path) as npz:
        tables = ", ".join(f"{k} {list(npz[k].shape)}" for k in npz.files if npz[k].ndim == 2)
    print(f"{result.embeddings_path}: {tables}")
    for note in result.notes:
        print(f"note: {note}")
    if result.ignored:
        shown = ", ".join(result.ignored[:4]) + (", ..." if len(result.ignored) > 4 else "")
        print(f"not imported: {len(result.ignored)} tensors ({shown})")
    if x is not None:
        path = result.out_dir / INPUT_FILE
        try:
            np.save(path, x)
        except OSError as exc:
            raise BadInput(f"cannot write {path}: {exc.strerror}") from None
        print(f"{path}: {len(tokens.ids)} tokens: {' '.join(tokens.pieces)}")
    return EXIT_OK
