"""The assembler: programs as lists of instructions, with descriptor helpers.

The instruction encoding is :mod:`hw.spec.isa`; :func:`hw.spec.isa.disassemble` reads programs
back.
"""

from __future__ import annotations

from hw.spec.isa import (
    ADDR_LEVELS,
    START_CLEARED,
    WRAP_GENS,
    Insn,
    Op,
    check_addx_scale,
    encode,
    loop_operand,
    reg,
)

__all__ = ["Assembler"]


class Assembler:
    """Builds a program: a list of :class:`~hw.spec.isa.Insn` with helpers for descriptors."""

    def __init__(self, *, elide: bool = True):
        self.insns: list[Insn] = []
        # Register values this program has already set, with their sources: a SET of the
        # same value from the same source again is dropped (registers are not assumed to start
        # at any value, but those the sequencer clears at start, hw.spec.isa.START_CLEARED).
        self._known: dict[int, tuple] = {reg(name): (0, None) for name in START_CLEARED}
        self._elide = elide

    def set(self, name: str, value: int, src=None):
        """``SET name, value``, unless the register already holds ``value`` from ``src``.

        ``src`` names where a value computed from the data comes from (a layer's LayerNorm
        scale, its attention scales, ...); ``None`` is a constant or an address, fixed by the
        program's shape. A SET is dropped only when both the value and its source repeat, so
        which SETs a program has (its length and every cycle of its run) never depends on the
        data, only on the model's shape: two data sets whose scales happen to coincide differ
        only in SET values.
        """
        index, value = reg(name), int(value)
        if self._elide and self._known.get(index) == (value, src):
            return
        self._known[index] = (value, src)
        self.insns.append(Insn(Op.SET, index, value))

    def set_desc(self, gen: str, desc):
        """The SETs of one descriptor (a dict or :class:`~sim.compiler.descriptors.Desc`); a
        generator with a ``wrap`` register always gets ``wrap`` and ``off`` (0: none)."""
        d = desc if isinstance(desc, dict) else desc.as_dict()
        self.set(f"{gen}.base", d["base"])
        for lv in range(ADDR_LEVELS):
            self.set(f"{gen}.n{lv}", d["n"][lv])
            self.set(f"{gen}.s{lv}", d["s"][lv])
        if gen in WRAP_GENS:
            self.set(f"{gen}.wrap", d.get("wrap", 0))
            self.set(f"{gen}.off", d.get("off", 0))
        elif d.get("wrap", 0):
            raise ValueError(f"{gen} has no wrap register (only {', '.join(WRAP_GENS)})")

    def add(self, name: str, value: int):
        """``ADD name, value``: the register's value is no longer known to the elision."""
        index = reg(name)
        self._known.pop(index, None)
        self.insns.append(Insn(Op.ADD, index, int(value)))

    def addx(self, name: str, scale: int):
        """``ADDX name, scale``: the register plus ``scale`` times the loop's iteration index
        (in a loop body; ValueError on a scale outside -32768..32767); its value is no longer
        known to the elision."""
        index = reg(name)
        scale = check_addx_scale(int(scale))
        self._known.pop(index, None)
        self.insns.append(Insn(Op.ADDX, index, scale))

    def loop_begin(self, count: int):
        """Open ``LOOP body, count`` (the body is what follows until :meth:`loop_end`); no
        SET is elided across the loop's boundaries, as its body runs ``count`` times."""
        self._known.clear()
        self.insns.append(Insn(Op.LOOP, 0, loop_operand(1, count)))
        return len(self.insns) - 1, count

    def loop_end(self, handle):
        """Close the loop :meth:`loop_begin` opened (ValueError on an empty body)."""
        at, count = handle
        body = len(self.insns) - at - 1
        if body < 1:
            raise ValueError("a LOOP needs at least one instruction in its body")
        self.insns[at] = Insn(Op.LOOP, 0, loop_operand(body, count))
        self._known.clear()

    def launch(self, op: Op, flags: int = 0):
        self.insns.append(Insn(Op(op), 0, flags))

    def wait(self, mask: int):
        self.insns.append(Insn(Op.WAIT, 0, int(mask)))

    def halt(self):
        self.insns.append(Insn(Op.HALT))

    def words(self) -> list[int]:
        return [encode(i) for i in self.insns]
