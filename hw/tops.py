"""Exportable top-level designs, by name (``npu export --top NAME``).

Each entry builds a :class:`amaranth.lib.wiring.Component` from an :class:`~hw.spec.NpuConfig`
(and a chip count where it matters). Later blocks register themselves here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .chip import Chip
from .fpga.board import DEFAULT_BAUD, BoardTop, baud_divisor
from .ring.testbed import RingTestbed
from .spec import NpuConfig
from .system import ChipNode, ChipSystem
from .tile.attention import AttentionBuffer
from .tile.matmul import MatmulUnit
from .tile.softmax import SoftmaxUnit
from .tile.vector import VectorUnit

__all__ = ["Top", "TOPS", "build_top"]


@dataclass(frozen=True)
class Top:
    name: str
    description: str
    build: Callable[[NpuConfig, int], object] | None  # None: not built yet
    default_chips: int = 1  # chip count when ``--chips`` is not given
    #: What ``npu fpga`` builds instead of ``build`` (None: the same): the collective engines
    #: without AVG's divider, which synth_ecp5 cannot synthesise (``CollectiveEngine``'s ``avg``).
    build_fpga: Callable[[NpuConfig, int], object] | None = None


def _matmul(npu: NpuConfig, chips: int):
    return MatmulUnit(size=npu.array_size)


def _softmax(npu: NpuConfig, chips: int):
    return SoftmaxUnit(length=npu.softmax_len)


def _attention(npu: NpuConfig, chips: int):
    return AttentionBuffer(window=npu.attn_window, d_head=npu.d_head_max, length=npu.softmax_len)


def _ring(npu: NpuConfig, chips: int):
    return RingTestbed(npu=npu, chips=chips)


def _ring_fpga(npu: NpuConfig, chips: int):
    return RingTestbed(npu=npu, chips=chips, avg=False)


def _vector(npu: NpuConfig, chips: int):
    return VectorUnit(lanes=npu.vector_lanes, d_model_max=npu.d_model_max)


def _tile(npu: NpuConfig, chips: int):
    return Chip(npu=npu)


def _tile_fpga(npu: NpuConfig, chips: int):
    return Chip(npu=npu, coll_avg=False)


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
    return ChipNode(npu=npu, coll_avg=False, links=_node_links(npu))


def _system(npu: NpuConfig, chips: int):
    return ChipSystem(npu=npu, chips=chips)


def _system_fpga(npu: NpuConfig, chips: int):
    return ChipSystem(npu=npu, chips=chips, coll_avg=False)


def _board(npu: NpuConfig, chips: int):
    return BoardTop(npu=npu, divisor=baud_divisor(npu.clock_mhz, DEFAULT_BAUD))


TOPS: dict[str, Top] = {
    "matmul": Top("matmul", "systolic int8 matmul array with bias and requantisation", _matmul),
    "softmax": Top("softmax", "fixed-length softmax unit", _softmax),
    "attention": Top("attention", "windowed attention buffer", _attention),
    "vector": Top("vector", "vector unit (LayerNorm, GELU, residual, requant)",
                  _vector),
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
