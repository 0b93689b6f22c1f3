"""NPU hardware limits and transformer model shapes, loaded from TOML into frozen dataclasses.

Plain Python, no Amaranth: the gateware, the golden models, the compiler and the planner all read
the same objects (``docs/formats.md`` lists every key).

Every rejected file raises :class:`ConfigError` with one line that names the file, the key, the
offending value and the limit it breaks, e.g.::

    d_model=96 is not n_heads * d_head = 4 * 16 = 64 (constraints/models/tiny.toml)

The CLI turns it into exit status 2 without a traceback.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .attention import POS_BITS
from .collective import word_bytes as ring_word_bytes
from .timing.chip import ATTN_PIPELINES
from .timing.vector import PIPELINES as VECTOR_PIPELINES
from .topology import Topology
from .vector import LENGTH_BITS as VECTOR_LENGTH_BITS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["ConfigError", "NpuConfig", "ModelConfig", "load_npu", "load_model", "npu_preset",
           "model_preset", "PRESETS_DIR", "IMEM_WORDS_MAX", "QUANT_SCHEMES"]

#: Directory of the shipped presets (``constraints/`` at the repository root).
PRESETS_DIR = Path(__file__).resolve().parents[2] / "constraints"

#: Quantisation schemes of a model (``docs/formats.md``, Quantisation): ``int8`` per-tensor int8
#: activations; ``smooth16`` adds per-channel smoothing of the LayerNorm outputs that feed
#: matmuls and an int16 FFN hidden (GELU16, two int8 passes of FFN2); ``llm16`` is smooth16 for
#: pre-norm decoders with massive activations: a residual scale per block (a REQUANT of the
#: residual where it changes), smoothing folded into the norms' gamma, and a gated FFN's hidden
#: int16 too (the exact int8 x int8 product); ``llm16c`` is llm16 with a residual scale per
#: channel (per block; RMSNorm from the statistics of a one-scale copy) and a gated FFN's gate
#: and up int16, their product int16 from their byte digits.
QUANT_SCHEMES = ("int8", "smooth16", "llm16", "llm16c")

#: Deepest instruction memory accepted: 1 Mi instructions. Programs are static and unrolled, but
#: even the Groq-scale preset needs only 64 Ki; a larger value is a typo, not a design.
IMEM_WORDS_MAX = 1 << 20


class ConfigError(ValueError):
    """A configuration file or value breaks a constraint.

    ``str(error)`` is a single line: ``<key>=<value> <problem> (<file>)``.
    """

    def __init__(self, message: str, *, path: str | Path | None = None, key: str | None = None,
                 value: Any = None):
        self.path = None if path is None else str(path)
        self.key = key
        self.value = value
        self.problem = message
        if key is not None:
            message = f"{key}={value!r} {message}"
        if path is not None:
            message = f"{message} ({path})"
        super().__init__(message)


_REQUIRED = object()


@dataclass(frozen=True)
class _Key:
    type: type | tuple[type, ...]
    default: Any = _REQUIRED
    choices: tuple | None = None
    minimum: int | None = None
    maximum: int | None = None
    doc: str = ""

    @property
    def required(self):
        return self.default is _REQUIRED


def _check_value(key: str, spec: _Key, value: Any, path):
    # bool is a subclass of int: a `true` where a count is expected is a type error, not 1.
    types = spec.type if isinstance(spec.type, tuple) else (spec.type,)
    if isinstance(value, bool) and bool not in types:
        ok = False
    elif float in types and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    else:
        ok = isinstance(value, types)
    if not ok:
        names = " or ".join(t.__name__ for t in types)
        raise ConfigError(f"has type {type(value).__name__}, expected {names}",
                          path=path, key=key, value=value)
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"is not one of {', '.join(map(repr, spec.choices))}",
                          path=path, key=key, value=value)
    if spec.minimum is not None and value < spec.minimum:
        raise ConfigError(f"is below the minimum {spec.minimum}", path=path, key=key, value=value)
    if spec.maximum is not None and value > spec.maximum:
        raise ConfigError(f"is above the maximum {spec.maximum}", path=path, key=key, value=value)


def _read_toml(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("file not found", path=path) from None
    except IsADirectoryError:
        raise ConfigError("is a directory, expected a TOML file", path=path) from None
    except OSError as exc:
        raise ConfigError(f"cannot be read: {exc.strerror}", path=path) from None
    try:
        return tomllib.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError("is not UTF-8 text", path=path) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"bad TOML: {exc}", path=path) from None


def _parse(schema: dict[str, _Key], data: dict, path) -> dict:
    unknown = sorted(set(data) - set(schema))
    if unknown:
        raise ConfigError(f"unknown key; known keys are {', '.join(schema)}",
                          path=path, key=unknown[0], value=data[unknown[0]])
    values = {}
    for key, spec in schema.items():
        if key not in data:
            if spec.required:
                error = ConfigError(f"missing required key {key!r} ({spec.doc})", path=path)
                error.key = key
                raise error
            values[key] = spec.default
            continue
        _check_value(key, spec, data[key], path)
        values[key] = data[key]
    return values


_NPU_SCHEMA = {
    "name": _Key(str, "", doc="preset name"),
    "description": _Key(str, "", doc="free text"),
    "array_size": _Key(int, minimum=2, doc="N of the N x N int8 systolic matmul array"),
    "sram_bytes": _Key(int, minimum=1, doc="scratchpad capacity in bytes"),
    "sram_banks": _Key(int, 4, minimum=1, doc="scratchpad banks"),
    "imem_words": _Key(int, 1024, minimum=16, maximum=IMEM_WORDS_MAX,
                       doc="instruction memory depth in instructions"),
    "vector_lanes": _Key(int, 0, minimum=0,
                         doc="vector unit lanes (0 = array_size)"),
    "vector_pipeline": _Key(str, "short", choices=VECTOR_PIPELINES,
                            doc="vector unit pipeline: short (4 stages, a product and its "
                                "rounding per cycle) or deep (13 stages, a register after "
                                "every product, shift and rounding)"),
    "attention_pipeline": _Key(str, "short", choices=ATTN_PIPELINES,
                               doc="attention engine pipeline: short (the output requantiser "
                                   "in the cycle a word leaves the row) or deep (3 registers "
                                   "before the output, 2 more in the last chunk's merge)"),
    "max_seq_len": _Key(int, minimum=1, doc="longest sequence one pass can process"),
    "attn_window": _Key(int, minimum=1, doc="tokens held in the K/V ring buffer"),
    "softmax_len": _Key(int, minimum=2, doc="lanes of the softmax unit (score row length)"),
    "d_head_max": _Key(int, minimum=1, doc="widest head the attention datapath takes"),
    "d_model_max": _Key(int, minimum=1, doc="widest d_model the vector unit takes"),
    "link_bytes_per_cycle": _Key(int, 4, minimum=1, doc="ring link width"),
    "link_latency_cycles": _Key(int, 2, minimum=1, doc="ring link pipeline depth"),
    "link_bidirectional": _Key(bool, False, doc="adds the reverse ring"),
    "clock_mhz": _Key(float, 100.0, doc="clock used to turn cycles into seconds"),
}


@dataclass(frozen=True)
class NpuConfig:
    """Hardware limits of one NPU chip (``constraints/npu/*.toml``).

    All sizes are in bytes, elements or cycles. Derived properties give the quantities the
    gateware is sized by (scratchpad word and bank depth).
    """

    array_size: int
    sram_bytes: int
    max_seq_len: int
    attn_window: int
    softmax_len: int
    d_head_max: int
    d_model_max: int
    sram_banks: int = 4
    imem_words: int = 1024
    vector_lanes: int = 0
    vector_pipeline: str = "short"
    attention_pipeline: str = "short"
    link_bytes_per_cycle: int = 4
    link_latency_cycles: int = 2
    link_bidirectional: bool = False
    clock_mhz: float = 100.0
    name: str = ""
    description: str = ""
    #: How a system of these chips is connected (the TOML's optional ``[topology]``,
    #: :class:`hw.spec.topology.Topology`); None: a ring of however many chips run.
    topology: Topology | None = None
    path: str | None = field(default=None, compare=False)

    def __post_init__(self):
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("path", "topology")}
        if self.topology is not None and not isinstance(self.topology, Topology):
            raise ConfigError("must be a hw.spec.topology.Topology or None", path=self.path,
                              key="topology", value=self.topology)
        for key, spec in _NPU_SCHEMA.items():
            _check_value(key, spec, values[key], self.path)
        if self.vector_lanes == 0:
            object.__setattr__(self, "vector_lanes", self.array_size)
        # TOML `clock_mhz = 100` is an int; store a float so equal configs compare and print alike.
        object.__setattr__(self, "clock_mhz", float(self.clock_mhz))
        self._validate()

    def _error(self, key, problem):
        return ConfigError(problem, path=self.path, key=key, value=getattr(self, key))

    def _validate(self):
        if self.sram_bytes % (self.sram_banks * self.array_size):
            raise self._error(
                "sram_bytes", f"is not a multiple of sram_banks * array_size = "
                f"{self.sram_banks} * {self.array_size} = {self.sram_banks * self.array_size} "
                f"(one bank word is one array row of {self.array_size} bytes)")
        bank_words = self.sram_bytes // self.array_size // self.sram_banks
        if bank_words & (bank_words - 1):
            raise self._error(
                "sram_bytes", f"makes banks of sram_bytes / array_size / sram_banks = "
                f"{self.sram_bytes} / {self.array_size} / {self.sram_banks} = {bank_words} "
                "words, not a power of two (a word's bank is its address bits above the bank's)")
        link = self.link_bytes_per_cycle
        if link & (link - 1):
            raise self._error("link_bytes_per_cycle",
                              "is not a power of two: a ring word is whole link flits")
        if self.attn_window > 1 << POS_BITS:
            raise self._error("attn_window", f"exceeds the attention buffer's {POS_BITS}-bit "
                              f"positions ({1 << POS_BITS} keys)")
        if self.d_model_max >= 1 << VECTOR_LENGTH_BITS:
            raise self._error("d_model_max", f"exceeds the vector unit's {VECTOR_LENGTH_BITS}-bit "
                              f"row length ({(1 << VECTOR_LENGTH_BITS) - 1})")
        if self.attn_window > self.max_seq_len:
            raise self._error("attn_window", f"exceeds max_seq_len {self.max_seq_len}")
        if self.softmax_len < self.attn_window:
            raise self._error(
                "softmax_len", f"is shorter than attn_window {self.attn_window}: a windowed "
                "score row would not fit the softmax unit")
        if self.d_head_max > self.d_model_max:
            raise self._error("d_head_max", f"exceeds d_model_max {self.d_model_max}")
        if self.array_size > self.d_model_max:
            raise self._error(
                "array_size", f"exceeds d_model_max {self.d_model_max}: no model this chip "
                "accepts could fill one row of the array")
        if self.vector_lanes > self.d_model_max:
            raise self._error(
                "vector_lanes", f"exceeds d_model_max {self.d_model_max}: no model this chip "
                "accepts could fill the vector unit")
        # `not x > 0` also catches nan (TOML accepts `nan` and `inf` for floats).
        if not self.clock_mhz > 0 or not math.isfinite(self.clock_mhz):
            raise self._error("clock_mhz", "must be positive and finite")

    @property
    def word_bytes(self) -> int:
        """Bytes in one scratchpad word: one row of the array."""
        return self.array_size

    @property
    def sram_words(self) -> int:
        return self.sram_bytes // self.word_bytes

    @property
    def bank_words(self) -> int:
        """Depth of each scratchpad bank in words."""
        return self.sram_words // self.sram_banks

    @property
    def sram_addr_bits(self) -> int:
        """Bits of a scratchpad word address (what the address generators wrap modulo)."""
        return max(1, (self.sram_words - 1).bit_length())

    @property
    def imem_addr_bits(self) -> int:
        """Bits of an instruction-memory address."""
        return max(1, (self.imem_words - 1).bit_length())

    @property
    def peak_macs_per_cycle(self) -> int:
        return self.array_size ** 2

    # --- what the chip's gateware needs beyond a valid file -------------------------------
    # A file that breaks these still loads: the planner plans chips that are not built (the
    # lpu-like preset), and one chip runs without a ring port in the models.

    @property
    def ring_word_bytes(self) -> int:
        """Bytes of a word on the ring (the collective engine's: ``max(2 * link, 8)``, rounded
        up to whole scratchpad words, :func:`hw.spec.collective.word_bytes`)."""
        return ring_word_bytes(self.link_bytes_per_cycle, self.array_size)

    def ring_port_error(self) -> ConfigError | None:
        """Why the chip's ring port (COLL, SEND, RECV; ``hw/chip.py``) cannot be built,
        or None: its words must be whole scratchpad words of ``array_size`` bytes."""
        plain = ring_word_bytes(self.link_bytes_per_cycle)
        if plain % self.word_bytes:
            return self._error(
                "link_bytes_per_cycle",
                f"makes ring words of max(2 * link_bytes_per_cycle, 8) = {plain} "
                f"bytes, not a multiple of the scratchpad word of array_size={self.array_size} "
                "bytes: the chip's ring port cannot be built")
        return None

    @property
    def ring_port_buildable(self) -> bool:
        """:meth:`ring_port_error` is None: the gateware's ring port can be built (the
        compiler, the ISS and the timing models take programs of several chips on any NPU)."""
        return self.ring_port_error() is None

    def lanes_error(self) -> ConfigError | None:
        """Why the chip's word-wide vector path cannot be built, or None."""
        if self.vector_lanes != self.array_size:
            return self._error("vector_lanes", f"must equal array_size={self.array_size}: the "
                               "chip moves one scratchpad word per lane group")
        return None

    def chip_error(self) -> ConfigError | None:
        """Why :class:`hw.chip.Chip` cannot be built from this NPU, or None: the vector
        path (:meth:`lanes_error`), the ring port (:meth:`ring_port_error`)."""
        if (error := self.lanes_error()) is not None:
            return error
        return self.ring_port_error()


_MODEL_SCHEMA = {
    "name": _Key(str, "", doc="preset name"),
    "description": _Key(str, "", doc="free text"),
    "source": _Key(str, "", doc="where the published shape comes from"),
    "n_layers": _Key(int, minimum=1, doc="transformer blocks"),
    "d_model": _Key(int, minimum=1, doc="hidden size"),
    "n_heads": _Key(int, minimum=1, doc="attention heads"),
    "n_kv_heads": _Key(int, 0, minimum=0, doc="K/V heads shared by groups of query heads "
                       "(grouped-query attention; 0 = n_heads)"),
    "rope_theta": _Key(float, 0.0, minimum=0, doc="rotary position embedding base (HF "
                       "half-rotation layout; 0 = no RoPE)"),
    "d_head": _Key(int, 0, minimum=0, doc="head width (0 = d_model // n_heads)"),
    "d_ff": _Key(int, minimum=1, doc="feed-forward inner size"),
    "seq_len": _Key(int, minimum=1, doc="tokens per sequence"),
    "window": _Key(int, 0, minimum=0, doc="local attention window (0 = full attention)"),
    "causal": _Key(bool, True, doc="decoder (causal) or encoder (bidirectional) attention"),
    "norm": _Key(str, "pre", choices=("pre", "post"), doc="LayerNorm placement"),
    "norm_kind": _Key(str, "layernorm", choices=("layernorm", "rmsnorm"), doc="normalisation"),
    "activation": _Key(str, "gelu", choices=("gelu", "relu", "silu"), doc="FFN activation"),
    "ffn": _Key(str, "mlp", choices=("mlp", "gated"), doc="FFN kind"),
    "bias": _Key(bool, True, doc="projections and FFN carry biases"),
    "batch": _Key(int, 1, minimum=1, doc="sequences per run"),
    "vocab_size": _Key(int, 0, minimum=0, doc="embedding rows (planner only)"),
    "tie_embeddings": _Key(bool, False, doc="LM head shares the embedding matrix (planner only)"),
    "quant": _Key(str, "int8", choices=QUANT_SCHEMES,
                  doc="quantisation scheme (int8; smooth16: smoothed LayerNorm outputs and "
                      "an int16 FFN hidden; llm16: smooth16 with a residual scale per block "
                      "and gated FFNs, pre-norm; llm16c: llm16 with a residual scale per "
                      "channel and an int16 x int16 gated product)"),
    "smooth_alpha": _Key(float, 0.7, doc="smooth16's and the llm schemes' migration strength "
                                         "alpha, 0..1"),
}


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a transformer (``constraints/models/*.toml``)."""

    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    seq_len: int
    d_head: int = 0
    n_kv_heads: int = 0
    rope_theta: float = 0.0
    window: int = 0
    causal: bool = True
    norm: str = "pre"
    norm_kind: str = "layernorm"
    activation: str = "gelu"
    ffn: str = "mlp"
    bias: bool = True
    batch: int = 1
    vocab_size: int = 0
    tie_embeddings: bool = False
    quant: str = "int8"
    smooth_alpha: float = 0.7
    name: str = ""
    description: str = ""
    source: str = ""
    path: str | None = field(default=None, compare=False)

    def __post_init__(self):
        for key, spec in _MODEL_SCHEMA.items():
            _check_value(key, spec, getattr(self, key), self.path)
        if self.d_head == 0:
            if self.d_model % self.n_heads:
                raise ConfigError(
                    f"is not a multiple of n_heads {self.n_heads}; set d_head explicitly",
                    path=self.path, key="d_model", value=self.d_model)
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.d_model != self.n_heads * self.d_head:
            raise ConfigError(
                f"is not n_heads * d_head = {self.n_heads} * {self.d_head} = "
                f"{self.n_heads * self.d_head}", path=self.path, key="d_model",
                value=self.d_model)
        if self.n_kv_heads == 0:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.n_kv_heads > self.n_heads or self.n_heads % self.n_kv_heads:
            raise ConfigError(f"must divide n_heads {self.n_heads}", path=self.path,
                              key="n_kv_heads", value=self.n_kv_heads)
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        if self.rope_theta and (self.rope_theta <= 1.0 or self.d_head % 2):
            raise ConfigError(f"needs a base above 1 and an even d_head (d_head={self.d_head})",
                              path=self.path, key="rope_theta", value=self.rope_theta)
        if self.window > self.seq_len:
            raise ConfigError(f"exceeds seq_len {self.seq_len} (use 0 for full attention)",
                              path=self.path, key="window", value=self.window)
        # TOML `smooth_alpha = 1` is an int; store a float so equal configs compare alike.
        object.__setattr__(self, "smooth_alpha", float(self.smooth_alpha))
        if not 0.0 <= self.smooth_alpha <= 1.0:
            raise ConfigError("is outside [0, 1]", path=self.path, key="smooth_alpha",
                              value=self.smooth_alpha)

    @property
    def rmsnorm(self) -> bool:
        """Whether the blocks normalise by RMSNorm (``norm_kind = "rmsnorm"``: no mean, no
        beta) rather than LayerNorm."""
        return self.norm_kind == "rmsnorm"

    @property
    def kv_group(self) -> int:
        """Query heads per K/V head (1 without grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    @property
    def d_kv(self) -> int:
        """Width of K and of V: ``n_kv_heads * d_head``."""
        return self.n_kv_heads * self.d_head

    @property
    def rope(self) -> bool:
        """Whether Q and K are rotated by position (RoPE, ``rope_theta`` > 0)."""
        return self.rope_theta > 0

    @property
    def attn_span(self) -> int:
        """Keys one query can see: the window, or the whole sequence for full attention."""
        return self.window if self.window else self.seq_len

    @property
    def weights_per_layer(self) -> int:
        """int8 weight elements in one block (attention projections and FFN)."""
        ffn_mats = 3 if self.ffn == "gated" else 2
        d = self.d_model
        return 2 * d * d + 2 * d * self.d_kv + ffn_mats * d * self.d_ff

    @property
    def biases_per_layer(self) -> int:
        """int32 bias elements in one block (0 without biases)."""
        if not self.bias:
            return 0
        ffn_bias = self.d_ff * (2 if self.ffn == "gated" else 1)
        return 2 * self.d_model + 2 * self.d_kv + ffn_bias + self.d_model

    @property
    def macs_per_layer(self) -> int:
        """Multiply-accumulates of one block for one sequence (projections, scores, FFN)."""
        s, d = self.seq_len, self.d_model
        ffn_mats = 3 if self.ffn == "gated" else 2
        proj = 2 * s * d * (d + self.d_kv) + ffn_mats * s * d * self.d_ff
        span = self.attn_span
        attn = 2 * s * span * d
        return proj + attn


def _load(cls, schema, path, overrides=None):
    data = _read_toml(path)
    if overrides:
        data = {**data, **overrides}
    extra = {}
    if cls is NpuConfig and "topology" in data:
        data = dict(data)
        table = data.pop("topology")
        try:
            extra["topology"] = Topology.from_table(table)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"is not a topology: {exc}", path=path, key="topology",
                              value=table) from None
    values = _parse(schema, data, path)
    values.update(extra)
    if not values["name"]:
        values["name"] = Path(path).stem
    return cls(**values, path=str(path))


def load_npu(path: str | Path, overrides: dict[str, Any] | None = None) -> NpuConfig:
    """Load and validate an NPU limits file; raise :class:`ConfigError` on any problem.

    ``overrides`` replace (or add) keys of the file before validation, so an override goes
    through exactly the checks of a value in the file (its error names the key and the file
    it was applied to; ``error.key`` tells whether the override or another key broke a limit).
    """
    return _load(NpuConfig, _NPU_SCHEMA, path, overrides)


def load_model(path: str | Path) -> ModelConfig:
    """Load and validate a model shape file; raise :class:`ConfigError` on any problem."""
    return _load(ModelConfig, _MODEL_SCHEMA, path)


def npu_preset(name: str) -> NpuConfig:
    """Load ``constraints/npu/<name>.toml``."""
    return load_npu(PRESETS_DIR / "npu" / f"{name}.toml")


def model_preset(name: str) -> ModelConfig:
    """Load ``constraints/models/<name>.toml``."""
    return load_model(PRESETS_DIR / "models" / f"{name}.toml")
