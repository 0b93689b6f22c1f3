"""Cycles of the matmul unit (``hw/tile/matmul.py``): the systolic array and the requantiser.

Plain Python, read by the gateware's docstrings, the tests and the timing model.
"""

from __future__ import annotations

__all__ = ["REQUANT_LATENCY", "array_latency", "unit_latency"]

#: Pipeline stages of the requantiser (bias add; two DSP partial products; their sum plus the
#: rounding term; shift-saturate). One more than before the FPGA flow pipelined it, and the
#: array one fewer (its output is its deskew registers): the unit's latency is unchanged.
REQUANT_LATENCY = 4


def array_latency(size: int, k: int) -> int:
    """Cycles from a lone fold's first input beat to its last output row, inclusive, on an
    N x N output-stationary array: ``K + 3N`` (skew in, K beats, drain and deskew)."""
    return k + 3 * size


def unit_latency(size: int, k: int) -> int:
    """The same for the matmul unit: the array plus the requantiser's stages."""
    return array_latency(size, k) + REQUANT_LATENCY
