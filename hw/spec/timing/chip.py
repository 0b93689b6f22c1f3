"""Pipeline constants of the chip's scratchpad and engines that the timing model reads.

Plain Python. The gateware defines each of these where it is built (``hw/tile/scratchpad.py``,
``hw/tile/vector_engine.py``, ``hw/tile/softmax.py``); ``tests/sim/iss/test_timing.py`` holds
the two in step, and the ISS's cycle model (:mod:`sim.iss.timing`) uses them.
"""

from __future__ import annotations

__all__ = ["READ_FIFO_DEPTH", "READ_LATENCY", "VEC_OUT_FIFO_DEPTH", "SOFTMAX_STAGES",
           "ATTN_DOT_CYCLES", "ATTN_PV_CYCLES"]

#: Words each scratchpad read port buffers (a read is granted only while there is room for it).
READ_FIFO_DEPTH = 4
#: Cycles from a read port's grant to its word being on the port's output.
READ_LATENCY = 2
#: Result beats the vector engine buffers between its unit and its packer.
VEC_OUT_FIFO_DEPTH = 4
#: Row stages of the softmax unit (latency ``SOFTMAX_STAGES * L / P + 1``).
SOFTMAX_STAGES = 5
#: Cycles the attention buffer's score sweep spends after taking a query before its score row
#: is offered (``W + ATTN_DOT_CYCLES``, the buffer's ``W + SCORE_LATENCY``).
ATTN_DOT_CYCLES = 5
#: Cycles from taking a probability row to offering its P.V output (``W + ATTN_PV_CYCLES``).
ATTN_PV_CYCLES = 3
