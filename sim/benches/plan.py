"""The planner's model of record: predicted cycles against the RTL (Amaranth's simulator).

For every built strategy (single, head, pipeline) at 1-4 chips, on the tiny presets and on
shapes the timing model was never fitted to (a post-norm bidirectional model with an odd head
count, a causal-window model that interleaves its attention), each row gives the planner's
predicted cycles (``sim.planner.plan.plan``: for programs this small the cycle model, which follows
the
RTL's handshakes), with the launch-level model's (``sim.timing.launch``, the planner's engine for
large programs) in the note, against ``npu sim --backend pysim`` on the same model and batch.
Pipelines run one microbatch per stage. Target: within 2% (goal: exact). Quick mode runs one
small shape on 1 and 2 chips; the full table takes about half an hour of pysim.
"""

from __future__ import annotations

import dataclasses

from hw.spec import ModelConfig, model_preset, npu_preset

from ..flows.simulate import simulate
from ..planner.plan import plan
from ..strategies import get

#: Shapes the cycle model was not fitted to (it has no fitted constants; these are new).
UNSEEN = (
    ModelConfig(n_layers=3, d_model=24, n_heads=3, d_head=8, d_ff=40, seq_len=6, norm="post",
                causal=False, name="post-3x8"),
    ModelConfig(n_layers=2, d_model=16, n_heads=2, d_head=8, d_ff=48, seq_len=12, window=4,
                name="window-4"),
)

FULL = [(model_preset("tiny"), s, c) for s, c in (("single", 1), ("head", 2), ("head", 4),
                                                   ("pipeline", 2), ("pipeline", 4))]
FULL += [(m, s, c) for m in UNSEEN for s, c in (("single", 1), ("head", 2), ("head", 3),
                                                ("pipeline", 2), ("pipeline", 3))
         if not (s == "head" and c > m.n_heads) and not (s == "pipeline" and c > m.n_layers)]
QUICK = [(dataclasses.replace(UNSEEN[1], n_layers=1, seq_len=8, name="window-4-1layer"), s, c)
         for s, c in (("single", 1), ("head", 2))]


def _row(npu, cfg, strategy, chips):
    batch = chips if get(strategy).pipelined else 1
    model = dataclasses.replace(cfg, batch=batch)
    planned = plan(npu, model, chips=chips, strategy=strategy).strategies[0]
    fast = plan(npu, model, chips=chips, strategy=strategy,
                exact_chip_cycles=0).strategies[0].predicted_cycles
    sim = simulate(npu, cfg, strategy=strategy, chips=chips, backend="pysim", batch=batch,
                   max_cycles=2_000_000)
    ref = sim.cycles
    return {"bench": f"predicted vs pysim cycles, {cfg.name} {strategy} on {chips}",
            "value": planned.predicted_cycles, "unit": "cycles", "ref": ref,
            "ratio": planned.predicted_cycles / ref,
            "note": f"planner timing: {planned.timing}; launch-level model {fast:,} "
                    f"({fast / ref:.4f}); golden match {sim.golden_match}; batch {batch}"}


def run(quick: bool):
    npu = npu_preset("tiny")
    return [_row(npu, cfg, s, c) for cfg, s, c in (QUICK if quick else FULL)]
