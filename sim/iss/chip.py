"""The ISS of one chip: runs its program in NumPy with the hardware's integer semantics.

It executes the same 64-bit instruction words as the sequencer (``hw.spec.isa``), walks the same
address-generator descriptors (``sim.golden.scratchpad.addr_sequence``) over a byte-exact image
of the scratchpad, and computes with the golden block models, so its memory after ``HALT`` equals
the RTL's bit for bit.

The RTL's units run concurrently: a launch returns at once and the program ``WAIT``s before it
uses a result. The ISS executes each matmul, attention and vector launch when it is issued, and
keeps the words it read and wrote **in flight** until the program may assume it finished (a
``WAIT`` on its unit, the next launch of that unit, or ``HALT``). A launch of another unit that
writes what an in-flight launch reads or writes, or reads what it writes, is a race the RTL
could resolve either way: :class:`IssError`. So a program the ISS accepts gives the same memory
whatever the overlap. Collectives and point-to-point transfers are posted and executed when
their partners have posted theirs (:mod:`sim.iss.scheduler`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hw.spec import NpuConfig
from hw.spec.isa import (
    ADDR_LEVELS,
    OP_UNIT,
    REG_INDEX,
    REGS,
    WRAP_GENS,
    Insn,
    IsaError,
    LoopState,
    Op,
    Unit,
)

from ..golden.scratchpad import AddressError, addr_sequence
from .attention import exec_attention
from .errors import IssError
from .matmul import exec_matmul
from .scheduler import run_programs
from .vector import exec_vector

__all__ = ["Iss", "Access", "SHARED_UNITS"]

#: Units that share address generators: launching one waits for the other to be idle.
SHARED_UNITS = {Unit.ATTN: Unit.ATTN | Unit.VEC, Unit.VEC: Unit.ATTN | Unit.VEC}

_EXEC = {Op.MATMUL: exec_matmul, Op.ATTN: exec_attention, Op.VEC: exec_vector}


@dataclass
class Access:
    """The scratchpad words one launch reads and writes (word addresses)."""

    what: str
    reads: list = field(default_factory=list)
    writes: list = field(default_factory=list)

    def read_set(self) -> np.ndarray:
        return np.unique(np.concatenate(self.reads)) if self.reads else np.zeros(0, np.int64)

    def write_set(self) -> np.ndarray:
        return np.unique(np.concatenate(self.writes)) if self.writes else np.zeros(0, np.int64)


class Iss:
    """One chip: ``mem`` is [sram_words, word_bytes] uint8, ``regs`` the configuration registers.

    ``chip`` is the chip's id on its ring (0 for a lone chip). ``pc`` is the next instruction
    while a program runs (:meth:`run`, or :class:`sim.iss.IssSystem`).
    """

    def __init__(self, npu: NpuConfig, chip: int = 0):
        self.npu = npu
        self.chip = chip
        self.n = npu.array_size
        self.mem = np.zeros((npu.sram_words, self.n), np.uint8)
        self.regs = np.zeros(len(REGS), np.int64)
        self.addr_bits = npu.sram_addr_bits
        self.launches = dict.fromkeys(Op, 0)
        self.pc = 0
        #: The sequencer's counted loop (``LOOP``), run by :mod:`sim.iss.scheduler`.
        self.loop = LoopState()
        #: Launches whose words are still in flight, by (unit, instance).
        self.inflight: dict[tuple[Unit, int], Access] = {}
        self._access: Access | None = None

    # --- memory helpers -------------------------------------------------------------------
    def write_words(self, base: int, words: np.ndarray):
        words = np.asarray(words, np.uint8)
        if base < 0 or base + len(words) > len(self.mem):
            raise IssError(f"write of {len(words)} words at {base} outside the scratchpad "
                           f"({len(self.mem)} words)")
        self.mem[base:base + len(words)] = words

    def read_words(self, base: int, count: int) -> np.ndarray:
        return self.mem[base:base + count].copy()

    def desc(self, gen: str) -> np.ndarray:
        """The addresses generator ``gen`` walks with the current registers."""
        r = self.regs
        base = int(r[REG_INDEX[f"{gen}.base"]])
        n = [int(r[REG_INDEX[f"{gen}.n{lv}"]]) for lv in range(ADDR_LEVELS)]
        s = [int(r[REG_INDEX[f"{gen}.s{lv}"]]) for lv in range(ADDR_LEVELS)]
        wrap = int(r[REG_INDEX[f"{gen}.wrap"]]) if gen in WRAP_GENS else 0
        off = int(r[REG_INDEX[f"{gen}.off"]]) if gen in WRAP_GENS else 0
        for lv, count in enumerate(n):
            if not 0 <= count < 1 << 16:
                raise IssError(f"{gen}.n{lv}={count} is not a 16-bit count")
        if not 0 <= wrap <= self.npu.sram_words:
            raise IssError(f"{gen}.wrap={wrap} must be 0..{self.npu.sram_words} (the "
                           "scratchpad's words)")
        if wrap and not 0 <= off < wrap:
            raise IssError(f"{gen}.off={off} must be 0..{wrap - 1} (inside {gen}.wrap={wrap})")
        try:
            addrs = addr_sequence(base, n, s, self.addr_bits, wrap, off)
        except AddressError as exc:
            raise IssError(f"{gen}: {exc}") from None
        if addrs.max(initial=0) >= len(self.mem):
            raise IssError(f"{gen} walks address {addrs.max()} beyond the scratchpad")
        return addrs

    def _gather(self, gen: str) -> np.ndarray:
        addrs = self.desc(gen)
        if self._access is not None:
            self._access.reads.append(addrs)
        return self.mem[addrs]

    def _scatter(self, gen: str, words: np.ndarray, addrs: np.ndarray | None = None,
                 mask: np.ndarray | None = None):
        """Write ``words`` where ``gen`` walks; ``mask`` ([words, N] bool): only those bytes
        (the byte write enables of a masked write port, WR1), the others keep their value."""
        addrs = self.desc(gen) if addrs is None else addrs
        if len(addrs) != len(words):
            raise IssError(f"{gen} walks {len(addrs)} addresses but the unit writes "
                           f"{len(words)} words")
        if self._access is not None:
            self._access.writes.append(addrs)
        if mask is None:
            self.mem[addrs] = words
            return
        words, mask = np.asarray(words, np.uint8), np.asarray(mask, bool)
        if len(np.unique(addrs)) == len(addrs):
            cur = self.mem[addrs]
            cur[mask] = words[mask]
            self.mem[addrs] = cur
            return
        for addr, word, enable in zip(addrs, words, mask, strict=True):   # in walk order
            self.mem[addr, enable] = word[enable]

    def _reg(self, name: str) -> int:
        return int(self.regs[REG_INDEX[name]])

    # --- in-flight words ---------------------------------------------------------------
    # Launches in flight are kept by (unit, index): the index tells a torus chip's two
    # collective engines apart (every other unit has one instance, index 0).
    def begin(self, unit: Unit, what: str, index: int = 0):
        """Start recording a launch of ``unit`` (instance ``index``): the unit (and one sharing
        its generators) is idle first, so its previous launch is no longer in flight."""
        shared = SHARED_UNITS.get(unit)
        for key in list(self.inflight):
            if key == (unit, index) or (shared is not None and key[0] & shared):
                del self.inflight[key]
        self._access = Access(what)

    def end(self, unit: Unit, index: int = 0) -> Access:
        """Stop recording; check the launch against the other units' in-flight words."""
        access, self._access = self._access, None
        reads, writes = access.read_set(), access.write_set()
        for (other, k), flight in self.inflight.items():
            name = other.name + (f" engine {k}" if k else "")
            for mine, theirs, verb in ((writes, flight.read_set(), "reads"),
                                       (writes, flight.write_set(), "writes"),
                                       (reads, flight.write_set(), "writes")):
                clash = np.intersect1d(mine, theirs)
                if len(clash):
                    raise IssError(
                        f"race: {access.what} accesses word {int(clash[0])} that "
                        f"{flight.what} (unit {name}, still running) {verb}; WAIT for "
                        f"{other.name} first")
        self.inflight[(unit, index)] = access
        return access

    def retire(self, mask: int):
        """The program waited for the units in ``mask``: their words are no longer in flight."""
        for key in list(self.inflight):
            if key[0] & mask:
                del self.inflight[key]

    # --- execution ------------------------------------------------------------------------
    def launch(self, op: Op):
        """Execute one MATMUL, ATTN or VEC launch with the current registers."""
        unit = OP_UNIT[op]
        self.begin(unit, f"{op.name} (pc {self.pc})")
        _EXEC[op](self)
        self.end(unit)
        self.launches[op] += 1

    def step(self, insn: Insn):
        """Execute one instruction that needs no other chip (SET, ADD, ADDX, NOP, WAIT, a unit
        launch). ADDX outside a loop body: IssError; with a scale outside 16 bits: IsaError
        (a ValueError)."""
        if insn.op in (Op.SET, Op.ADD, Op.ADDX):
            try:
                self.regs[insn.reg] = self.loop.written(insn, int(self.regs[insn.reg]), self.pc)
            except IsaError as exc:
                if insn.op is Op.ADDX and not self.loop.active:
                    raise IssError(str(exc)) from None
                raise
        elif insn.op is Op.NOP:
            pass
        elif insn.op is Op.WAIT:
            self.retire(insn.value)
        elif insn.op in _EXEC:
            self.launch(insn.op)
        else:
            raise IssError(f"{insn.op.name} needs the scheduler (sim.iss.scheduler)")

    def run(self, program: list[int], *, max_insns: int = 1_000_000) -> int:
        """Execute until ``HALT``; returns the number of instructions executed. A ``COLL`` runs
        only on a ring of one (``CO_CHIPS = 1``) and a SEND/RECV only to this chip itself:
        programs that need other chips run in :class:`sim.iss.IssSystem`."""
        return run_programs([self], [program], max_insns=max_insns)[0]
