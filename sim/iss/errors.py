"""The ISS's error type, in its own module so that every unit model can import it."""

from hw.spec.isa import IsaError

__all__ = ["IssError", "begin_loop", "loop_iteration"]


class IssError(RuntimeError):
    """A program did something the hardware cannot (bad register value, runaway program)."""


def begin_loop(loop, chip: int, pc: int, value: int) -> int:
    """The pc after the LOOP at ``pc`` (``loop``: the chip's :class:`hw.spec.isa.LoopState`),
    an :class:`IssError` naming ``chip`` where the ISA refuses the loop."""
    try:
        return loop.begin(pc, value)
    except IsaError as exc:
        raise IssError(f"chip {chip}: {exc}") from None


def loop_iteration(loop, chip: int, pc: int) -> int:
    """ITER for the ADDX at ``pc``, an :class:`IssError` naming ``chip`` outside a loop body."""
    try:
        return loop.iteration_at(pc)
    except IsaError as exc:
        raise IssError(f"chip {chip}: {exc}") from None
