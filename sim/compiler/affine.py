"""A loop body whose register values are affine in the loop's iteration.

A static program repeats one step ``count`` times with ``LOOP`` (``docs/isa.md``); what changes
from step to step (a KV-cache row's address, the number of cached keys, a position) is a
register value ``a + b * ITER``: the body SETs ``a`` and adds ``b`` times the iteration with
``ADDX``. :func:`emit_affine` builds the body from a function of the iteration that emits one
step as if its position were fixed (the same launch builders as a straight-line program): it
records the step at several iterations, checks that they are the same instructions and that
every SET value is affine in the iteration, and emits ``SET a`` (and ``ADDX b`` where ``b`` is
not 0) into the real program.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from hw.spec.isa import ADDX_SCALE_BITS, REGS, Op

from .assembler import Assembler

__all__ = ["emit_affine", "emit_affine_chips"]

_SCALE_MIN, _SCALE_MAX = -(1 << (ADDX_SCALE_BITS - 1)), (1 << (ADDX_SCALE_BITS - 1)) - 1


class _Recorder(Assembler):
    """An assembler that elides nothing and remembers each SET's source."""

    def __init__(self):
        super().__init__(elide=False)
        self.srcs: dict[int, object] = {}

    def set(self, name: str, value: int, src=None):
        super().set(name, value, src)
        self.srcs[len(self.insns) - 1] = src

    def add(self, name: str, value: int):
        raise AssertionError("a step recorded for emit_affine must not ADD (its values are "
                             "absolute)")

    def loop_begin(self, count: int):
        raise AssertionError("a step recorded for emit_affine must not open a LOOP")


def emit_affine(asm: Assembler, step: Callable[[Assembler, int], None], count: int,
                check: Iterable[int] = ()) -> None:
    """Emit into ``asm`` a ``LOOP`` of ``count`` iterations whose body is ``step(asm, it)``
    with every register value affine in ``it``.

    ``step`` is called with a recording assembler for iterations 0, 1 (even when ``count``
    is 1), ``count - 1`` and ``check`` (positions where something could stop being affine,
    e.g. a 16-bit count's limit). Every recording must emit the same instructions, and every
    SET value must be ``a + b * it`` with ``b`` in ADDX's signed 16-bit range; otherwise
    :class:`AssertionError` names the instruction (the step is not static). ``count == 0``
    emits nothing.
    """
    emit_affine_chips([asm], lambda recs, it: step(recs[0], it), count, check)


def emit_affine_chips(asms: Sequence[Assembler],
                      step: Callable[[list[Assembler], int], None], count: int,
                      check: Iterable[int] = ()) -> None:
    """:func:`emit_affine` for several chips whose steps are emitted together (in lock step,
    as the hidden-dimension compiler does): ``step(recs, it)`` emits iteration ``it`` of chip
    c into ``recs[c]``, and each chip's program gets its own ``LOOP``."""
    if count < 0:
        raise ValueError(f"a loop runs count >= 0 times, not {count}")
    if count == 0:
        return
    # Iteration 1 is recorded even when the loop runs once: the slopes, so the body (and the
    # program's length) is the same for every count.
    its = sorted({0, 1, count - 1, *(i for i in check if 0 <= i < count)})
    recs = {}
    for it in its:
        recs[it] = [_Recorder() for _ in asms]
        step(recs[it], it)
    for c, asm in enumerate(asms):
        _emit(asm, {it: r[c] for it, r in recs.items()}, count)


def _emit(asm: Assembler, recs: dict, count: int) -> None:
    """The loop of ``count`` iterations from one chip's recordings ``{iteration: _Recorder}``."""
    first = recs[0]
    for it, rec in recs.items():
        if len(rec.insns) != len(first.insns):
            raise AssertionError(f"the step has {len(first.insns)} instructions at iteration 0 "
                                 f"and {len(rec.insns)} at iteration {it}")
    handle = asm.loop_begin(count)
    for k, insn in enumerate(first.insns):
        at = {it: rec.insns[k] for it, rec in recs.items()}
        if any((i.op, i.reg) != (insn.op, insn.reg) for i in at.values()):
            raise AssertionError(f"step instruction {k} differs between iterations: "
                                 f"{ {it: (i.op.name, i.reg) for it, i in at.items()} }")
        if insn.op is not Op.SET:
            if any(i != insn for i in at.values()):
                raise AssertionError(f"step instruction {k} ({insn.op.name}) differs between "
                                     "iterations")
            asm.insns.append(insn)
            continue
        name = REGS[insn.reg]
        a = insn.value
        b = at[1].value - a
        for it, i in at.items():
            if i.value != a + b * it:
                raise AssertionError(f"{name} is not affine in the iteration: {a} at 0, "
                                     f"{at[1].value} at 1, {i.value} at {it}")
        if not _SCALE_MIN <= b <= _SCALE_MAX:
            raise AssertionError(f"{name} grows by {b} per iteration, beyond ADDX's "
                                 f"{_SCALE_MIN}..{_SCALE_MAX}")
        asm.set(name, a, first.srcs[k])
        if b:
            asm.addx(name, b)
    asm.loop_end(handle)
