"""Compile a model for N chips with one of the strategies: the compilers by name."""

from __future__ import annotations

from hw.spec import NpuConfig

from .head import compile_head
from .hidden import compile_hidden
from .pipeline import compile_pipeline
from .program import SystemProgram
from .quantize import QModel
from .single import compile_single

__all__ = ["BUILT", "compile_program"]

#: Strategies with a compiler (the others are refused as not built yet).
BUILT = ("single", "head", "pipeline", "hidden")


def compile_program(strategy: str, npu: NpuConfig, qm: QModel, chips: int, *, seq: int,
                    samples: int, microbatches: int | None = None,
                    reduce: str | None = None) -> SystemProgram:
    """Programs for ``chips`` chips; ``ValueError`` for a strategy/option that does not apply
    (``ConfigError`` for a model or chip that cannot run it). ``reduce``: hidden only
    (``sim.compiler.hidden.REDUCE_MODES``)."""
    if strategy not in BUILT:
        raise ValueError(f"--strategy {strategy} is not built yet (built: {', '.join(BUILT)})")
    if microbatches is not None and strategy != "pipeline":
        raise ValueError("--microbatches applies to --strategy pipeline")
    if reduce is not None and strategy != "hidden":
        raise ValueError("reduce applies to --strategy hidden")
    if strategy == "single":
        if chips != 1:
            raise ValueError(f"--strategy single runs on one chip, not --chips {chips}")
        return compile_single(npu, qm, seq=seq, samples=samples)
    if strategy == "head":
        return compile_head(npu, qm, chips, seq=seq, samples=samples)
    if strategy == "hidden":
        return compile_hidden(npu, qm, chips, seq=seq, samples=samples,
                              reduce=reduce or "reduce_scatter")
    return compile_pipeline(npu, qm, chips, seq=seq, samples=samples,
                            microbatches=microbatches)
