"""``npu import``: files and summary on success, ``--text`` as the simulator's input, and the
exit-status contract (2 with one line naming the field, no traceback) on refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim import errors
from sim.cli import main
from sim.cli.main import COMMANDS
from sim.models.checkpoint import embed, load_import, tokenize

from ..checkpoints import write_bert, write_gpt2


def run(capsys, *argv):
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_registered_with_help(capsys):
    assert "import" in COMMANDS
    status, out, err = run(capsys, "import", "-h")
    assert status == errors.EXIT_OK and err == ""
    assert out.startswith("usage: npu import ") and "CHECKPOINT_DIR" in out
    status, out, _ = run(capsys, "--help")
    assert "\n    import " in out


def test_bert_with_text(capsys, tmp_path):
    src, out_dir = tmp_path / "ckpt", tmp_path / "out"
    write_bert(src)
    status, out, err = run(capsys, "import", src, "-o", out_dir, "--name", "tinybert",
                           "--text", "A man is playing guitar.")
    assert status == errors.EXIT_OK, err
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == (f"{out_dir / 'model.toml'}: tinybert (bert: 2 layers, d_model 32, 4 heads"
                        " of 8, d_ff 64, seq_len 24, post-norm, bidirectional, gelu)")
    assert lines[1] == f"{out_dir / 'weights.npz'}: 32 tensors (float32, x @ W)"
    assert lines[2].endswith("word [35, 32], position [24, 32], token_type [2, 32]")
    assert lines[-1] == (f"{out_dir / 'input.npy'}: 9 tokens: [CLS] a man is play ##ing guitar "
                         ". [SEP]")
    assert any(line.startswith("not imported: 3 tensors (") for line in lines)
    x = np.load(out_dir / "input.npy")
    result = load_import(out_dir)
    assert x.dtype == np.float32 and x.shape == (9, 32)
    assert np.array_equal(x, embed(result, tokenize(result, "A man is playing guitar.").ids))
    assert result.model.name == "tinybert"


def test_gpt2_notes(capsys, tmp_path):
    src = tmp_path / "ckpt"
    write_gpt2(src)
    status, out, _ = run(capsys, "import", src, "-o", tmp_path / "out", "--seq-len", "16")
    assert status == errors.EXIT_OK
    assert "seq_len 16, pre-norm, causal, gelu_new)" in out
    assert "note: activation_function gelu_new (tanh approximation) is recorded as gelu" in out
    assert json.loads((tmp_path / "out" / "import.json").read_text())["architecture"] == "gpt2"


def assert_one_line_error(status, out, err, *fragments):
    assert status == errors.EXIT_BAD_INPUT, f"exit status {status}, stderr {err!r}"
    assert out == ""
    assert err.startswith("npu import: ") and err.count("\n") == 1 and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"


@pytest.mark.parametrize("break_it, fragments", [
    (lambda src: (src / "config.json").write_text(json.dumps({"model_type": "t5"})),
     ["config.json: field model_type='t5' is not supported (supported: bert, gpt2, llama, "
      "mistral, qwen2)"]),
    (lambda src: (src / "model.safetensors").unlink(), ["model.safetensors: file not found"]),
    (lambda src: (src / "config.json").write_text(json.dumps(dict(json.loads(
        (src / "config.json").read_text()), num_hidden_layers=4))),
     ["missing tensor encoder.layer.2.attention.self.query.weight"]),
])
def test_refusals_exit_2(capsys, tmp_path, break_it, fragments):
    src = tmp_path / "ckpt"
    write_bert(src)
    break_it(src)
    assert_one_line_error(*run(capsys, "import", src, "-o", tmp_path / "out"), *fragments)


def test_text_refusals(capsys, tmp_path):
    src = tmp_path / "ckpt"
    write_gpt2(src)
    assert_one_line_error(*run(capsys, "import", src, "-o", tmp_path / "out", "--text", "hi"),
                          "no tokeniser (a BERT vocab.txt or a tokenizer.json)")
    bert = tmp_path / "bert"
    write_bert(bert, sentence_config={"max_seq_length": 4})
    assert_one_line_error(*run(capsys, "import", bert, "-o", tmp_path / "out2", "--text",
                               "a man is playing"), "--text: 7 tokens exceed seq_len 4")
    assert_one_line_error(*run(capsys, "import", bert, "-o", tmp_path / "out3", "--seq-len",
                               "0"), "--seq-len")
