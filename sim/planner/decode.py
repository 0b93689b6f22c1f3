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

from dataclasses import dataclass, field

from hw.spec import ModelConfig, NpuConfig
from hw.spec.formats import OutMode

from ..compiler.decode import DECODE_STRATEGIES, check_generate, compile_decode
from ..compiler.decode_quant import QHead
from ..compiler.quantize import QLayerNorm, QLinear
from ..errors import BadInput
from ..golden.decode import learned_positions
from ..iss.errors import IssError
from ..report.timeline import intervals, step_ends
from ..timing.cycle import time_programs
from ..timing.launch import time_programs_fast
from .plan import EXACT_CHIP_CYCLES, _dummy_qmodel

__all__ = ["GeneratePlan", "plan_generate", "generate_table", "dummy_head"]

#: The largest batch the search tries.
MAX_BATCH = 64


def dummy_head(cfg: ModelConfig) -> QHead:
    """A head with no weights, for the shapes-only compile (``contents=False``)."""
    pos = (1 << 15, 16) if learned_positions(cfg) else None
    return QHead(None, (1 << 15, 16), QLayerNorm(None, None, 16, 1 << 15, 16),
                 QLinear(None, None, None, None, OutMode.INT16), 1.0, None, pos)


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

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _compile(npu, cfg, qm, head, prompt_len, generate, batch, chips, strategy, grid=None):
    return compile_decode(npu, qm, head, prompt_len=prompt_len, generate=generate, batch=batch,
                          chips=chips, strategy=strategy, grid=grid, contents=False)


def _attempt(npu, cfg, qm, head, prompt_len, generate, batch, chips, strategy):
    """``(program, None)`` if it compiles and fits, else ``(None, the limit's message)``."""
    try:
        check_generate(npu, cfg, prompt_len, generate)
        return _compile(npu, cfg, qm, head, prompt_len, generate, batch, chips, strategy), None
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


def plan_generate(npu: NpuConfig, model: ModelConfig, *, generate: int, prompt_len: int,
                  batch: int = 1, strategy: str = "single", chips: int = 1,
                  search: bool = True) -> GeneratePlan:
    """Generation's figures for ``batch`` sequences of ``prompt_len`` tokens and ``generate``
    generated tokens each, on ``chips`` chips with ``strategy`` (single or head)."""
    if strategy not in DECODE_STRATEGIES:
        raise BadInput(f"--generate plans strategy {', '.join(DECODE_STRATEGIES)}, not "
                       f"{strategy}")
    if isinstance(generate, bool) or not isinstance(generate, int) or generate < 1:
        raise BadInput(f"--generate must be at least 1 token, not {generate}")
    if prompt_len < 1:
        raise BadInput(f"--context must be at least 1 token, not {prompt_len}")
    if batch < 1:
        raise BadInput(f"--batch must be at least 1 sequence, not {batch}")
    qm, head = _dummy_qmodel(model), dummy_head(model)
    out = GeneratePlan(strategy, chips, prompt_len, generate, batch, fits=False)
    prog, reason = _attempt(npu, model, qm, head, prompt_len, generate, batch, chips, strategy)
    if search:
        # The prompt's longest at this batch; the batch's largest at this prompt.
        caps = [(npu.attn_window - generate + 1, f"attn_window={npu.attn_window} keys hold "
                 "the context"), (npu.max_seq_len, f"max_seq_len={npu.max_seq_len}")]
        if learned_positions(model):
            caps.append((model.seq_len - generate + 1, f"seq_len={model.seq_len} learned "
                         "positions hold the context"))
        most, cap = min(caps)
        out.longest_prompt, out.longest_prompt_limit = _largest(
            lambda p: _fits(npu, model, qm, head, p, generate, batch, chips, strategy), 1,
            max(1, most),
            cap)
        out.largest_batch, out.largest_batch_limit = _largest(
            lambda b: _fits(npu, model, qm, head, prompt_len, generate, b, chips, strategy), 1,
            MAX_BATCH, f"searched to {MAX_BATCH}")
    if reason is not None:
        out.reason = reason
        return out
    programs = prog.programs
    fast = time_programs_fast(npu, programs)
    timed, out.timed_by = fast, "launch-level model"
    if fast.cycles * len(programs) <= EXACT_CHIP_CYCLES * 4:
        try:
            timed = time_programs(npu, programs, ring=chips > 1, max_cycles=4 * fast.cycles +
                                  1000)
            out.timed_by = "cycle model"
        except IssError:
            pass
    ends = step_ends(programs[prog.picker], intervals(timed.chips[prog.picker].trace,
                                                      timed.cycles))
    ends = ends[::prog.picks_per_step]
    steps = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
    clock = npu.clock_mhz * 1e6
    out.fits = True
    out.cycles, out.ttft_cycles, out.step_cycles = int(timed.cycles), int(ends[0]), steps
    if steps:
        out.tokens_per_s = clock * len(steps) / sum(steps)
        out.tokens_per_s_aggregate = batch * out.tokens_per_s
    out.kv_bytes = [int(k) for k in prog.kv_bytes]
    out.sram_bytes = [int(c.alloc.next_word * npu.word_bytes) for c in prog.chips]
    out.instructions = [len(p) for p in programs]
    return out


def generate_table(plans: list[GeneratePlan]) -> str:
    """The plans as the CLI prints them."""
    lines = []
    for p in plans:
        head = (f"{p.strategy} on {p.chips} chip{'s' if p.chips > 1 else ''}: {p.batch} x "
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
    return "\n".join(lines)

