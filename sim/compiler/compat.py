"""What one chip's datapath accepts of a model: the compatibility check every strategy makes
for what each chip runs (the capacity check is the allocator's)."""

from __future__ import annotations

from hw.spec import ConfigError, ModelConfig, NpuConfig

from .attention_launch import plan_schedule

#: smooth16's FFN2 lo pass sums d_ff products of 255 x (-128..127) in int32: at most this d_ff.
SMOOTH16_D_FF_MAX = (1 << 16) - 1

__all__ = ["check_single_chip", "check_ring_port", "SMOOTH16_D_FF_MAX"]


def check_single_chip(npu: NpuConfig, cfg: ModelConfig):
    """Compatibility of a model with one chip's datapath; :class:`ConfigError` otherwise."""
    def refuse(key, value, problem, path):
        raise ConfigError(problem, path=path, key=key, value=value)

    for key, bad, what in (("norm_kind", "rmsnorm", "the vector unit has LayerNorm only"),
                           ("ffn", "gated", "the compiler maps two-matrix MLP FFNs only"),
                           ("activation", "silu", "the activation LUT is built for GELU/ReLU")):
        if getattr(cfg, key) == bad:
            refuse(key, bad, f"is not supported by the simulator: {what}", cfg.path)
    if cfg.d_head > npu.d_head_max:
        refuse("d_head", cfg.d_head, f"exceeds datapath width d_head_max={npu.d_head_max}",
               npu.path)
    if cfg.d_model > npu.d_model_max:
        refuse("d_model", cfg.d_model, f"exceeds d_model_max={npu.d_model_max}", npu.path)
    if cfg.seq_len > npu.max_seq_len:
        refuse("seq_len", cfg.seq_len, f"exceeds max_seq_len={npu.max_seq_len}", npu.path)
    try:
        plan_schedule(seq=cfg.seq_len, window=cfg.window, causal=cfg.causal,
                      ring=npu.attn_window)
    except ValueError as exc:
        key, value = ("window", cfg.window) if cfg.window else ("seq_len", cfg.seq_len)
        refuse(key, value, f"does not fit attn_window={npu.attn_window}: {exc}", npu.path)
    if cfg.quant == "smooth16" and cfg.d_ff > SMOOTH16_D_FF_MAX:
        refuse("d_ff", cfg.d_ff, f"exceeds {SMOOTH16_D_FF_MAX} for quant=\"smooth16\": the FFN2 "
               "lo pass's int32 sum of d_ff products of 255 x 128 would overflow", cfg.path)
    if (error := npu.lanes_error()) is not None:
        raise error


def check_ring_port(npu: NpuConfig, chips: int):
    """A program of ``chips`` chips needs the chip's ring port (COLL, SEND, RECV):
    :meth:`~hw.spec.NpuConfig.ring_port_error` as a :class:`ConfigError` when ``chips > 1``."""
    if chips > 1 and (error := npu.ring_port_error()) is not None:
        raise error
