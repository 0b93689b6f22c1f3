"""What each chip's units did over time: busy intervals from the chips' trace buffers.

A chip's trace (``hw.tile.trace``) lists every change of its busy vector; :func:`intervals`
turns it into, per unit, the ``[start, end)`` cycles of each busy interval. A unit's k-th
interval is its k-th launch, so the intervals line up with a program's launches: the
collectives and transfers of a report, the bubble of a pipeline, the timeline plot and the
Chrome trace.
"""

from __future__ import annotations

from hw.spec.isa import UNIT_NAMES, Op, decode, loop_fields, reg
from hw.spec.vector import VectorOp
from hw.spec.vector_engine import VecFlags

__all__ = ["intervals", "busy_union", "step_ends", "COMPUTE_UNITS", "COMM_UNITS"]

_VU_OP = reg("VU_OP")
_VU_FLAGS = reg("VU_FLAGS")

COMPUTE_UNITS = ("matmul", "attention", "vector")
COMM_UNITS = ("collective", "send", "recv")


def intervals(entries, end: int) -> dict[str, list[tuple[int, int]]]:
    """Per unit name, its busy intervals ``[(start, end)]`` in cycles from ``start``.

    ``entries`` are ``(cycle, busy)`` pairs; the busy vector holds from its cycle to the next
    entry's; ``end`` closes an interval still open at the last entry.
    """
    out = {name: [] for name in UNIT_NAMES}
    opened = {}
    for cycle, busy in list(entries) + [(end, 0)]:
        for u, name in enumerate(UNIT_NAMES):
            on = busy >> u & 1
            if on and name not in opened:
                opened[name] = cycle
            elif not on and name in opened:
                out[name].append((opened.pop(name), cycle))
    return out


def busy_union(spans: dict[str, list[tuple[int, int]]], units) -> int:
    """Cycles in which any of ``units`` is busy."""
    edges = sorted((s, e) for u in units for s, e in spans[u])
    total, at = 0, None
    for s, e in edges:
        if at is None or s > at:
            total += e - s
            at = e
        elif e > at:
            total += e - at
            at = e
    return total


def _vec_launches(program) -> list[bool]:
    """Per VEC launch the program runs, in order (each loop body as often as its count):
    whether it picks tokens, an ARGMAX whose records are final (not followed by an ARGMAX in
    pair mode that combines them with other chips')."""
    out, regs, pc, insns = [], {}, 0, [decode(w) for w in program]

    def launch():
        argmax = regs.get(_VU_OP) == VectorOp.ARGMAX
        return argmax, argmax and VecFlags.decode(regs.get(_VU_FLAGS, 0)).pairs
    while pc < len(insns):
        insn = insns[pc]
        if insn.op is Op.LOOP:
            body, count = loop_fields(insn.value)
            got = []
            for i in insns[pc + 1:pc + 1 + body]:
                if i.op is Op.SET and i.reg in (_VU_OP, _VU_FLAGS):
                    regs[i.reg] = i.value
                elif i.op is Op.VEC:
                    got.append(launch())
            out += got * count
            pc += body + 1
            continue
        if insn.op is Op.SET and insn.reg in (_VU_OP, _VU_FLAGS):
            regs[insn.reg] = insn.value
        elif insn.op is Op.VEC:
            out.append(launch())
        pc += 1
    return [argmax and not (k + 1 < len(out) and out[k + 1] == (True, True))
            for k, (argmax, _) in enumerate(out)]


def step_ends(program, trace_spans) -> list[int]:
    """The cycle each step's tokens were picked in (the end of its ARGMAX launch): the first
    is the prefill's (the time to first token), then one per decode step."""
    order = _vec_launches(program)
    vec = trace_spans["vector"]
    if len(vec) != len(order):
        raise AssertionError(f"{len(vec)} vector intervals for {len(order)} VEC launches")
    return [end for (_, end), is_argmax in zip(vec, order, strict=True) if is_argmax]
