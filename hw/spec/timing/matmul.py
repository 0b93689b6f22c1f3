"""Cycles of the matmul unit (``hw/tile/matmul.py``): the systolic array and the requantiser.

Plain Python, read by the gateware's docstrings, the tests and the timing model.
"""

from __future__ import annotations

__all__ = ["REQUANT_LATENCY", "ARRAY_ROW_DELAY", "array_row_delay", "array_latency",
           "unit_latency"]

#: Pipeline stages of the requantiser (bias add; two DSP partial products; their sum, shifted
#: keeping the bit below the result by the shift's multiple of 8; the rest of the shift,
#: rounding and saturation), each a register on the requantiser's own enable. One more than
#: before the FPGA flow pipelined it, and the array one fewer (its output is its deskew
#: registers): a lone fold's latency through the unit is unchanged, but a row that waits at
#: the requantiser's input (for its tile's parameters) now has four stages, not three, ahead.
REQUANT_LATENCY = 4

#: Enabled cycles of the array from a fold's last beat being taken to row 0 of its tile on
#: the array's output, beyond ``2 * size`` (skew in and drain): the column load and the
#: deskew, which is the output register.
ARRAY_ROW_DELAY = 1


def array_row_delay(size: int) -> int:
    """Enabled cycles of an N x N array from taking a fold's last beat to row 0 of its tile on
    ``o`` (row ``r`` follows ``r`` enabled cycles later): ``2N + 1``."""
    return 2 * size + ARRAY_ROW_DELAY


def array_latency(size: int, k: int) -> int:
    """Cycles from a lone fold's first input beat to its last output row, inclusive, on an
    N x N output-stationary array: ``K + 3N`` (skew in, K beats, drain and deskew)."""
    return (k - 1) + array_row_delay(size) + (size - 1) + 1


def unit_latency(size: int, k: int) -> int:
    """The same for the matmul unit: the array plus the requantiser's stages."""
    return array_latency(size, k) + REQUANT_LATENCY
