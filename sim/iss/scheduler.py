"""Run the programs of the chips of a system together: collectives and transfers meet here.

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

from hw.spec.collective import walk_group
from hw.spec.isa import OP_UNIT, REG_INDEX, START_CLEARED, IsaError, LoopState, Op, Unit, decode

from .collective import PendingColl, execute_coll, post_coll
from .errors import IssError, begin_loop
from .p2p import PendingRecv, PendingSend, execute_transfer, post_recv, post_send

__all__ = ["run_programs"]

_POST = {Op.SEND: post_send, Op.RECV: post_recv}


class _Chip:
    """The scheduler's view of one chip: its ISS, program, and the posted operations that have
    not met their partners yet (by unit and instance: a torus's chip has two collective
    engines)."""

    def __init__(self, iss, program):
        self.iss = iss
        self.program = program
        self.halted = False
        self.waiting: dict[tuple[Unit, int], PendingColl | PendingSend | PendingRecv] = {}
        self.blocked = ""          # why the chip cannot go on (for the deadlock report)
        self.executed = 0


def _advance(chip: _Chip, chips: int, max_insns: int, engines: int) -> bool:
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
            pending = [key for key in chip.waiting if key[0] & mask]
            if pending:
                chip.blocked = f"{'HALT' if op is Op.HALT else 'WAIT'} for " + ", ".join(
                    chip.waiting[key].describe() for key in pending)
                return moved
            iss.retire(mask)
            if op is Op.HALT:
                chip.halted = True
        elif op in _POST or op is Op.COLL:
            unit = OP_UNIT[op]
            index = insn.value if op is Op.COLL else 0
            key = (unit, index)
            if key in chip.waiting:
                chip.blocked = f"{op.name} while its previous {chip.waiting[key].describe()} " \
                               "has not met its partner"
                return moved
            iss.begin(unit, f"{op.name} (pc {iss.pc})", index if 0 <= index < engines else 0)
            try:
                if op is Op.COLL:
                    posted = post_coll(iss, chips, index, engines)
                else:
                    posted = _POST[op](iss, chips)
            except IssError as exc:
                iss._access = None
                raise IssError(f"chip {iss.chip} pc {iss.pc}: {exc}") from None
            iss.end(unit, index)
            iss.launches[op] += 1
            if posted is not None:
                chip.waiting[key] = posted
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
    keys = {k for c in chips for k in c.waiting if k[0] == Unit.COLL}
    for key in sorted(keys):
        posted = {c.iss.chip: c.waiting[key].cmd for c in chips if key in c.waiting}
        for chip in list(posted):
            if chip not in posted:
                continue                  # met with an earlier member
            try:
                req = walk_group(posted, chip)
            except ValueError as exc:
                raise IssError(str(exc)) from None
            if req is None:
                continue
            members = [chips[m].waiting[key] for m in req.members]
            try:
                execute_coll(members, isses)
            except IssError as exc:
                raise IssError(f"{members[0].describe()}: {exc}") from None
            for m in req.members:
                del chips[m].waiting[key]
                del posted[m]
            met = True
    for chip in chips:
        send = chip.waiting.get((Unit.SEND, 0))
        if send is not None:
            recv = chips[send.dest].waiting.get((Unit.RECV, 0))
            if recv is not None and recv.src == send.chip:
                execute_transfer(send, recv, isses)
                del chip.waiting[(Unit.SEND, 0)]
                del chips[send.dest].waiting[(Unit.RECV, 0)]
                met = True
    return met


def _partners(chip: _Chip, chips: list[_Chip]) -> str:
    """Why chip's posted operations cannot meet: what each partner is doing instead."""
    notes = []

    def doing(other: _Chip) -> str:
        return "halted" if other.halted else f"at pc {other.iss.pc}: {other.blocked}"

    for key, op in chip.waiting.items():
        if isinstance(op, PendingColl):
            # Along the next members until one has not posted this collective.
            seen, cur = {chip.iss.chip}, op
            while True:
                nxt = cur.cmd.next
                other = chips[nxt].waiting.get(key)
                if nxt in seen:
                    break
                if other is None or not other.cmd.same(op.cmd):
                    theirs = f"posted {other.describe()}" if other else doing(chips[nxt])
                    notes.append(f"chip {nxt} {theirs}")
                    break
                seen.add(nxt)
                cur = other
        else:
            # A SEND waits for the peer's RECV from it, a RECV for the peer's SEND to it.
            unit, want, way = (Unit.RECV, "RECV", "from") if isinstance(op, PendingSend) \
                else (Unit.SEND, "SEND", "to")
            theirs = chips[op.peer].waiting.get((unit, 0))
            if theirs is None:
                notes.append(f"chip {op.peer} never posts a {want} {way} chip {op.chip} "
                             f"({doing(chips[op.peer])})")
            else:
                notes.append(f"chip {op.peer} posted {theirs.describe()}")
    return "; ".join(notes)


def run_programs(isses, programs, *, max_insns: int = 1_000_000, engines: int = 1) -> list[int]:
    """Run ``programs[i]`` on ``isses[i]`` (chip ``i`` of a system of ``len(isses)``, each with
    ``engines`` collective engines) until every chip halts; return the instructions each
    executed. :class:`IssError` on a deadlock."""
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
            moved |= _advance(chip, len(chips), max_insns, engines)
        met = _meet(chips)
        if all(c.halted for c in chips):
            return [c.executed for c in chips]
        if not moved and not met:
            waiting = [c for c in chips if not c.halted]
            lines = [f"chip {c.iss.chip} (pc {c.iss.pc}) waits at {c.blocked}"
                     + (f" [{_partners(c, chips)}]" if c.waiting else "") for c in waiting]
            raise IssError(f"deadlock: chips {[c.iss.chip for c in waiting]} can never go on: "
                           + "; ".join(lines))
