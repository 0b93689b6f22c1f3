"""``npu plan --generate N``: generation's figures without running it.

The compiler's own program (:func:`sim.compiler.decode.compile_decode`) is compiled from the
shapes alone (no weights, dummy scales: the same instructions and layout) and timed: by the
ISS's cycle model (equal to the RTL) when the run is short enough
(:data:`sim.planner.plan.EXACT_CHIP_CYCLES` per chip), else by the launch-level model. The time
to first token and each step's cycles come from the timed trace as in a simulation
(:func:`sim.report.timeline.step_ends`); the capacity and the program size are the compiler's
checks, so a plan that does not fit names the limit a compile would. The longest prompt and the
largest batch that fit are searched with the same compiles.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from hw.spec import ModelConfig, NpuConfig
from hw.spec.formats import OutMode
from hw.spec.topology import Topology

from ..compiler.decode import (
    DECODE_STRATEGIES,
    GRID_STRATEGIES,
    check_generate,
    compile_decode,
    strategy_axes,
)
from ..compiler.decode_quant import QHead
from ..compiler.decode_split import kv_chunks
from ..compiler.quantize import QLayerNorm, QLinear
from ..errors import BadInput
from ..golden.decode import learned_positions
from ..iss.errors import IssError
from ..report.timeline import intervals, step_ends
from ..timing.cycle import time_programs
from ..timing.launch import time_programs_fast
from .plan import EXACT_CHIP_CYCLES, _dummy_qmodel, dim_links, torus_of

__all__ = ["GeneratePlan", "plan_generate", "grid_capacity", "grid_min_chips", "generate_table",
           "dummy_head"]

#: The largest batch the search tries.
MAX_BATCH = 64


def dummy_head(cfg: ModelConfig) -> QHead:
    """A head with no weights, for the shapes-only compile (``contents=False``)."""
    pos = (1 << 15, 16) if learned_positions(cfg) else None
    wide = cfg.quant == "llm16c"         # the final norm's per-lane REQUANT: present, not read
    return QHead(None, (1 << 15, 16), QLayerNorm(None, None, 16, 1 << 15, 16),
                 QLinear(None, None, None, None, OutMode.INT16), 1.0, None, pos,
                 (None, None) if wide else None, 1 if wide else 0)


@dataclass
class GeneratePlan:
    """One strategy's generation figures (``fits`` False: ``reason`` says why)."""

    strategy: str
    chips: int
    prompt_len: int
    generate: int
    batch: int
    fits: bool
    reason: str | None = None
    cycles: int | None = None
    ttft_cycles: int | None = None
    step_cycles: list = field(default_factory=list)
    tokens_per_s: float | None = None
    tokens_per_s_aggregate: float | None = None
    kv_bytes: list = field(default_factory=list)
    sram_bytes: list = field(default_factory=list)
    instructions: list = field(default_factory=list)
    timed_by: str | None = None
    longest_prompt: int | None = None
    longest_prompt_limit: str | None = None
    largest_batch: int | None = None
    largest_batch_limit: str | None = None
    grid: str | None = None
    notes: list = field(default_factory=list)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _compile(npu, cfg, qm, head, prompt_len, generate, batch, chips, strategy, grid=None):
    return compile_decode(npu, qm, head, prompt_len=prompt_len, generate=generate, batch=batch,
                          chips=chips, strategy=strategy, grid=grid, contents=False)


def _attempt(npu, cfg, qm, head, prompt_len, generate, batch, chips, strategy, grid=None):
    """``(program, None)`` if it compiles and fits, else ``(None, the limit's message)``."""
    try:
        check_generate(npu, cfg, prompt_len, generate,
                       split_chips=chips if strategy == "sequence" else 0)
        return _compile(npu, cfg, qm, head, prompt_len, generate, batch, chips, strategy,
                        grid), None
    except ValueError as exc:
        return None, str(exc)


def _fits(*args) -> str | None:
    """None if the program compiles and fits, else the limit's message."""
    return _attempt(*args)[1]


def _largest(ok, low: int, high: int, cap: str) -> tuple[int | None, str | None]:
    """The largest ``k`` in ``low..high`` with ``ok(k)`` None (``ok`` monotone: fits up to a
    point), and the reason ``k + 1`` does not fit (``cap`` when ``high`` fits)."""
    if ok(low) is not None:
        return None, ok(low)
    if ok(high) is None:
        return high, cap
    lo, hi = low, high          # ok(lo) fits, ok(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid) is None:
            lo = mid
        else:
            hi = mid
    return lo, ok(hi)


def placed(npu: NpuConfig, strategy: str, chips: int, grid=None) -> NpuConfig:
    """``npu`` as the system generation is timed on: a grid on the torus of its shape
    (:func:`sim.planner.plan.torus_of`: head groups and pipelines along the rows, each
    stage-to-stage send one hop along a column) with the NPU's links per dimension, a
    one-dimensional strategy on a ring of ``chips`` (or the NPU's own ``[topology]``)."""
    if npu.topology is not None and npu.topology.chips == chips:
        return npu
    if strategy in GRID_STRATEGIES:
        dims = torus_of(strategy, grid)
        return dataclasses.replace(npu, topology=Topology(dims, dim_links(npu)))
    return dataclasses.replace(npu, topology=None)


def _timed(npu, prog, chips):
    """(cycles, first token, step cycles, how) of a compiled generation."""
    programs = prog.programs
    fast = time_programs_fast(npu, programs)
    timed, how = fast, "launch-level model"
    torus = npu.topology is not None and npu.topology.is_torus
    if fast.cycles * len(programs) <= EXACT_CHIP_CYCLES * 4 and not torus:
        try:
            timed = time_programs(npu, programs, ring=chips > 1, max_cycles=4 * fast.cycles +
                                  1000)
            how = "cycle model"
        except IssError:
            pass
    ends = step_ends(programs[prog.picker], intervals(timed.chips[prog.picker].trace,
                                                      timed.cycles))
    ends = ends[::prog.picks_per_step]
    steps = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
    return int(timed.cycles), int(ends[0]), steps, how


def _axes_of(strategy, chips, grid):
    try:
        return strategy_axes(strategy, chips, grid)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def _finish(out, npu, batch, cycles, ttft, steps, how, kv, sram, instructions):
    clock = npu.clock_mhz * 1e6
    out.fits = True
    out.cycles, out.ttft_cycles, out.step_cycles = int(cycles), int(ttft), steps
    out.timed_by = how
    if steps:
        out.tokens_per_s = clock * len(steps) / sum(steps)
        out.tokens_per_s_aggregate = batch * out.tokens_per_s
    out.kv_bytes, out.sram_bytes, out.instructions = kv, sram, instructions
    return out


def plan_generate(npu: NpuConfig, model: ModelConfig, *, generate: int, prompt_len: int,
                  batch: int = 1, strategy: str = "single", chips: int = 1, grid=None,
                  search: bool = True, scaled: bool | None = None) -> GeneratePlan:
    """Generation's figures for ``batch`` sequences of ``prompt_len`` tokens and ``generate``
    generated tokens each, on ``chips`` chips with ``strategy`` (``grid``: the A x B of a
    2-D one, timed on the torus of its shape, :func:`placed`).

    Small systems are compiled whole and timed. ``scaled`` (default: when a whole compile
    would hold more than :data:`WHOLE_LAYER_CHIPS` chip-layers) compiles the same strategy
    with fewer layers and stages (:func:`scaled_generate`) and extends its figures along
    them; a plan that does not fit then names the bytes or instructions per chip the
    extension gives."""
    if strategy not in DECODE_STRATEGIES:
        raise BadInput(f"--generate plans strategy {', '.join(DECODE_STRATEGIES)}, not "
                       f"{strategy}")
    if isinstance(generate, bool) or not isinstance(generate, int) or generate < 1:
        raise BadInput(f"--generate must be at least 1 token, not {generate}")
    if prompt_len < 1:
        raise BadInput(f"--context must be at least 1 token, not {prompt_len}")
    if batch < 1:
        raise BadInput(f"--batch must be at least 1 sequence, not {batch}")
    axes = _axes_of(strategy, chips, grid)
    if scaled is None:
        scaled = axes[1] * axes[2] * math.ceil(model.n_layers / axes[1]) > WHOLE_LAYER_CHIPS
    out = GeneratePlan(strategy, chips, prompt_len, generate, batch, fits=False,
                       grid=None if grid is None else f"{grid[0]}x{grid[1]}")
    if scaled:
        return scaled_generate(npu, model, out, axes)
    qm, head = _dummy_qmodel(model), dummy_head(model)
    system = placed(npu, strategy, chips, grid)
    prog, reason = _attempt(system, model, qm, head, prompt_len, generate, batch, chips,
                            strategy, grid)
    if search:
        # The prompt's longest at this batch; the batch's largest at this prompt.
        # Split-KV decode (sequence): each chip's chunk of the context within its ring.
        rings = chips if strategy == "sequence" else 1
        caps = [(rings * npu.attn_window - generate + 1, f"attn_window={npu.attn_window} keys "
                 f"{'a chip ' if rings > 1 else ''}hold the context"),
                (npu.max_seq_len, f"max_seq_len={npu.max_seq_len}")]
        if learned_positions(model):
            caps.append((model.seq_len - generate + 1, f"seq_len={model.seq_len} learned "
                         "positions hold the context"))
        most, cap = min(caps)
        args = (system, model, qm, head)
        # Split-KV decode: the last chip, which caches the generated tokens, needs a prompt
        # token too, so the search starts at the shortest prompt that reaches it.
        low = 1 if rings == 1 else next(
            (p for p in range(1, max(1, most) + 1)
             if kv_chunks(p + generate - 1, chips)[-1][0] < p), 1)
        out.longest_prompt, out.longest_prompt_limit = _largest(
            lambda p: _fits(*args, p, generate, batch, chips, strategy, grid), low,
            max(low, most), cap)
        out.largest_batch, out.largest_batch_limit = _largest(
            lambda b: _fits(*args, prompt_len, generate, b, chips, strategy, grid),
            max(1, axes[0]), MAX_BATCH, f"searched to {MAX_BATCH}")
    if reason is not None:
        out.reason = reason
        return out
    cycles, ttft, steps, how = _timed(system, prog, chips)
    return _finish(out, npu, batch, cycles, ttft, steps, how,
                   [int(k) for k in prog.kv_bytes],
                   [int(c.alloc.next_word * npu.word_bytes) for c in prog.chips],
                   [len(p) for p in prog.programs])


#: A generation whose whole compile holds more chip-layers (chips x layers per chip) than
#: this is planned by :func:`scaled_generate`.
WHOLE_LAYER_CHIPS = 64


def _reduced(npu, model, out, stages, shards, layers, batch, timed=True):
    """A compiled and timed generation of ``model`` cut to ``layers`` layers on ``stages``
    stages of ``shards`` head shards, or under hidden parallelism ``shards`` d_model shards
    (one data replica), with no capacity check (``timed=False``: compiled only, the
    figures per chip without the cycles)."""
    cfg = dataclasses.replace(model, n_layers=layers)
    strategy, grid = {(1, 1): ("single", None), (1, 0): ("head", None),
                      (0, 1): ("pipeline", None)}.get(
        (int(stages == 1), int(shards == 1)), ("head+pipeline", (shards, stages)))
    if out.strategy == "hidden":
        strategy = "hidden"
    chips = stages * shards
    system = placed(npu, strategy, chips, grid)
    check_generate(npu, cfg, out.prompt_len, out.generate)
    prog = compile_decode(system, _dummy_qmodel(cfg), dummy_head(cfg),
                          prompt_len=out.prompt_len, generate=out.generate, batch=batch,
                          chips=chips, strategy=strategy, grid=grid, check=False,
                          contents=False)
    cycles, ttft, steps, how = _timed(system, prog, chips) if timed else (None,) * 4
    return {"cycles": cycles, "ttft": ttft, "steps": steps, "how": how,
            "kv": [int(k) for k in prog.kv_bytes],
            "sram": [int(c.alloc.next_word * npu.word_bytes) for c in prog.chips],
            "insns": [len(p) for p in prog.programs], "stages": stages}


def scaled_generate(npu: NpuConfig, model: ModelConfig, out: GeneratePlan,
                    axes: tuple[int, int, int]) -> GeneratePlan:
    """Generation on ``axes`` = (replicas, stages, shards) from smaller compiles of the same
    program: the data replicas are independent (one is timed, with the largest share of
    the batch), and a pipeline of ``S`` stages over ``L`` layers is timed on a cut of
    ``S0`` stages of one and two layers each and on ``S0 + 1`` stages of one layer each
    (``S0 = max(2, B)``: as many stages as sequences, so that the cut pipeline is no fuller
    than the real one), every figure extended as ``c0 + h S + c L`` (a token passes every
    stage and layer once: ``h`` a stage's hop and fixed cost, ``c`` a layer's); without a
    pipeline, on two and four layers, as ``c0 + c L``. Per-chip bytes and instructions are
    linear in the layers per chip: extended per chip role (first stage, middle, last) from
    the two cuts to the most layers a stage holds. A plan that does not fit
    names that chip's bytes against ``sram_bytes`` or its instructions against
    ``imem_words``."""
    replicas, stages, shards = axes
    L, B = model.n_layers, out.batch
    b = -(-B // replicas)
    per_stage = -(-L // stages)
    try:
        if stages == 1:
            # Two and four layers: a one-layer program holds its weights and tables in the
            # transfer bank where a deeper one does not, so it is no base for the extension.
            k = 2 if L > 4 else max(1, L // 2)
            one = _reduced(npu, model, out, 1, shards, k, b)
            two = _reduced(npu, model, out, 1, shards, 2 * k, b)
            s0 = 1

            def extend(f1, f2):
                return round(f1 + (f2 - f1) * (L - k) / k)
        else:
            s0 = min(max(2, b), stages)
            one = _reduced(npu, model, out, s0, shards, s0, b)
            two = _reduced(npu, model, out, s0, shards, 2 * s0, b)
            more = _reduced(npu, model, out, s0 + 1, shards, s0 + 1, b) if s0 < stages \
                else None

            def extend(f1, f2, f3=None):
                c = (f2 - f1) / s0
                if f3 is None:
                    return round(f1 + c * (L - s0))
                h = f3 - f1 - c
                return round(f1 + h * (stages - s0) + c * (L - s0))
    except ValueError as exc:
        out.reason = str(exc)
        return out
    pts = [one, two] + ([more] if stages > 1 and more is not None else [])

    def fig(get):
        return extend(*(get(p) for p in pts))
    cycles, ttft = fig(lambda p: p["cycles"]), fig(lambda p: p["ttft"])
    steps = [fig(lambda p, k=k: p["steps"][k]) for k in range(len(one["steps"]))]

    def per_chip(key):
        """The largest value per chip role, extended to ``per_stage`` layers a stage."""
        roles = {}
        for c, (v1, v2) in enumerate(zip(one[key], two[key], strict=True)):
            s = c // shards
            role = "first" if s == 0 else "last" if s == s0 - 1 else "middle"
            roles[role] = max(roles.get(role, 0), round(v1 + (v2 - v1) * (per_stage - base) /
                                                        base))
        return roles
    base = k if stages == 1 else 1          # the cuts' layers a stage: base and 2 base
    sram, kv, insns = per_chip("sram"), per_chip("kv"), per_chip("insns")
    out.notes.append(f"timed on cuts of {s0} stage{'s' if s0 > 1 else ''} x {shards} "
                     f"shard{'s' if shards > 1 else ''} with {base} and {2 * base} layers a "
                     "stage"
                     + (f" and {s0 + 1} stages" if len(pts) == 3 else "")
                     + f", extended to {stages} x {per_stage}"
                     + (f"; one of {replicas} data replicas timed" if replicas > 1 else ""))
    worst = max(sram.items(), key=lambda kv_: kv_[1])
    if worst[1] > npu.sram_bytes:
        out.reason = (f"sram_bytes={npu.sram_bytes:,} is too small: a {worst[0]} stage's chip "
                      f"needs {worst[1]:,} bytes ({per_stage} layers, KV {kv[worst[0]]:,} B)")
        out.sram_bytes, out.kv_bytes = [worst[1]], [kv[worst[0]]]
        return out
    big = max(insns.values())
    if big > npu.imem_words:
        out.reason = (f"imem_words={npu.imem_words:,} is too small: a chip's program has "
                      f"{big:,} instructions")
        return out
    return _finish(out, npu, B, cycles, ttft, steps, one["how"], [max(kv.values())],
                   [worst[1]], [big])


def grid_capacity(npu: NpuConfig, model: ModelConfig, *, generate: int, prompt_len: int,
                  batch: int = 1, most: int = 1024) -> list[tuple]:
    """``(A, layers a stage, B, None)`` for each head-group size ``A`` dividing ``n_heads``
    (2 or more) whose fewest stages ``B`` fit, else ``(A, None, None, why)``: two stages of
    ``A`` shards with one and two layers a stage are compiled (shapes only, not timed); a
    chip's bytes are linear in its stage's layers (:func:`scaled_generate`), so they give the
    most layers a stage holds and the fewest stages ``B = max(2, ceil(n_layers / k))``."""
    L = model.n_layers
    if L < 2 or model.n_heads < 2:
        raise BadInput(f"head+pipeline needs 2 or more layers and heads, not n_layers={L}, "
                       f"n_heads={model.n_heads}")
    out = GeneratePlan("head+pipeline", 0, prompt_len, generate, batch, fits=False)
    rows = []
    for a in (d for d in range(2, model.n_heads + 1) if model.n_heads % d == 0):
        if a * 2 > most:
            break
        try:
            cuts = [_reduced(npu, model, out, 2, a, 2 * k, batch, timed=False)
                    for k in (1, 2)]
        except ValueError as exc:
            rows.append((a, None, None, str(exc)))
            continue
        per_layer = max(c2 - c1 for c1, c2 in zip(cuts[0]["sram"], cuts[1]["sram"],
                                                   strict=True))
        fixed = max(c1 - per_layer for c1 in cuts[0]["sram"])
        k = min(L, (npu.sram_bytes - fixed) // per_layer if per_layer > 0 else L)
        if k < 1:
            rows.append((a, None, None, f"sram_bytes={npu.sram_bytes:,} is too small: a chip "
                         f"of a head group of {a} needs {fixed + per_layer:,} bytes for one "
                         "layer"))
            continue
        stages = max(2, -(-L // k))
        if a * stages > most:
            rows.append((a, None, None, f"{a} x {stages} = {a * stages:,} chips exceed the "
                         f"{most:,} planned"))
            continue
        rows.append((a, -(-L // stages), stages, None))
    return rows


def grid_min_chips(npu: NpuConfig, model: ModelConfig, *, generate: int, prompt_len: int,
                   batch: int = 1, most: int = 1024) -> GeneratePlan:
    """Generation under ``head+pipeline`` on the fewest chips that hold it (at most ``most``):
    each head group's fewest stages from :func:`grid_capacity`, then the ``A x B`` with the
    fewest chips (on a tie, the more head shards: fewer weights a chip, a shorter step)
    planned and timed by :func:`plan_generate`. A model no grid holds is a plan that does not
    fit, naming the last head group's limit. The notes list every head group's grid."""
    rows = grid_capacity(npu, model, generate=generate, prompt_len=prompt_len, batch=batch,
                         most=most)
    fitting = [r for r in rows if r[3] is None]
    if not fitting:
        out = GeneratePlan("head+pipeline", 0, prompt_len, generate, batch, fits=False)
        out.reason = rows[-1][3] if rows else "no head group divides n_heads"
        return out
    a, _, b, _ = min(fitting, key=lambda r: (r[0] * r[2], -r[0]))
    plan = plan_generate(npu, model, generate=generate, prompt_len=prompt_len, batch=batch,
                         strategy="head+pipeline", chips=a * b, grid=(a, b), search=False)
    plan.notes[:0] = [f"the fewest chips: head groups of {a} (a divisor of n_heads="
                      f"{model.n_heads}) on {b} stages of at most {-(-model.n_layers // b)} "
                      "layers; by head group: " + "; ".join(
                          f"{r[0]}: {r[0] * r[2]} chips ({r[0]}x{r[2]}, {r[1]} layers a stage)"
                          if r[3] is None else f"{r[0]}: {r[3]}" for r in rows)]
    return plan


def generate_table(plans: list[GeneratePlan]) -> str:
    """The plans as the CLI prints them."""
    lines = []
    for p in plans:
        shape = f" {p.grid}" if p.grid else ""
        head = (f"{p.strategy}{shape} on {p.chips} chip{'s' if p.chips > 1 else ''}: {p.batch} x "
                f"({p.prompt_len} prompt + {p.generate} generated)")
        if not p.fits:
            lines.append(f"{head}: does not fit: {p.reason}")
        else:
            steps = p.step_cycles
            lines.append(
                f"{head}: first token {p.ttft_cycles:,} cycles; "
                + (f"steps {min(steps):,}..{max(steps):,} cycles, {p.tokens_per_s:,.0f} "
                   f"tokens/s per sequence, {p.tokens_per_s_aggregate:,.0f} in all; "
                   if steps else "")
                + f"KV {max(p.kv_bytes):,} B/chip, SRAM {max(p.sram_bytes):,} B/chip "
                  f"({p.timed_by})")
        if p.longest_prompt is not None:
            lines.append(f"  longest prompt that fits: {p.longest_prompt} "
                         f"(beyond: {p.longest_prompt_limit})")
        if p.largest_batch is not None:
            lines.append(f"  largest batch that fits: {p.largest_batch} "
                         f"(beyond: {p.largest_batch_limit})")
        lines.extend(f"  {note}" for note in p.notes)
    return "\n".join(lines)

