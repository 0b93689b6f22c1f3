"""Exportable top-level designs, by name (``npu export --top NAME``).

Each entry builds a :class:`amaranth.lib.wiring.Component` from an :class:`~hw.spec.NpuConfig`
(and a chip count where it matters). Later blocks register themselves here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .chip import Chip
from .fpga.board import DEFAULT_BAUD, PE_DSP, BoardTop, baud_divisor
from .fpga.uart import HostLink
from .fpga.units import SEQ_FOLD_BITS, AddrGenUnit, SequencerUnit
from .ring.collective import CollectiveEngine
from .ring.router import Router
from .ring.testbed import RingTestbed
from .spec import NpuConfig
from .spec.attention import softmax_lanes
from .spec.isa import COLL_FIFO_WORDS, chip_gens
from .spec.topology import chip_bits
from .system import ChipNode, ChipSystem
from .tile.attention import AttentionBuffer
from .tile.attention_engine import AttentionEngine
from .tile.matmul import MatmulUnit
from .tile.matmul_engine import MatmulEngine
from .tile.ports import trace_depth
from .tile.scratchpad import Scratchpad
from .tile.softmax import SoftmaxUnit
from .tile.trace import TraceBuffer
from .tile.vector import VectorUnit
from .tile.vector_engine import VectorEngine

__all__ = ["Top", "TOPS", "build_top"]


@dataclass(frozen=True)
class Top:
    name: str
    description: str
    build: Callable[[NpuConfig, int], object] | None  # None: not built yet
    default_chips: int = 1  # chip count when ``--chips`` is not given
    #: What ``npu fpga`` builds instead of ``build`` (None: the same): the collective engines
    #: without AVG's divider, which synth_ecp5 cannot synthesise (``CollectiveEngine``'s ``avg``),
    #: and the matmul array's products in DSPs (``hw.fpga.board.PE_DSP``).
    build_fpga: Callable[[NpuConfig, int], object] | None = None


def _matmul(npu: NpuConfig, chips: int):
    return MatmulUnit(size=npu.array_size)


def _matmul_fpga(npu: NpuConfig, chips: int):
    return MatmulUnit(size=npu.array_size, pe_dsp=PE_DSP)


def _softmax(npu: NpuConfig, chips: int):
    # As the attention engine builds it: softmax_lanes(L) lanes per cycle, its pipeline.
    return SoftmaxUnit(length=npu.softmax_len, lanes_per_cycle=softmax_lanes(npu.softmax_len),
                       pipeline=npu.attention_pipeline)


def _attention(npu: NpuConfig, chips: int):
    return AttentionBuffer(window=npu.attn_window, d_head=npu.d_head_max, length=npu.softmax_len,
                           pipeline=npu.attention_pipeline)


def _ring(npu: NpuConfig, chips: int):
    return RingTestbed(npu=npu, chips=chips)


def _ring_fpga(npu: NpuConfig, chips: int):
    return RingTestbed(npu=npu, chips=chips, avg=False)


def _vector(npu: NpuConfig, chips: int):
    return VectorUnit(lanes=npu.vector_lanes, d_model_max=npu.d_model_max,
                      pipeline=npu.vector_pipeline)


def _vector_fpga(npu: NpuConfig, chips: int):
    return VectorUnit(lanes=npu.vector_lanes, d_model_max=npu.d_model_max,
                      pipeline=npu.vector_pipeline, ecp5_dsp=True)


def _sequencer(npu: NpuConfig, chips: int):
    # The register file leaves folded: 64 port bits instead of 183 x 48 (docs/fpga.md).
    return SequencerUnit(npu=npu, fold_bits=SEQ_FOLD_BITS)


def _scratchpad(npu: NpuConfig, chips: int):
    # A ring chip's ports: one per address generator (less the second collective engine's,
    # which only a torus's chip has) and the host's.
    reads, writes = chip_gens(1)
    return Scratchpad(words=npu.sram_words, banks=npu.sram_banks, word_bytes=npu.word_bytes,
                      read_ports=len(reads) + 1, write_ports=len(writes) + 1)


def _addrgen(npu: NpuConfig, chips: int):
    return AddrGenUnit(npu=npu)


def _matmul_engine(npu: NpuConfig, chips: int):
    return MatmulEngine(size=npu.array_size)


def _matmul_engine_fpga(npu: NpuConfig, chips: int):
    return MatmulEngine(size=npu.array_size, pe_dsp=PE_DSP)


def _attention_engine(npu: NpuConfig, chips: int):
    return AttentionEngine.for_npu(npu)


def _vector_engine(npu: NpuConfig, chips: int):
    return VectorEngine(lanes=npu.array_size, d_model_max=npu.d_model_max,
                        pipeline=npu.vector_pipeline)


def _vector_engine_fpga(npu: NpuConfig, chips: int):
    return VectorEngine(lanes=npu.array_size, d_model_max=npu.d_model_max,
                        pipeline=npu.vector_pipeline, ecp5_dsp=True)


def _collective(npu: NpuConfig, chips: int):
    # As a chip of a ring of ``chips`` builds it: groups of up to 2**chip_bits chips.
    return CollectiveEngine(link_bytes=npu.link_bytes_per_cycle, fifo_words=COLL_FIFO_WORDS,
                            max_count=1 << chip_bits(chips))


def _collective_fpga(npu: NpuConfig, chips: int):
    return CollectiveEngine(link_bytes=npu.link_bytes_per_cycle, fifo_words=COLL_FIFO_WORDS,
                            avg=False, max_count=1 << chip_bits(chips))


def _router(npu: NpuConfig, chips: int):
    # A ring's router (one dimension, one collective engine), chip ids of chip_bits(chips).
    return Router(word_bytes=npu.ring_word_bytes, chip_bits=chip_bits(chips))


def _trace(npu: NpuConfig, chips: int):
    return TraceBuffer(depth=trace_depth(npu))


def _hostlink(npu: NpuConfig, chips: int):
    return HostLink(npu=npu, divisor=baud_divisor(npu.clock_mhz, DEFAULT_BAUD))


def _tile(npu: NpuConfig, chips: int):
    return Chip(npu=npu)


def _tile_fpga(npu: NpuConfig, chips: int):
    return Chip(npu=npu, coll_avg=False, pe_dsp=PE_DSP, ecp5_dsp=True)


def _node_links(npu: NpuConfig):
    """The links leaving a node of the NPU's ``[topology]`` (one per dimension: a torus's node
    has two), or None: a ring's node with the NPU's ``link_*``."""
    topo = npu.topology
    if topo is None or not (topo.is_torus or topo.links):
        return None
    return tuple(topo.link(d, npu) for d in range(len(topo.dims)))


def _node(npu: NpuConfig, chips: int):
    return ChipNode(npu=npu, links=_node_links(npu))


def _node_fpga(npu: NpuConfig, chips: int):
    return ChipNode(npu=npu, coll_avg=False, pe_dsp=PE_DSP, links=_node_links(npu),
                    ecp5_dsp=True)


def _system(npu: NpuConfig, chips: int):
    return ChipSystem(npu=npu, chips=chips)


def _system_fpga(npu: NpuConfig, chips: int):
    return ChipSystem(npu=npu, chips=chips, coll_avg=False)


def _board(npu: NpuConfig, chips: int):
    return BoardTop(npu=npu, divisor=baud_divisor(npu.clock_mhz, DEFAULT_BAUD))


TOPS: dict[str, Top] = {
    "matmul": Top("matmul", "systolic int8 matmul array with bias and requantisation", _matmul,
                  build_fpga=_matmul_fpga),
    "softmax": Top("softmax", "fixed-length softmax unit", _softmax),
    "attention": Top("attention", "windowed attention buffer", _attention),
    "vector": Top("vector", "vector unit (LayerNorm, GELU, residual, requant)",
                  _vector, build_fpga=_vector_fpga),
    # The chip's units as the chip builds them (npu fpga --top NAME --synth-only: one row of
    # the resource table in docs/fpga.md).
    "sequencer": Top("sequencer", "sequencer with its instruction memory and registers",
                     _sequencer),
    "scratchpad": Top("scratchpad", "scratchpad banks with the chip's read and write ports",
                      _scratchpad),
    "addrgen": Top("addrgen", "the chip's address generators", _addrgen),
    "matmul_engine": Top("matmul_engine", "matmul unit with its transposer and sequencing",
                         _matmul_engine, build_fpga=_matmul_engine_fpga),
    "attention_engine": Top("attention_engine", "attention buffer, softmax and requantiser",
                            _attention_engine),
    "vector_engine": Top("vector_engine", "vector unit with its word streams and sequencing",
                         _vector_engine, build_fpga=_vector_engine_fpga),
    "collective": Top("collective", "collective engine with its ring buffers", _collective,
                      build_fpga=_collective_fpga),
    "router": Top("router", "ring router (collective, point-to-point, clear-to-send)", _router),
    "trace": Top("trace", "busy trace buffer", _trace),
    "hostlink": Top("hostlink", "UART host link protocol engine (board top)", _hostlink),
    "ring": Top("ring", "chips' collective engines on the ring, each with a stream DMA", _ring,
                default_chips=4, build_fpga=_ring_fpga),
    "tile": Top("tile", "one NPU chip (sequencer, scratchpad, units, host port)", _tile,
                build_fpga=_tile_fpga),
    "node": Top("node", "one chip with its outgoing ring links, one per dimension of the NPU's "
                "[topology] (the Verilator backend's unit)",
                _node, build_fpga=_node_fpga),
    "system": Top("system", "N chips on the ring", _system, default_chips=2,
                  build_fpga=_system_fpga),
    "board": Top("board", "one chip on the ULX3S-85F board top (PLL, UART host link, LEDs)",
                 _board),
}


def build_top(name: str, npu: NpuConfig, chips: int | None = None, *, fpga: bool = False):
    """Build top ``name``; raise KeyError for an unknown one, NotImplementedError if not built.

    ``chips=None`` takes the top's ``default_chips``; a bad count raises ValueError. ``fpga``:
    the top as ``npu fpga`` builds it (``Top.build_fpga``).
    """
    top = TOPS[name]
    if top.build is None:
        raise NotImplementedError(f"--top {name} ({top.description}) is not built yet")
    build = top.build_fpga if fpga and top.build_fpga is not None else top.build
    return build(npu, top.default_chips if chips is None else chips)
