"""The chip's units as ``npu fpga --top NAME`` synthesises them, one at a time.

Most units are components of their own (``hw.tops``); two are groups that the chip builds from
several components, wrapped here so that each is one top with every port of the group:

- :class:`SequencerUnit`: the sequencer with its instruction memory (the chip's ``imem``), whose
  write port is the host's;
- :class:`AddrGenUnit`: a ring chip's address generators (``hw.spec.isa.chip_gens(1)``,
  with ``wrap`` on ``WRAP_GENS``), each with its descriptor in and its address stream out.

The table of what each unit costs on the ECP5 is in ``docs/fpga.md``.
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out, connect, flipped

from ..chip import reg_widths
from ..spec import NpuConfig
from ..spec.isa import INSN_BITS, WRAP_GENS, chip_gens
from ..tile.scratchpad import AddrGen, addr_layout, desc_layout
from ..tile.sequencer import Sequencer

__all__ = ["SequencerUnit", "AddrGenUnit"]


class SequencerUnit(wiring.Component):
    """The chip's :class:`~hw.tile.sequencer.Sequencer` (with the register widths the chip
    reads, :func:`hw.chip.reg_widths`) and its instruction memory.

    Members: the sequencer's, less ``imem_addr`` / ``imem_data``, plus ``imem_wr``: a stream of
    ``{addr, data}`` (always ready), the host's write port.
    """

    def __init__(self, *, npu: NpuConfig):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        self._npu = npu
        self.seq = Sequencer(imem_words=npu.imem_words, reg_widths=reg_widths(npu, chip_bits=1))
        members = {name: member for name, member in self.seq.signature.members.items()
                   if name not in ("imem_addr", "imem_data")}
        members["imem_wr"] = In(stream.Signature(data.StructLayout(
            {"addr": range(npu.imem_words), "data": INSN_BITS})))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.seq = seq = self.seq
        m.submodules.imem = imem = Memory(shape=INSN_BITS, depth=self._npu.imem_words, init=[])
        rd, wr = imem.read_port(), imem.write_port()
        m.d.comb += [
            rd.addr.eq(seq.imem_addr), seq.imem_data.eq(rd.data),
            wr.en.eq(self.imem_wr.valid), wr.addr.eq(self.imem_wr.payload.addr),
            wr.data.eq(self.imem_wr.payload.data), self.imem_wr.ready.eq(1),
        ]
        for name in self.signature.members:
            if name == "imem_wr":
                continue
            ours, theirs = getattr(self, name), getattr(seq, name)
            if name in ("start", "can_launch", "busy"):
                m.d.comb += theirs.eq(ours)
            elif name == "regs":
                m.d.comb += [a.eq(b) for a, b in zip(ours, theirs, strict=True)]
            else:
                m.d.comb += ours.eq(theirs)
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
