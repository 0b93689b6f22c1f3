"""``pipeline``: layers in stages (uneven allowed), the batch in microbatches through them
(GPipe); each stage sends its residual to the next (``sim.compiler.grid``)."""

from __future__ import annotations

from hw.spec.memory import row_words

from ..compiler.blocks import pad_to
from ..compiler.program import SystemProgram
from ..report.timeline import COMPUTE_UNITS
from .base import register
from .grid import GridStrategy
from .roles import stage_roles

__all__ = ["PIPELINE", "pipeline_stats"]


def _stage_spans(chip, span) -> list[tuple[int, int]]:
    """Each microbatch's ``[start, end)`` on a stage: its first compute launch to its last."""
    taken = dict.fromkeys(COMPUTE_UNITS, 0)
    out = []
    for counts in chip.spans["microbatch_launches"]:
        ivs = []
        for unit in COMPUTE_UNITS:
            ivs += span[unit][taken[unit]:taken[unit] + counts[unit]]
            taken[unit] += counts[unit]
        out.append((min(s for s, _ in ivs), max(e for _, e in ivs)))
    return out


def pipeline_stats(prog: SystemProgram, res, spans) -> dict:
    """The pipeline's shape and its bubble: the share of the chips' time in which they were
    not working on a microbatch, ``1 - sum(spans) / (chips * cycles)``, each microbatch's span
    on a chip running from its first compute launch for it to the end of the last."""
    stages, m = prog.meta["stages"], prog.meta["microbatches"]
    info = {"stages": stages, "layers_per_stage": prog.meta["layers_per_stage"],
            "microbatches": m, "microbatch_samples": prog.meta["microbatch_samples"],
            "bubble_formula": (stages - 1) / (m + stages - 1), "bubble_fraction": None}
    if spans is not None:
        per_stage = [_stage_spans(chip, span) for chip, span in zip(prog.chips, spans,
                                                                    strict=True)]
        work = sum(e - s for stage in per_stage for s, e in stage)
        info["bubble_fraction"] = 1 - work / (len(prog.chips) * res["cycles"])
        info["stage_cycles"] = [[e - s for s, e in stage] for stage in per_stage]
    return info


class Pipeline(GridStrategy, name="pipeline",
               splits="layers in stages (uneven allowed), the batch in microbatches",
               relieves="weight capacity", parts=("pipeline",),
               options=frozenset({"microbatches"})):
    def part_sections(self, prog, comms, res, spans) -> dict:
        return {"pipeline": pipeline_stats(prog, res, spans)}

    def part_comm(self, npu, cfg, split, samples):
        stages, n = split.stages, npu.array_size
        if stages <= 1:
            return 0, 0, []
        per = pad_to(cfg.seq_len, n) * row_words(pad_to(cfg.d_model, n), 2, n) * n
        run = (stages - 1) * samples * per
        return run // cfg.n_layers, 0, [
            f"pipeline: {run:,} bytes of activations sent between stages per run "
            "(point-to-point, per layer: the share shown)"]

    def roles(self, npu, cfg, chips, grid, picks):
        return stage_roles(cfg, chips, 1, picks)

    def search_limit(self, cfg, npu) -> int:
        return cfg.n_layers                   # a layer per stage


PIPELINE = register(Pipeline())
