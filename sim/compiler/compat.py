"""What one chip's datapath accepts of a model: the compatibility check every strategy makes
for what each chip runs (the capacity check is the allocator's).

Checks report through :class:`Limits`: by default the first constraint broken is raised (a
compile stops there), and with ``Limits(collect=True)`` every one is collected as a
:class:`Limit` (the planner's reasons), from the same code."""

from __future__ import annotations

from hw.spec import ConfigError, ModelConfig, NpuConfig
from hw.spec.attention import STATE_LANE_BYTES
from hw.spec.topology import MAX_CHIPS

from .attention_launch import plan_schedule

#: smooth16's FFN2 lo pass sums d_ff products of 255 x (-128..127) in int32: at most this d_ff.
SMOOTH16_D_FF_MAX = (1 << 16) - 1

__all__ = ["Limit", "Limits", "check_single_chip", "check_ring_size", "check_ring_port",
           "SMOOTH16_D_FF_MAX"]


class Limit(ConfigError):
    """A constraint a model breaks: a :class:`ConfigError` that also names the ``limit`` it
    breaks (None where the constraint is not one number)."""

    def __init__(self, problem: str, *, path=None, key: str | None = None, value=None,
                 limit=None):
        super().__init__(problem, path=path, key=key, value=value)
        self.limit = limit


class Limits:
    """Where a check reports what it refuses: raised at the first (``collect=False``, a
    compile), or every one kept in :attr:`found` (``collect=True``, a plan)."""

    def __init__(self, collect: bool = False):
        self.collect = collect
        self.found: list[Limit] = []

    def refuse(self, problem: str, *, path=None, key: str | None = None, value=None,
               limit=None):
        self.add(Limit(problem, path=path, key=key, value=value, limit=limit))

    def add(self, error: ValueError):
        """Report ``error`` (raised by a check that stops at its first refusal)."""
        if not self.collect:
            raise error
        if not isinstance(error, Limit):
            error = Limit(error.problem, path=error.path, key=error.key, value=error.value) \
                if isinstance(error, ConfigError) else Limit(str(error))
        self.found.append(error)

    def run(self, check, *args, **kw):
        """``check(*args, **kw)``, its refusal (ConfigError, ValueError) reported; its result,
        or None when it refused."""
        try:
            return check(*args, **kw)
        except ValueError as error:
            self.add(error)
            return None


def check_single_chip(npu: NpuConfig, cfg: ModelConfig, limits: Limits | None = None, *,
                      passes: bool = False):
    """Compatibility of a model with one chip's datapath: :class:`ConfigError` otherwise (or
    each refusal reported to ``limits``); ``passes``: the caller runs full attention over
    more keys than the ring holds in passes over key chunks (``plan_schedule``)."""
    limits = Limits() if limits is None else limits
    if cfg.quant == "smooth16" and cfg.ffn == "gated":
        # smooth16's FFN hidden is int16, and MUL multiplies int8 operands.
        limits.refuse("is not supported with quant=\"smooth16\" (an int16 FFN hidden): the "
                      "vector unit's MUL multiplies int8 operands; use quant=\"llm16\" (the "
                      "exact int16 product of the int8 gate and up), \"llm16c\" (int16 gate "
                      "and up) or \"int8\"",
                      path=cfg.path, key="ffn", value=cfg.ffn)
    if cfg.quant in ("llm16", "llm16c") and cfg.norm != "pre":
        limits.refuse(f"is not supported with quant=\"{cfg.quant}\" (a residual scale per "
                      "block, smoothing folded into pre-norm gammas): use smooth16",
                      path=cfg.path,
                      key="norm", value=cfg.norm)
    if cfg.d_head > npu.d_head_max:
        limits.refuse(f"exceeds datapath width d_head_max={npu.d_head_max}", path=npu.path,
                      key="d_head", value=cfg.d_head, limit=npu.d_head_max)
    if cfg.d_model > npu.d_model_max:
        limits.refuse(f"exceeds d_model_max={npu.d_model_max}", path=npu.path, key="d_model",
                      value=cfg.d_model, limit=npu.d_model_max)
    if cfg.seq_len > npu.max_seq_len:
        limits.refuse(f"exceeds max_seq_len={npu.max_seq_len}", path=npu.path, key="seq_len",
                      value=cfg.seq_len, limit=npu.max_seq_len)
    try:
        sched = plan_schedule(seq=cfg.seq_len, window=cfg.window, causal=cfg.causal,
                              ring=npu.attn_window, passes=passes)
        if sched.chunk and npu.array_size % STATE_LANE_BYTES:
            limits.refuse(f"is not a multiple of {STATE_LANE_BYTES}: full attention over "
                          f"{cfg.seq_len} tokens, beyond attn_window={npu.attn_window}, merges "
                          "partial softmaxes through state rows of int32 lanes in whole words",
                          path=npu.path, key="array_size", value=npu.array_size)
    except ValueError as exc:
        key, value = ("window", cfg.window) if cfg.window else ("seq_len", cfg.seq_len)
        limits.refuse(f"does not fit attn_window={npu.attn_window}: {exc}", path=npu.path,
                      key=key, value=value, limit=npu.attn_window)
    if cfg.quant in ("smooth16", "llm16", "llm16c") and cfg.d_ff > SMOOTH16_D_FF_MAX:
        limits.refuse(f"exceeds {SMOOTH16_D_FF_MAX} for quant=\"{cfg.quant}\": the FFN2 lo "
                      "pass's "
                      "int32 sum of d_ff products of 255 x 128 would overflow", path=cfg.path,
                      key="d_ff", value=cfg.d_ff, limit=SMOOTH16_D_FF_MAX)
    if (error := npu.lanes_error()) is not None:
        limits.add(error)


def check_ring_size(chips: int, limits: Limits | None = None):
    """``chips`` in one system (a ring or a torus): at most
    :data:`~hw.spec.topology.MAX_CHIPS` (its chip ids)."""
    if chips > MAX_CHIPS:
        (Limits() if limits is None else limits).refuse(
            f"exceeds the {MAX_CHIPS} chips a system holds (hw.spec.topology.MAX_CHIPS)",
            key="chips", value=chips, limit=MAX_CHIPS)


def check_ring_port(npu: NpuConfig, chips: int):
    """A program of ``chips`` chips needs the chip's ring port (COLL, SEND, RECV):
    :meth:`~hw.spec.NpuConfig.ring_port_error` as a :class:`ConfigError` when ``chips > 1``."""
    if chips > 1 and (error := npu.ring_port_error()) is not None:
        raise error
