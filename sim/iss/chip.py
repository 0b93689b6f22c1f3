"""The ISS of one chip: runs its program in NumPy with the hardware's integer semantics.

It executes the same 64-bit instruction words as the sequencer (``hw.spec.isa``), walks the same
address-generator descriptors (``sim.golden.scratchpad.addr_sequence``) over a byte-exact image
of the scratchpad, and computes with the golden block models, so its memory after ``HALT`` equals
the RTL's bit for bit. Units run one launch at a time here (the RTL overlaps them; a correct
program's ``WAIT``s make the order irrelevant).
"""

from __future__ import annotations

import numpy as np

from hw.spec import NpuConfig
from hw.spec.isa import ADDR_LEVELS, REG_INDEX, REGS, Insn, IsaError, Op, decode

from ..golden.scratchpad import addr_sequence
from .attention import exec_attention
from .collective import exec_collective
from .errors import IssError
from .matmul import exec_matmul
from .vector import exec_vector

__all__ = ["Iss"]


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
            exec_matmul(self)
        elif insn.op is Op.ATTN:
            exec_attention(self)
        elif insn.op is Op.VEC:
            exec_vector(self)
        elif insn.op is Op.COLL:
            exec_collective(self)
        else:
            raise IssError(f"{insn.op.name} is not implemented in the ISS yet")
        self.launches[insn.op] += 1
