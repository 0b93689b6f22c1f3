"""Constraint files: each rejection names file, key, value and limit; presets load, round-trip."""

import dataclasses
import math
import re
import sys

import pytest

from hw.spec import PRESETS_DIR, ConfigError, ModelConfig, NpuConfig
from hw.spec.config import IMEM_WORDS_MAX, load_model, load_npu, model_preset, npu_preset
from tests.helpers import write_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# A valid NPU file (the tiny preset's values) and a valid model file; tests override keys.
NPU = {
    "array_size": 4, "sram_bytes": 65536, "sram_banks": 4, "imem_words": 1024, "vector_lanes": 4,
    "max_seq_len": 64, "attn_window": 16, "softmax_len": 16, "d_head_max": 16, "d_model_max": 64,
    "link_bytes_per_cycle": 4, "link_latency_cycles": 2, "link_bidirectional": False,
    "clock_mhz": 100.0,
}
MODEL = {
    "n_layers": 2, "d_model": 32, "n_heads": 4, "d_head": 8, "d_ff": 64, "seq_len": 8,
    "window": 0, "causal": True, "norm": "pre", "norm_kind": "layernorm", "activation": "gelu",
    "ffn": "mlp", "bias": True, "batch": 1, "vocab_size": 0, "tie_embeddings": False,
}
DROP = object()


def write(tmp_path, base, file="cfg.toml", **overrides):
    values = {**base, **overrides}
    return write_toml(tmp_path / file, {k: v for k, v in values.items() if v is not DROP})


def rejects(loader, path, *fragments):
    """Load ``path``; expect one ConfigError line containing every fragment and the file name."""
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in (*fragments, f"({path})"))
    with pytest.raises(ConfigError, match=pattern) as info:
        loader(path)
    message = str(info.value)
    assert "\n" not in message, f"message is not one line: {message!r}"
    assert info.value.path == str(path)
    return info.value


# --- files that cannot be read -----------------------------------------------------------------

@pytest.mark.parametrize("loader", [load_npu, load_model])
def test_missing_file(tmp_path, loader):
    rejects(loader, tmp_path / "nosuch.toml", "file not found")


@pytest.mark.parametrize("loader", [load_npu, load_model])
def test_directory(tmp_path, loader):
    rejects(loader, tmp_path, "is a directory, expected a TOML file")


@pytest.mark.parametrize("loader", [load_npu, load_model])
def test_not_utf8(tmp_path, loader):
    path = tmp_path / "latin1.toml"
    path.write_bytes('name = "caf\u00e9"\n'.encode("latin-1"))
    rejects(loader, path, "is not UTF-8 text")


@pytest.mark.parametrize("loader", [load_npu, load_model])
@pytest.mark.parametrize("text, where", [
    ("array_size = \n", "line 1"),
    ("array_size = 4\narray_size = 8\n", "line 2"),
    ("[npu\n", "line 1"),
    ("x = [1, 2\n", "Unclosed array (at end of document)"),
])
def test_bad_toml(tmp_path, loader, text, where):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    rejects(loader, path, "bad TOML: ", where)


# --- keys ---------------------------------------------------------------------------------------

def test_npu_unknown_key(tmp_path):
    error = rejects(load_npu, write(tmp_path, NPU, arrray_size=4),
                    "arrray_size=4 unknown key; known keys are", "array_size", "clock_mhz")
    assert (error.key, error.value) == ("arrray_size", 4)


def test_npu_unknown_table(tmp_path):
    path = tmp_path / "cfg.toml"
    path.write_text(write(tmp_path, NPU).read_text() + "[link]\nwidth = 4\n")
    rejects(load_npu, path, "link={'width': 4} unknown key")


def test_model_unknown_key(tmp_path):
    rejects(load_model, write(tmp_path, MODEL, heads=4),
            "heads=4 unknown key; known keys are", "n_heads")


@pytest.mark.parametrize("key", ["array_size", "sram_bytes", "max_seq_len", "attn_window",
                                 "softmax_len", "d_head_max", "d_model_max"])
def test_npu_missing_required_key(tmp_path, key):
    error = rejects(load_npu, write(tmp_path, NPU, **{key: DROP}),
                    f"missing required key '{key}' (")
    assert error.key == key


@pytest.mark.parametrize("key", ["n_layers", "d_model", "n_heads", "d_ff", "seq_len"])
def test_model_missing_required_key(tmp_path, key):
    error = rejects(load_model, write(tmp_path, MODEL, **{key: DROP}),
                    f"missing required key '{key}' (")
    assert error.key == key


@pytest.mark.parametrize("key, value, shown, expected", [
    ("array_size", "4", "'4'", "has type str, expected int"),
    ("array_size", True, "True", "has type bool, expected int"),
    ("sram_bytes", 65536.0, "65536.0", "has type float, expected int"),
    ("imem_words", 1024.5, "1024.5", "has type float, expected int"),
    ("link_bidirectional", 1, "1", "has type int, expected bool"),
    ("link_bidirectional", "yes", "'yes'", "has type str, expected bool"),
    ("clock_mhz", "fast", "'fast'", "has type str, expected float"),
    ("clock_mhz", True, "True", "has type bool, expected float"),
    ("name", 5, "5", "has type int, expected str"),
    ("vector_pipeline", 8, "8", "has type int, expected str"),
    ("attention_pipeline", 3, "3", "has type int, expected str"),
])
def test_npu_wrong_type(tmp_path, key, value, shown, expected):
    error = rejects(load_npu, write(tmp_path, NPU, **{key: value}), f"{key}={shown} {expected}")
    assert (error.key, error.value) == (key, value)


@pytest.mark.parametrize("key, value, shown, expected", [
    ("n_layers", "4", "'4'", "has type str, expected int"),
    ("d_model", 32.0, "32.0", "has type float, expected int"),
    ("batch", True, "True", "has type bool, expected int"),
    ("causal", 1, "1", "has type int, expected bool"),
    ("bias", 0, "0", "has type int, expected bool"),
    ("norm", 1, "1", "has type int, expected str"),
])
def test_model_wrong_type(tmp_path, key, value, shown, expected):
    rejects(load_model, write(tmp_path, MODEL, **{key: value}), f"{key}={shown} {expected}")


def test_int_accepted_for_float(tmp_path):
    npu = load_npu(write(tmp_path, NPU, clock_mhz=125))
    assert npu.clock_mhz == 125.0 and isinstance(npu.clock_mhz, float)


# --- values -------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, minimum", [
    ("array_size", 1, 2), ("array_size", 0, 2), ("array_size", -4, 2),
    ("sram_bytes", 0, 1), ("sram_bytes", -65536, 1),
    ("sram_banks", 0, 1), ("imem_words", 0, 16), ("imem_words", 15, 16),
    ("vector_lanes", -1, 0), ("max_seq_len", 0, 1), ("attn_window", 0, 1),
    ("softmax_len", 1, 2), ("softmax_len", -16, 2), ("d_head_max", 0, 1), ("d_model_max", 0, 1),
    ("link_bytes_per_cycle", 0, 1), ("link_latency_cycles", 0, 1),
    ("link_latency_cycles", -2, 1),
])
def test_npu_below_minimum(tmp_path, key, value, minimum):
    rejects(load_npu, write(tmp_path, NPU, **{key: value}),
            f"{key}={value} is below the minimum {minimum}")


@pytest.mark.parametrize("key, value, minimum", [
    ("n_layers", 0, 1), ("d_model", 0, 1), ("d_model", -32, 1), ("n_heads", 0, 1),
    ("d_head", -8, 0), ("d_ff", 0, 1), ("seq_len", 0, 1), ("window", -1, 0), ("batch", 0, 1),
    ("vocab_size", -1, 0),
])
def test_model_below_minimum(tmp_path, key, value, minimum):
    rejects(load_model, write(tmp_path, MODEL, **{key: value}),
            f"{key}={value} is below the minimum {minimum}")


def test_imem_words_absurd(tmp_path):
    value = IMEM_WORDS_MAX * 2
    rejects(load_npu, write(tmp_path, NPU, imem_words=value),
            f"imem_words={value} is above the maximum {IMEM_WORDS_MAX}")
    assert load_npu(write(tmp_path, NPU, imem_words=IMEM_WORDS_MAX)).imem_words == IMEM_WORDS_MAX


@pytest.mark.parametrize("overrides, fragments", [
    ({"sram_bytes": 65535}, ["sram_bytes=65535 is not a multiple of sram_banks * array_size",
                              "= 4 * 4 = 16"]),
    ({"sram_bytes": 65536 + 8}, ["sram_bytes=65544 is not a multiple", "= 16"]),
    ({"sram_banks": 3}, ["sram_bytes=65536 is not a multiple", "= 3 * 4 = 12"]),
    ({"attn_window": 128, "softmax_len": 128}, ["attn_window=128 exceeds max_seq_len 64"]),
    ({"softmax_len": 8}, ["softmax_len=8 is shorter than attn_window 16"]),
    ({"d_head_max": 128}, ["d_head_max=128 exceeds d_model_max 64"]),
    ({"array_size": 128}, ["array_size=128 exceeds d_model_max 64"]),
    ({"vector_lanes": 128}, ["vector_lanes=128 exceeds d_model_max 64"]),
    ({"sram_bytes": 49152}, ["sram_bytes=49152 makes banks of sram_bytes / array_size / "
                             "sram_banks = 49152 / 4 / 4 = 3072 words, not a power of two"]),
    ({"link_bytes_per_cycle": 6}, ["link_bytes_per_cycle=6 is not a power of two"]),
    ({"attn_window": 65537}, ["attn_window=65537 exceeds the attention buffer's 16-bit "
                              "positions (65536 keys)"]),
    ({"d_model_max": 65536}, ["d_model_max=65536 exceeds the vector unit's 16-bit row length "
                              "(65535)"]),
    ({"clock_mhz": 0.0}, ["clock_mhz=0.0 must be positive and finite"]),
    ({"clock_mhz": -100.0}, ["clock_mhz=-100.0 must be positive and finite"]),
    ({"clock_mhz": math.nan}, ["clock_mhz=nan must be positive and finite"]),
    ({"clock_mhz": math.inf}, ["clock_mhz=inf must be positive and finite"]),
    ({"vector_pipeline": "fast"}, ["vector_pipeline='fast' is not one of 'short', 'deep'"]),
    ({"attention_pipeline": "fast"}, ["attention_pipeline='fast' is not one of 'short', 'deep'"]),
])
def test_npu_impossible_values(tmp_path, overrides, fragments):
    rejects(load_npu, write(tmp_path, NPU, **overrides), *fragments)


@pytest.mark.parametrize("overrides, fragments", [
    ({"d_model": 96}, ["d_model=96 is not n_heads * d_head = 4 * 8 = 32"]),
    ({"d_head": 16}, ["d_model=32 is not n_heads * d_head = 4 * 16 = 64"]),
    ({"d_model": 30, "d_head": DROP},
     ["d_model=30 is not a multiple of n_heads 4; set d_head explicitly"]),
    ({"d_model": 30, "d_head": 0}, ["d_model=30 is not a multiple of n_heads 4"]),
    ({"window": 16}, ["window=16 exceeds seq_len 8 (use 0 for full attention)"]),
    ({"norm": "mid"}, ["norm='mid' is not one of 'pre', 'post'"]),
    ({"norm_kind": "batchnorm"}, ["norm_kind='batchnorm' is not one of 'layernorm', 'rmsnorm'"]),
    ({"activation": "tanh"}, ["activation='tanh' is not one of 'gelu', 'relu', 'silu'"]),
    ({"ffn": "moe"}, ["ffn='moe' is not one of 'mlp', 'gated'"]),
    ({"norm": "Pre"}, ["norm='Pre' is not one of"]),
    ({"quant": "int4"}, ["quant='int4' is not one of 'int8', 'smooth16'"]),
    ({"n_kv_heads": 3}, ["n_kv_heads=3 must divide n_heads 4"]),
    ({"n_kv_heads": 8}, ["n_kv_heads=8 must divide n_heads 4"]),
    ({"rope_theta": 1.0}, ["rope_theta=1.0 needs a base above 1 and an even d_head (d_head=8)"]),
    ({"rope_theta": 10000.0, "d_model": 36, "n_heads": 4, "d_head": 9},
     ["rope_theta=10000.0 needs a base above 1 and an even d_head (d_head=9)"]),
    ({"smooth_alpha": 1.5}, ["smooth_alpha=1.5 is outside [0, 1]"]),
    ({"smooth_alpha": -0.1}, ["smooth_alpha=-0.1 is outside [0, 1]"]),
    ({"smooth_alpha": "high"}, ["smooth_alpha='high' has type str, expected float"]),
])
def test_model_inconsistent_values(tmp_path, overrides, fragments):
    rejects(load_model, write(tmp_path, MODEL, **overrides), *fragments)


def test_npu_overrides_replace_file_values(tmp_path):
    path = write(tmp_path, NPU)
    npu = load_npu(path, {"link_bytes_per_cycle": 8, "sram_bytes": 32768})
    assert (npu.link_bytes_per_cycle, npu.sram_bytes, npu.array_size) == (8, 32768, 4)
    assert load_npu(path) == load_npu(path, {})


@pytest.mark.parametrize("overrides, key, fragments", [
    ({"link_bytes_per_cycle": 0}, "link_bytes_per_cycle",
     ["link_bytes_per_cycle=0 is below the minimum 1"]),
    ({"link_bytes_per_cycle": "wide"}, "link_bytes_per_cycle",
     ["link_bytes_per_cycle='wide' has type str, expected int"]),
    # A value that breaks another key's limit: the error names that key.
    ({"sram_banks": 3}, "sram_bytes", ["sram_bytes=65536 is not a multiple", "= 3 * 4 = 12"]),
    ({"array_sise": 8}, "array_sise", ["array_sise=8 unknown key"]),
])
def test_npu_overrides_are_checked_like_the_file(tmp_path, overrides, key, fragments):
    path = write(tmp_path, NPU)
    error = rejects(lambda p: load_npu(p, overrides), path, *fragments)
    assert error.key == key


def test_direct_construction_is_validated():
    # Dataclass construction and `dataclasses.replace` go through the same checks, without a file.
    npu = npu_preset("tiny")
    with pytest.raises(ConfigError, match=r"^softmax_len=8 is shorter than attn_window 16"):
        dataclasses.replace(npu, softmax_len=8, path=None)
    with pytest.raises(ConfigError, match=r"^array_size=True has type bool, expected int$"):
        NpuConfig(array_size=True, sram_bytes=64, max_seq_len=4, attn_window=4, softmax_len=4,
                  d_head_max=4, d_model_max=4)
    with pytest.raises(ConfigError, match=r"^window=9 exceeds seq_len 8 .*$"):
        ModelConfig(n_layers=1, d_model=8, n_heads=2, d_ff=8, seq_len=8, window=9)


# --- presets ------------------------------------------------------------------------------------

NPU_PRESETS = sorted((PRESETS_DIR / "npu").glob("*.toml"))
MODEL_PRESETS = sorted((PRESETS_DIR / "models").glob("*.toml"))


@pytest.mark.parametrize("overrides, match", [
    ({"array_size": 16, "vector_lanes": 16},
     r"^link_bytes_per_cycle=4 makes ring words of max\(2 \* link_bytes_per_cycle, 8\) = 8 "
     r"bytes, not a multiple of the scratchpad word of array_size=16 bytes: the chip's ring "
     r"port cannot be built \(.*cfg\.toml\)$"),
])
def test_ring_port_rule_loads_but_is_reported(tmp_path, overrides, match):
    """The ring port's rule concerns programs of several chips: such a file loads (the planner
    plans it), and the rule is the chip's (Chip raises it) and the multi-chip compiler's."""
    npu = load_npu(write(tmp_path, NPU, **overrides))
    assert not npu.ring_port_buildable
    with pytest.raises(ConfigError, match=match):
        raise npu.ring_port_error()
    assert npu.chip_error().key == "link_bytes_per_cycle"
    assert load_npu(write(tmp_path, NPU)).ring_port_buildable


@pytest.mark.parametrize("overrides, match", [
    ({"vector_lanes": 2}, r"^vector_lanes=2 must equal array_size=4: the chip moves one "
                          r"scratchpad word per lane group \(.*cfg\.toml\)$"),
])
def test_chip_rules_load_but_are_reported(tmp_path, overrides, match):
    npu = load_npu(write(tmp_path, NPU, **overrides))
    assert npu.ring_port_buildable
    with pytest.raises(ConfigError, match=match):
        raise npu.chip_error()


def test_attention_lanes_need_not_be_whole_words(tmp_path):
    """The attention engine reads heads at any lane offset: d_head_max need not be whole
    words (a 6-lane datapath on 4-lane words is a chip)."""
    assert load_npu(write(tmp_path, NPU, d_head_max=6)).chip_error() is None


def test_planner_only_preset_loads_without_a_ring_port():
    lpu = npu_preset("lpu-like")
    assert not lpu.ring_port_buildable
    assert lpu.ring_port_error().key == "link_bytes_per_cycle"
    for name in ("tiny", "fpga", "ulx3s"):
        npu = npu_preset(name)
        assert npu.chip_error() is None and npu.ring_port_buildable, name


def test_presets_present():
    assert {p.stem for p in NPU_PRESETS} >= {"tiny", "fpga", "lpu-like", "ulx3s"}
    assert {p.stem for p in MODEL_PRESETS} >= {"tiny", "gpt2-small", "minilm-l6", "llama2-7b",
                                               "llama2-70b", "tiny-llama"}


def _round_trip(loader, path, tmp_path):
    config = loader(path)
    raw = tomllib.loads(path.read_text())
    for key, value in raw.items():
        got = getattr(config, key)
        assert got == value and type(got) is type(value), f"{path.name}: {key}={got!r} != {value!r}"
    # Write every field back (defaults resolved) and load again: the same config.
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
              if f.name != "path" and getattr(config, f.name) is not None}
    again = loader(write(tmp_path, fields, file=path.name))
    assert again == config
    return config


@pytest.mark.parametrize("path", NPU_PRESETS, ids=lambda p: p.stem)
def test_npu_preset_round_trip(path, tmp_path):
    npu = _round_trip(load_npu, path, tmp_path)
    assert npu == npu_preset(path.stem)
    assert npu.name == path.stem and npu.path == str(path)


@pytest.mark.parametrize("path", MODEL_PRESETS, ids=lambda p: p.stem)
def test_model_preset_round_trip(path, tmp_path):
    model = _round_trip(load_model, path, tmp_path)
    assert model == model_preset(path.stem)
    assert model.d_model == model.n_heads * model.d_head


def test_tiny_preset_values():
    npu = npu_preset("tiny")
    assert (npu.array_size, npu.softmax_len, npu.attn_window, npu.d_head_max, npu.d_model_max,
            npu.vector_lanes, npu.link_bytes_per_cycle, npu.link_latency_cycles) == \
        (4, 16, 16, 16, 64, 4, 4, 2)
    fpga = npu_preset("fpga")
    assert (fpga.array_size, fpga.softmax_len, fpga.attn_window, fpga.d_head_max,
            fpga.d_model_max) == (8, 64, 64, 64, 512)
    # The FPGA presets' vector unit has the deep pipeline (docs/fpga.md), the others the short.
    assert [npu_preset(name).vector_pipeline for name in ("tiny", "lpu-like", "fpga", "ulx3s")] \
        == ["short", "short", "deep", "deep"]
    # The ulx3s preset's attention engine has the deep pipeline (docs/fpga.md).
    assert [npu_preset(n).attention_pipeline for n in ("tiny", "lpu-like", "fpga", "ulx3s")] \
        == ["short", "short", "short", "deep"]


# --- derived values -----------------------------------------------------------------------------

def test_npu_defaults_and_derived(tmp_path):
    npu = load_npu(write(tmp_path, NPU, vector_lanes=DROP, sram_banks=DROP, imem_words=DROP,
                         link_bytes_per_cycle=DROP, link_latency_cycles=DROP,
                         link_bidirectional=DROP, clock_mhz=DROP, array_size=8,
                         sram_bytes=8 * 4 * 512))
    assert npu.vector_lanes == 8  # 0 / absent means one lane per array column
    assert npu.vector_pipeline == npu.attention_pipeline == "short"
    assert (npu.sram_banks, npu.imem_words, npu.link_bytes_per_cycle, npu.link_latency_cycles,
            npu.link_bidirectional, npu.clock_mhz) == (4, 1024, 4, 2, False, 100.0)
    assert npu.name == "cfg"  # the file stem when the file has no name
    assert npu.word_bytes == 8
    assert npu.sram_words == 2048
    assert npu.bank_words == 512
    assert npu.sram_addr_bits == 11
    assert npu.peak_macs_per_cycle == 64
    assert load_npu(write(tmp_path, NPU, vector_lanes=0)).vector_lanes == 4
    assert load_npu(write(tmp_path, NPU, vector_lanes=2)).vector_lanes == 2


def test_tiny_npu_derived():
    npu = npu_preset("tiny")
    assert (npu.word_bytes, npu.sram_words, npu.bank_words, npu.sram_addr_bits) == \
        (4, 16384, 4096, 14)
    assert npu.bank_words * npu.sram_banks * npu.word_bytes == npu.sram_bytes


def test_model_defaults_and_derived(tmp_path):
    # d_model 8, 2 heads, d_ff 16, 4 tokens: small enough to count by hand.
    model = load_model(write(tmp_path, {"n_layers": 1, "d_model": 8, "n_heads": 2, "d_ff": 16,
                                            "seq_len": 4}))
    assert model.d_head == 4
    assert (model.window, model.causal, model.norm, model.norm_kind, model.activation,
            model.ffn, model.bias, model.batch, model.quant, model.smooth_alpha) == \
        (0, True, "pre", "layernorm", "gelu", "mlp", True, 1, "int8", 0.7)
    # An integer alpha is stored as a float.
    assert load_model(write(tmp_path, MODEL, quant="smooth16", smooth_alpha=1)).smooth_alpha \
        == 1.0
    assert model.attn_span == 4
    # Q, K, V, O: 4 * 8*8 = 256; FFN up and down: 2 * 8*16 = 256.
    assert model.weights_per_layer == 512
    # Biases: Q, K, V, O 4*8, FFN up 16, FFN down 8.
    assert model.biases_per_layer == 56
    # Projections 4 tokens * 512 weights = 2048; scores Q.K^T 4*4*8 = 128 and P.V 4*4*8 = 128.
    assert model.macs_per_layer == 2304

    windowed = dataclasses.replace(model, window=2)
    assert windowed.attn_span == 2
    assert windowed.macs_per_layer == 2048 + 2 * (4 * 2 * 8)

    gated = dataclasses.replace(model, ffn="gated", bias=False)
    assert gated.weights_per_layer == 256 + 3 * 128
    assert gated.biases_per_layer == 0
    assert gated.macs_per_layer == 4 * (256 + 3 * 128) + 256
    assert dataclasses.replace(model, ffn="gated").biases_per_layer == 32 + 2 * 16 + 8
    # Grouped-query attention: one K/V head of 4 for the 2 query heads (K, V are 8 x 4).
    gqa = dataclasses.replace(model, n_kv_heads=1)
    assert (model.n_kv_heads, model.kv_group, model.rope) == (2, 1, False)
    assert (gqa.kv_group, gqa.d_kv) == (2, 4)
    assert gqa.weights_per_layer == 2 * 64 + 2 * 32 + 256
    assert gqa.biases_per_layer == 2 * 8 + 2 * 4 + 16 + 8
    assert gqa.macs_per_layer == 4 * (2 * 64 + 2 * 32 + 256) + 256


def test_published_shapes():
    gpt2 = model_preset("gpt2-small")
    # GPT-2 small: 12 blocks of 4*768^2 + 2*768*3072 weights = 7,077,888 each (85M in blocks).
    assert gpt2.weights_per_layer == 7_077_888
    assert gpt2.n_layers * gpt2.weights_per_layer == 84_934_656
    llama = model_preset("llama2-7b")
    assert llama.weights_per_layer == 4 * 4096**2 + 3 * 4096 * 11008
    assert llama.n_layers * llama.weights_per_layer == 6_476_005_376
    # Llama-2-70B: 64 query heads on 8 K/V heads of 128; with both 32000 x 8192 tables and
    # the 161 RMSNorm gains, the published 68,976,648,192 parameters.
    big = model_preset("llama2-70b")
    assert (big.kv_group, big.d_kv, big.rope) == (8, 1024, True)
    assert big.weights_per_layer == 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672
    assert big.n_layers * big.weights_per_layer + 2 * 32000 * 8192 + 161 * 8192 == \
        68_976_648_192
