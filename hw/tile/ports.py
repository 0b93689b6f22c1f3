"""The chip's external ports, defined once for :class:`~hw.chip.Chip` and
:class:`~hw.system.ChipSystem`.

``HostSignature`` is seen from the host (the signature's outputs are the host's): a chip has
``In(HostSignature(npu))``. ``RingPortSignature`` is seen from the chip: ``tx`` leaves it for the
next chip's ``rx``.
"""

from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..layouts import ring_word_layout
from ..spec import NpuConfig
from ..spec.isa import INSN_BITS
from ..spec.ring import tag_bits
from .gearbox import words_layout
from .scratchpad import addr_layout
from .trace import entry_layout

__all__ = ["HostSignature", "RingPortSignature", "trace_depth"]


def trace_depth(npu: NpuConfig) -> int:
    """Entries of a chip's trace buffer: two per instruction, enough for any program."""
    return 2 * npu.imem_words


class HostSignature(wiring.Signature):
    """Load, run and read back one chip (used while the chip is stopped).

    Members (host's view)
    ---------------------
    imem : Out(stream) ``{addr, data}``
        Write one 64-bit instruction; the chip is always ready.
    wr : Out(stream) ``{addr, data}``
        Write one scratchpad word (``8 * word_bytes`` bits).
    rd_addr : Out(stream) ``{addr, last}``
        Read one scratchpad word ...
    rd_data : In(stream) ``{data, last}``
        ... which comes back here (the scratchpad's synchronous read latency later).
    trace_addr : Out(range(trace_depth)), trace_data : In(entry)
        Read the trace buffer (:mod:`hw.tile.trace`), one cycle latency.
    trace_count : In(range(trace_depth + 1)), trace_overflow : In(1)
    """

    def __init__(self, npu: NpuConfig):
        if not isinstance(npu, NpuConfig):
            raise TypeError(f"npu must be an NpuConfig, not {npu!r}")
        addr_bits, word_bits = npu.sram_addr_bits, 8 * npu.word_bytes
        depth = trace_depth(npu)
        super().__init__({
            "imem": Out(stream.Signature(data.StructLayout(
                {"addr": range(npu.imem_words), "data": INSN_BITS}))),
            "wr": Out(stream.Signature(data.StructLayout({"addr": addr_bits, "data": word_bits}))),
            "rd_addr": Out(stream.Signature(addr_layout(addr_bits))),
            "rd_data": In(stream.Signature(words_layout(word_bits))),
            "trace_addr": Out(range(depth)),
            "trace_data": In(entry_layout()),
            "trace_count": In(range(depth + 1)),
            "trace_overflow": In(1),
        })


class RingPortSignature(wiring.Signature):
    """A chip's ring port on one dimension: ``tx`` to the next chip's ``rx`` along it, through
    a :class:`~hw.ring.link.RingLink`. Words are :func:`hw.layouts.ring_word_layout` of
    ``word_bytes`` bytes with a routing tag of chip ids of ``chip_bits``
    (:func:`hw.spec.ring.tag_bits`)."""

    def __init__(self, word_bytes: int, chip_bits: int):
        layout = ring_word_layout(word_bytes, tag_bits=tag_bits(chip_bits))
        super().__init__({
            "tx": Out(stream.Signature(layout)),
            "rx": In(stream.Signature(layout)),
        })
