"""Run the programs of the chips of a ring together: collectives and transfers meet here.

Each chip executes its program in order (:class:`sim.iss.Iss` runs SET, WAIT and the matmul,
attention and vector launches). ``COLL``, ``SEND`` and ``RECV`` are **posted**, as the RTL's
units are launched, and the chip goes on; it stops only where the RTL would stall on them: a
``WAIT`` on the unit, a second launch of the unit, or ``HALT``, while the operation has not
met its partners. Posted operations meet when they can: a collective when every member of its
group has posted the same request, a SEND from a to b with the RECV on b from a. When no chip
can go on and nothing can meet, the programs are deadlocked: :class:`IssError` names every
waiting chip, its pc and what it waits for (the RTL would end at its watchdog).
"""

from __future__ import annotations

from hw.spec.isa import OP_UNIT, REG_INDEX, START_CLEARED, IsaError, LoopState, Op, Unit, decode

from .collective import PendingColl, execute_coll, post_coll
from .errors import IssError, begin_loop
from .p2p import PendingRecv, PendingSend, execute_transfer, post_recv, post_send

__all__ = ["run_programs"]

_POST = {Op.COLL: post_coll, Op.SEND: post_send, Op.RECV: post_recv}


class _Chip:
    """The scheduler's view of one chip: its ISS, program, and the posted operations that have
    not met their partners yet (by unit)."""

    def __init__(self, iss, program):
        self.iss = iss
        self.program = program
        self.halted = False
        self.waiting: dict[Unit, PendingColl | PendingSend | PendingRecv] = {}
        self.blocked = ""          # why the chip cannot go on (for the deadlock report)
        self.executed = 0


def _advance(chip: _Chip, chips: int, max_insns: int) -> bool:
    """Run ``chip`` until it halts or blocks; True if it executed anything."""
    iss = chip.iss
    moved = False
    while not chip.halted:
        if iss.pc >= len(chip.program):
            raise IssError(f"chip {iss.chip}: program ended without HALT")
        if chip.executed >= max_insns:
            raise IssError(f"chip {iss.chip}: program exceeded {max_insns} instructions")
        try:
            insn = decode(chip.program[iss.pc])
        except IsaError as exc:
            raise IssError(f"chip {iss.chip} pc {iss.pc}: {exc}") from None
        op = insn.op
        if op is Op.HALT or op is Op.WAIT:
            mask = int(Unit.ALL) if op is Op.HALT else insn.value
            pending = [u for u in chip.waiting if u & mask]
            if pending:
                chip.blocked = f"{'HALT' if op is Op.HALT else 'WAIT'} for " + ", ".join(
                    chip.waiting[u].describe() for u in pending)
                return moved
            iss.retire(mask)
            if op is Op.HALT:
                chip.halted = True
        elif op in _POST:
            unit = OP_UNIT[op]
            if unit in chip.waiting:
                chip.blocked = f"{op.name} while its previous {chip.waiting[unit].describe()} " \
                               "has not met its partner"
                return moved
            iss.begin(unit, f"{op.name} (pc {iss.pc})")
            try:
                posted = _POST[op](iss, chips)
            except IssError as exc:
                iss._access = None
                raise IssError(f"chip {iss.chip} pc {iss.pc}: {exc}") from None
            iss.end(unit)
            iss.launches[op] += 1
            if posted is not None:
                chip.waiting[unit] = posted
        elif op is Op.LOOP:
            iss.pc = begin_loop(iss.loop, iss.chip, iss.pc, insn.value)
            chip.executed += 1
            moved = True
            continue
        else:
            try:
                iss.step(insn)
            except IssError as exc:
                raise IssError(f"chip {iss.chip} pc {iss.pc}: {exc}") from None
            except IsaError as exc:
                raise IsaError(f"chip {iss.chip} pc {iss.pc}: {exc}") from None
        iss.pc = iss.loop.next_pc(iss.pc)
        chip.executed += 1
        moved = True
    return moved


def _meet(chips: list[_Chip]) -> bool:
    """Execute every posted operation whose partners are there; True if any was."""
    isses = [c.iss for c in chips]
    met = False
    for chip in chips:
        coll = chip.waiting.get(Unit.COLL)
        if coll is not None:
            members = [chips[m].waiting.get(Unit.COLL) for m in coll.req.members]
            if all(isinstance(m, PendingColl) and m.req == coll.req for m in members):
                try:
                    execute_coll(members, isses)
                except IssError as exc:
                    raise IssError(f"{coll.describe()}: {exc}") from None
                for m in coll.req.members:
                    del chips[m].waiting[Unit.COLL]
                met = True
        send = chip.waiting.get(Unit.SEND)
        if send is not None:
            recv = chips[send.dest].waiting.get(Unit.RECV)
            if recv is not None and recv.src == send.chip:
                execute_transfer(send, recv, isses)
                del chip.waiting[Unit.SEND]
                del chips[send.dest].waiting[Unit.RECV]
                met = True
    return met


def _partners(chip: _Chip, chips: list[_Chip]) -> str:
    """Why chip's posted operations cannot meet: what each partner is doing instead."""
    notes = []

    def doing(other: _Chip) -> str:
        return "halted" if other.halted else f"at pc {other.iss.pc}: {other.blocked}"

    for op in chip.waiting.values():
        if isinstance(op, PendingColl):
            for m in op.req.members:
                other = chips[m].waiting.get(Unit.COLL)
                if m != chip.iss.chip and (other is None or other.req != op.req):
                    theirs = f"posted {other.describe()}" if other else doing(chips[m])
                    notes.append(f"chip {m} {theirs}")
        else:
            # A SEND waits for the peer's RECV from it, a RECV for the peer's SEND to it.
            unit, want, way = (Unit.RECV, "RECV", "from") if isinstance(op, PendingSend) \
                else (Unit.SEND, "SEND", "to")
            theirs = chips[op.peer].waiting.get(unit)
            if theirs is None:
                notes.append(f"chip {op.peer} never posts a {want} {way} chip {op.chip} "
                             f"({doing(chips[op.peer])})")
            else:
                notes.append(f"chip {op.peer} posted {theirs.describe()}")
    return "; ".join(notes)


def run_programs(isses, programs, *, max_insns: int = 1_000_000) -> list[int]:
    """Run ``programs[i]`` on ``isses[i]`` (chip ``i`` of a ring of ``len(isses)``) until every
    chip halts; return the instructions each executed. :class:`IssError` on a deadlock."""
    if len(programs) != len(isses):
        raise ValueError(f"{len(programs)} programs for {len(isses)} chips")
    chips = [_Chip(iss, program) for iss, program in zip(isses, programs, strict=True)]
    for chip in chips:
        chip.iss.pc = 0
        chip.iss.loop = LoopState()
        for name in START_CLEARED:          # the sequencer clears them at start
            chip.iss.regs[REG_INDEX[name]] = 0
    while True:
        moved = False
        for chip in chips:
            moved |= _advance(chip, len(chips), max_insns)
        met = _meet(chips)
        if all(c.halted for c in chips):
            return [c.executed for c in chips]
        if not moved and not met:
            waiting = [c for c in chips if not c.halted]
            lines = [f"chip {c.iss.chip} (pc {c.iss.pc}) waits at {c.blocked}"
                     + (f" [{_partners(c, chips)}]" if c.waiting else "") for c in waiting]
            raise IssError(f"deadlock: chips {[c.iss.chip for c in waiting]} can never go on: "
                           + "; ".join(lines))
