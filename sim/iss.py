"""Instruction-set simulator: runs chip programs in NumPy with the hardware's integer semantics.

It executes the same 64-bit instruction words as the sequencer (``hw.spec.isa``), walks the same
address-generator descriptors (``sim.golden.scratchpad.addr_sequence``) over a byte-exact image
of the scratchpad, and computes with the golden block models, so its memory after ``HALT`` equals
the RTL's bit for bit. Units run one launch at a time here (the RTL overlaps them; a correct
program's ``WAIT``s make the order irrelevant).
"""

from __future__ import annotations

import numpy as np

from hw.spec import NpuConfig
from hw.spec.formats import OutMode
from hw.spec.isa import ADDR_LEVELS, REG_INDEX, REGS, Insn, IsaError, Op, decode, encode, reg
from hw.spec.memory import PARAM_WORDS, pack_rows, unpack_rows

from .golden.matmul import bias_add, requant, wrap
from .golden.scratchpad import addr_sequence
from .iss_attention import exec_attention
from .iss_collective import exec_collective
from .iss_errors import IssError
from .iss_vector import exec_vector

__all__ = ["Assembler", "Iss", "IssError"]


class Assembler:
    """Builds a program: a list of :class:`~hw.spec.isa.Insn` with helpers for descriptors."""

    def __init__(self, *, elide: bool = True):
        self.insns: list[Insn] = []
        # Register values this program has already set: a SET of the same value again is
        # dropped (registers are not assumed to start at any value).
        self._known: dict[int, int] = {}
        self._elide = elide

    def set(self, name: str, value: int):
        index, value = reg(name), int(value)
        if self._elide and self._known.get(index) == value:
            return
        self._known[index] = value
        self.insns.append(Insn(Op.SET, index, value))

    def set_desc(self, gen: str, desc):
        d = desc if isinstance(desc, dict) else desc.as_dict()
        self.set(f"{gen}.base", d["base"])
        for lv in range(ADDR_LEVELS):
            self.set(f"{gen}.n{lv}", d["n"][lv])
            self.set(f"{gen}.s{lv}", d["s"][lv])

    def launch(self, op: Op, flags: int = 0):
        self.insns.append(Insn(Op(op), 0, flags))

    def wait(self, mask: int):
        self.insns.append(Insn(Op.WAIT, 0, int(mask)))

    def halt(self):
        self.insns.append(Insn(Op.HALT))

    def words(self) -> list[int]:
        return [encode(i) for i in self.insns]


class Iss:
    """One chip: ``mem`` is [sram_words, word_bytes] uint8, ``regs`` the configuration registers."""

    def __init__(self, npu: NpuConfig):
        self.npu = npu
        self.n = npu.array_size
        self.mem = np.zeros((npu.sram_words, self.n), np.uint8)
        self.regs = np.zeros(len(REGS), np.int64)
        self.addr_bits = npu.sram_addr_bits
        self.launches = dict.fromkeys(Op, 0)

    # --- memory helpers -------------------------------------------------------------------
    def write_words(self, base: int, words: np.ndarray):
        words = np.asarray(words, np.uint8)
        if base < 0 or base + len(words) > len(self.mem):
            raise IssError(f"write of {len(words)} words at {base} outside the scratchpad "
                           f"({len(self.mem)} words)")
        self.mem[base:base + len(words)] = words

    def read_words(self, base: int, count: int) -> np.ndarray:
        return self.mem[base:base + count].copy()

    def _desc(self, gen: str):
        r = self.regs
        base = int(r[REG_INDEX[f"{gen}.base"]])
        n = [int(r[REG_INDEX[f"{gen}.n{lv}"]]) for lv in range(ADDR_LEVELS)]
        s = [int(r[REG_INDEX[f"{gen}.s{lv}"]]) for lv in range(ADDR_LEVELS)]
        for lv, count in enumerate(n):
            if not 0 <= count < 1 << 16:
                raise IssError(f"{gen}.n{lv}={count} is not a 16-bit count")
        return addr_sequence(base, n, s, self.addr_bits)

    def _gather(self, gen: str) -> np.ndarray:
        addrs = self._desc(gen)
        if addrs.max(initial=0) >= len(self.mem):
            raise IssError(f"{gen} reads address {addrs.max()} beyond the scratchpad")
        return self.mem[addrs]

    def _scatter(self, gen: str, words: np.ndarray):
        addrs = self._desc(gen)
        if len(addrs) != len(words):
            raise IssError(f"{gen} walks {len(addrs)} addresses but the unit writes "
                           f"{len(words)} words")
        if addrs.max(initial=0) >= len(self.mem):
            raise IssError(f"{gen} writes address {addrs.max()} beyond the scratchpad")
        self.mem[addrs] = words

    def _reg(self, name: str) -> int:
        return int(self.regs[REG_INDEX[name]])

    # --- execution ------------------------------------------------------------------------
    def run(self, program: list[int], *, max_insns: int = 1_000_000) -> int:
        """Execute until ``HALT``; returns the number of instructions executed."""
        for pc, word in enumerate(program):
            if pc >= max_insns:
                raise IssError(f"program exceeded {max_insns} instructions")
            try:
                insn = decode(word)
            except IsaError as exc:
                raise IssError(f"pc {pc}: {exc}") from None
            if insn.op is Op.HALT:
                return pc + 1
            self.step(insn)
        raise IssError("program ended without HALT")

    def step(self, insn: Insn):
        if insn.op is Op.SET:
            self.regs[insn.reg] = insn.value
        elif insn.op in (Op.NOP, Op.WAIT):
            pass
        elif insn.op is Op.MATMUL:
            self._matmul()
        elif insn.op is Op.ATTN:
            exec_attention(self)
        elif insn.op is Op.VEC:
            exec_vector(self)
        elif insn.op is Op.COLL:
            exec_collective(self)
        else:
            raise IssError(f"{insn.op.name} is not implemented in the ISS yet")
        self.launches[insn.op] += 1

    def _matmul(self):
        n = self.n
        k, folds = self._reg("MM_K"), self._reg("MM_FOLDS")
        mode = OutMode(self._reg("MM_MODE"))
        a_unsigned = bool(self._reg("MM_A_UNSIGNED"))
        if k <= 0 or k % n or folds <= 0:
            raise IssError(f"MATMUL with MM_K={k} (a positive multiple of {n}) and "
                           f"MM_FOLDS={folds}")
        a_words = self._gather("RD0")
        b_words = self._gather("RD1")
        p_words = self._gather("RD2")
        if len(a_words) != folds * k or len(b_words) != folds * k:
            raise IssError(f"MATMUL reads {len(a_words)} A and {len(b_words)} B words for "
                           f"{folds} folds of {k}")
        if len(p_words) != folds * PARAM_WORDS:
            raise IssError(f"MATMUL reads {len(p_words)} parameter words for {folds} folds")
        # Transposer: each block of n words (rows) becomes n column beats.
        a = a_words.reshape(folds, k // n, n, n).transpose(0, 1, 3, 2).reshape(folds, k, n)
        a = a.astype(np.int64) if a_unsigned else a.view(np.int8).astype(np.int64)
        b = b_words.view(np.int8).astype(np.int64).reshape(folds, k, n)
        acc = np.einsum("fkr,fkc->frc", a, b)          # [fold, row, col]; exact in int64
        p = p_words.reshape(folds, PARAM_WORDS, n)
        bias = unpack_rows(p[:, 0:4].reshape(-1, n), folds, n, 4)[:, None, :]
        mult = unpack_rows(p[:, 4:6].reshape(-1, n), folds, n, 2, signed=False)[:, None, :]
        shift = p[:, 6, :].astype(np.int64)[:, None, :]
        y = bias_add(wrap(acc), bias)                    # wraps modulo 2**32, like the array
        if mode is OutMode.RAW:
            out, eb = y, 4
        else:
            eb = 1 if mode is OutMode.INT8 else 2
            if shift.min() < 1 or shift.max() > 47:
                raise IssError(f"MATMUL parameter shift {shift.min()}..{shift.max()} outside "
                               "1..47 (requantisation is unspecified there)")
            out = requant(y, mult, shift, 8 * eb)
        words = pack_rows(out.reshape(folds * n, n), eb, n)
        self._scatter("WR0", words)
