"""What gateware, golden models and compiler share: configs, number formats, encodings.

Plain Python, free of Amaranth (``docs/architecture.md``, layers).
"""

from .config import (
    PRESETS_DIR,
    QUANT_SCHEMES,
    ConfigError,
    ModelConfig,
    NpuConfig,
    load_model,
    load_npu,
    model_preset,
    npu_preset,
)

__all__ = ["PRESETS_DIR", "QUANT_SCHEMES", "ConfigError", "ModelConfig", "NpuConfig",
           "load_model", "load_npu", "model_preset", "npu_preset"]
