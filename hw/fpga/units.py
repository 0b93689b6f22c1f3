"""The chip's units as ``npu fpga --top NAME`` synthesises them, one at a time.

Most units are components of their own (``hw.tops``); two are groups that the chip builds from
several components, wrapped here so that each is one top with every port of the group:

- :class:`SequencerUnit`: the sequencer, whose instruction memory's write port is the host's;
  as ``--top sequencer`` builds it, its register file leaves as a registered parity fold
  (``fold_bits``), so that the serial shell stays small enough to route;
- :class:`AddrGenUnit`: a ring chip's address generators (``hw.spec.isa.chip_gens(1)``,
  with ``wrap`` on ``WRAP_GENS``), each with its descriptor in and its address stream out.

The table of what each unit costs on the ECP5 is in ``docs/fpga.md``.
"""

from __future__ import annotations

from functools import reduce
from operator import xor

from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..chip import reg_widths
from ..spec import NpuConfig
from ..spec.isa import WRAP_GENS, chip_gens
from ..tile.scratchpad import AddrGen, addr_layout, desc_layout
from ..tile.sequencer import Sequencer

__all__ = ["SequencerUnit", "AddrGenUnit", "SEQ_FOLD_BITS"]

#: ``regs_fold`` bits of the sequencer as ``npu fpga --top sequencer`` builds it.
SEQ_FOLD_BITS = 64


class SequencerUnit(wiring.Component):
    """The chip's :class:`~hw.tile.sequencer.Sequencer` (with the register widths the chip
    reads, :func:`hw.chip.reg_widths`), with its instruction memory.

    Members: the sequencer's (``imem_wr``: a stream of ``{addr, data}``, always ready, the
    host's write port), less ``insn`` (the chip's collective reads one bit of it).

    ``fold_bits`` (default None: ``regs`` as the sequencer's): ``regs`` is replaced by
    ``regs_fold``, ``Out(fold_bits)``. The stored bits of every register (its ``reg_widths``
    low bits, 2,706 on the ulx3s preset, instead of 183 x 48 sign-extended port bits) are taken
    four at a time, each group's XOR into a flip-flop (one LUT between a register and a
    flip-flop, as the chip's launch copies a register into a unit), and bit ``k`` of
    ``regs_fold`` is the XOR of the groups ``j`` with ``j % fold_bits == k``. Every register bit
    reaches an output through XORs only, so synthesis keeps every register and the logic
    that writes it; the serial shell shifts out ``fold_bits`` bits instead of 8,784.
    """

    def __init__(self, *, npu: NpuConfig, fold_bits: int | None = None):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        if fold_bits is not None and (not isinstance(fold_bits, int) or fold_bits < 1):
            raise ValueError(f"fold_bits must be a positive integer or None, not {fold_bits!r}")
        self._npu = npu
        self._fold_bits = fold_bits
        self._widths = reg_widths(npu, chip_bits=1)
        self.seq = Sequencer(imem_words=npu.imem_words, reg_widths=self._widths)
        members = {name: member for name, member in self.seq.signature.members.items()
                   if name != "insn"}
        if fold_bits is not None:
            del members["regs"]
            members["regs_fold"] = Out(fold_bits)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.seq = seq = self.seq
        for name in self.signature.members:
            if name == "regs_fold":
                continue
            if name == "imem_wr":
                connect(m, flipped(self.imem_wr), seq.imem_wr)
                continue
            ours, theirs = getattr(self, name), getattr(seq, name)
            if name in ("start", "can_launch", "busy"):
                m.d.comb += theirs.eq(ours)
            elif name == "regs":
                m.d.comb += [a.eq(b) for a, b in zip(ours, theirs, strict=True)]
            else:
                m.d.comb += ours.eq(theirs)
        if self._fold_bits is not None:
            bits = Cat(*(r[:w] for r, w in zip(seq.regs, self._widths, strict=True)))
            groups = [Signal(name=f"fold{j}") for j in range((len(bits) + 3) // 4)]
            m.d.sync += [g.eq(bits[4 * j:4 * j + 4].xor()) for j, g in enumerate(groups)]
            m.d.comb += [self.regs_fold[k].eq(reduce(xor, groups[k::self._fold_bits]))
                         for k in range(min(self._fold_bits, len(groups)))]
        return m


class AddrGenUnit(wiring.Component):
    """The chip's address generators: ``gen_<name>`` (``gen_rd0`` ... ``gen_wr4``) is
    ``{"i": descriptor stream in, "o": address stream out}`` of one
    :class:`~hw.tile.scratchpad.AddrGen`, with ``wrap`` on the generators that have it."""

    def __init__(self, *, npu: NpuConfig):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        self._ab = npu.sram_addr_bits
        super().__init__({
            f"gen_{name.lower()}": Out(wiring.Signature({
                "i": In(stream.Signature(desc_layout(self._ab, wrap=name in WRAP_GENS))),
                "o": Out(stream.Signature(addr_layout(self._ab)))}))
            for name in sum(chip_gens(1), ())})

    def elaborate(self, platform):
        m = Module()
        for name in sum(chip_gens(1), ()):
            gen = AddrGen(addr_bits=self._ab, wrap=name in WRAP_GENS)
            m.submodules[f"gen_{name.lower()}"] = gen
            port = getattr(self, f"gen_{name.lower()}")
            connect(m, flipped(port.i), gen.i)
            connect(m, gen.o, flipped(port.o))
        return m
