"""The chip's pipeline constants and closed forms of whole launches inside the chip.

Plain Python. The constants have their one home here (the matmul unit's in
:mod:`hw.spec.timing.matmul`): the gateware imports them, sizing its FIFOs from the depths and
checking at construction (:func:`check_built`) that the registers it builds give the latencies and
stage counts (``hw/tile/scratchpad.py``, ``hw/tile/vector_engine.py``, ``hw/tile/softmax.py``,
``hw/tile/attention.py``), and the ISS's cycle model (:mod:`sim.timing.cycle`,
:mod:`sim.timing.engines`)
is built on the same names. The closed forms give a launch's busy cycles in the chip, scratchpad
ports and all, for the bank layouts they name; ``tests/spec/timing`` checks them against the cycle
model, which equals the RTL, and the launch-level timing model (:mod:`sim.timing.launch`) uses them
where they hold.
"""

from __future__ import annotations

from ..memory import PARAM_WORDS
from ..softmax import NORM_QUOTIENT_BITS
from ..vector import VectorOp, twin_of
from ..vector_engine import row_words
from .matmul import REQUANT_LATENCY, unit_latency
from .vector import PIPELINES, check_pipeline
from .vector import latency as vector_latency

__all__ = ["check_built", "READ_FIFO_DEPTH", "READ_LATENCY", "VEC_OUT_FIFO_DEPTH", "softmax_stages",
           "softmax_divide_stages",
           "ATTN_DOT_CYCLES", "ATTN_PV_CYCLES", "ATTN_PARTIAL_CYCLES", "ATTN_REDUCED_CYCLES",
           "ATTN_STATE_ROWS", "ATTN_MERGE_CYCLES", "ATTN_NORM_CYCLES", "ATTN_PIPELINES",
           "check_attn_pipeline", "attn_out_pipe", "attn_merge_pipe", "merge_divide_bits",
           "merge_divide_cycles", "merge_rotate_cycles",
           "matmul_k_min", "matmul_cycles", "matmul_approx",
           "vector_cycles", "attention_cycles"]

#: Words each scratchpad read port buffers (a read is granted only while there is room for it).
READ_FIFO_DEPTH = 4
#: Cycles from a read port's grant to its word being on the port's output: the bank's read
#: register, then the port's FIFO.
READ_LATENCY = 2
#: Result beats the vector engine buffers between its unit and its packer.
VEC_OUT_FIFO_DEPTH = 4
#: Cycles the attention buffer's score sweep spends after taking a query before its score row
#: is offered (``W + ATTN_DOT_CYCLES``): K read, products, dot sum, requantiser, the
#: offering state.
ATTN_DOT_CYCLES = 5
#: Cycles from taking a probability row to offering its P.V output (``W + ATTN_PV_CYCLES``):
#: V read, products, the offering state.
ATTN_PV_CYCLES = 3
#: Split-score mode: cycles from taking a query to offering its partial row
#: (``W + ATTN_PARTIAL_CYCLES``: K read, products, dot sum, the offering state), and from
#: taking its reduced row to offering its score row (``W + ATTN_REDUCED_CYCLES``: requantiser,
#: the offering state).
ATTN_PARTIAL_CYCLES = 4
ATTN_REDUCED_CYCLES = 2
#: Long context (state rows): the query rows the attention engine holds in its state FIFO,
#: from a row's first RD5 word until its output has used it (a row's first word waits while
#: the FIFO holds this many).
ATTN_STATE_ROWS = 5
#: Cycles from taking a query's probabilities to its merge factors and merged ``l``: the
#: exponent ``y`` of the maxima's distance, the factors (table and shift), the merged sum.
ATTN_MERGE_CYCLES = 3
#: The last chunk's normalisation: cycles to find ``z`` and normalise ``l`` before the
#: division.
ATTN_NORM_CYCLES = 1
#: The attention engine's pipelines, the NPU file's ``attention_pipeline``: ``"short"``, its
#: output requantiser combinational from the output row register to ``o`` and the last
#: chunk's merge in 2 registers; ``"deep"``, for a faster clock, the requantiser and the state
#: words' merge in :func:`attn_out_pipe` registers before ``o`` and the last chunk's merge in
#: :func:`attn_merge_pipe`.
ATTN_PIPELINES = PIPELINES


def check_attn_pipeline(pipeline) -> str:
    """``pipeline`` if it is one of :data:`ATTN_PIPELINES`, else a ValueError naming it."""
    return check_pipeline(pipeline, key="attention_pipeline")


def attn_out_pipe(pipeline: str = "short") -> int:
    """Registers between the attention engine's output row register and its output stream
    ``o`` (WR1): 0 (``"short"``: the requantiser's multiply, shift and saturation in the
    cycle a word leaves the row), or 3 (``"deep"``: the requantiser's partial products, their
    sum shifted by the output shift, then ``o`` rounded and saturated; the state words'
    operands, their products with the merge factors, then ``o``; partial rows pass through).
    Every word reaches ``o`` this many cycles after it leaves its source, so a launch ends this
    many cycles later; the rows' throughput is the same."""
    return {"short": 0, "deep": 3}[check_attn_pipeline(pipeline)]


def attn_merge_pipe(pipeline: str = "short") -> int:
    """Pipeline registers in the last chunk's merge and normalisation of a query's state lanes,
    so that no path chains the merge's multiply, the normalisation's multiply and its shift
    (44 ns on the ECP5, the attention engine's critical path without them): 2 (``"short"``:
    the merged lanes, then their product with the reciprocal ``R``) or 5 (``"deep"``: the
    lanes read from the state FIFO's block RAM and the state register, their products with
    the merge factors, the merged lanes, their product with ``R``, its shift, rounded after
    the register). The merge takes this many cycles more than the state register's
    rotation."""
    return {"short": 2, "deep": 5}[check_attn_pipeline(pipeline)]


def softmax_stages(pipeline: str = "short") -> int:
    """Row stages of the softmax unit (``hw/tile/softmax.py``; its latency
    ``softmax_stages(pipeline) * L / P + 1``): 5 (``"short"``: maximum, log2, exp and sum,
    the reciprocal's long division, normalisation) or 6 (``"deep"``, the attention engine's
    deep pipeline: the long division over :func:`softmax_divide_stages` = 2 stages, at most
    2 subtract-compare steps a cycle at ``L / P`` = 4 beats). Each stage holds a row for
    ``L / P`` cycles, so a stage more is ``L / P`` cycles more per row through the unit."""
    return 4 + softmax_divide_stages(pipeline)


def softmax_divide_stages(pipeline: str = "short") -> int:
    """Row stages the softmax's long division spans: 1 (``"short"``) or 2 (``"deep"``)."""
    return {"short": 1, "deep": 2}[check_attn_pipeline(pipeline)]


def merge_divide_bits(window: int) -> int:
    """Quotient bits per cycle of the last chunk's reciprocal ``2**(z+16) // l``
    (``NORM_QUOTIENT_BITS`` = 17 bits), so that it fits the P.V sweep: ``ceil(17 / (W - 2))``
    (17 for ``W <= 3``)."""
    return -(-NORM_QUOTIENT_BITS // max(1, window - 2))


def merge_divide_cycles(window: int) -> int:
    """Cycles of that division: ``ceil(17 / merge_divide_bits(W))``."""
    return -(-NORM_QUOTIENT_BITS // merge_divide_bits(window))


def merge_rotate_cycles(d_head: int, size: int, pipeline: str = "short") -> int:
    """Cycles the last chunk's merge and normalisation take per query: N/4 int32 lanes a
    cycle over the ``D + 2`` lanes of the engine's state register (``D = d_head_max``), then
    the pipeline's :func:`attn_merge_pipe`: ``ceil(4 (D + 2) / N) + 2`` (``"short"``) or
    ``+ 5`` (``"deep"``)."""
    return -(-4 * (d_head + 2) // size) + attn_merge_pipe(pipeline)


def check_built(name: str, value: int, built: int, what: str, where: str) -> None:
    """Raise :class:`ValueError` unless the gateware at ``where`` builds ``built`` (a count of
    ``what``) equal to ``value``, the timing constant ``name`` it was given: a latency or stage
    count fixed by the registers a unit builds, which the timing models read from the
    constant."""
    if value != built:
        raise ValueError(f"{name}={value} (hw/spec/timing) is not the {built} {what} that "
                         f"{where} builds: the timing models would not match the gateware")


def _matmul_stall(size: int, out_words: int) -> int:
    """Cycles the array waits per fold while the packer writes ``o`` words per row: ``o - 1``
    for each row of a tile beyond the ``REQUANT_LATENCY`` the requantiser's stages absorb."""
    return max(0, size - REQUANT_LATENCY) * (out_words - 1)


def _matmul_drain(size: int, out_words: int) -> int:
    """Fill and drain of a ``MATMUL`` launch: ``4N + 6 + min(N, 4)(o - 1)``: 2 cycles of read
    latency, N words into the transposer, the unit's latency (skew, shift-out, deskew,
    requantiser: :func:`hw.spec.timing.matmul.unit_latency`), the last tile's rows in the
    requantiser written ``o`` words each."""
    return (READ_LATENCY + size + unit_latency(size, 0)
            + min(size, REQUANT_LATENCY) * (out_words - 1))


def matmul_k_min(size: int, out_words: int) -> int:
    """Smallest K (of the multiples of N) for which :func:`matmul_cycles` holds: ``N + 7``
    (``N + 15`` for int32 output, ``4N + 3`` when N < 4 too). Below it either the next fold's
    parameters (``PARAM_WORDS`` words, gathered only once the current fold's last row has
    entered the requantiser) arrive after the fold's first output row, or that row reaches the
    requantiser before the previous fold's rows in it have been written out (its stages move on
    one enable, so the row waits behind them) and the array stalls."""
    absorbed = min(size, REQUANT_LATENCY) * (out_words - 1)
    return max(size + PARAM_WORDS, size + absorbed + REQUANT_LATENCY - 1)


def matmul_cycles(size: int, k: int, folds: int, out_words: int) -> int:
    """Busy cycles of a ``MATMUL`` launch in the chip (from the cycle after the launch to the
    cycle the unit and its generators are idle) when A, B and the parameters stream from
    three different banks and ``k >= matmul_k_min``.

    ``folds * (k + s) + 4N + 6 + min(N, 4)(o - 1)`` with ``o`` words per output row and
    ``s = max(0, N - 4)(o - 1)``: a fold takes its K beats, plus the cycles the array waits
    while the packer writes ``o`` words per row (the requantiser's four stages,
    ``REQUANT_LATENCY``, absorb four rows of a tile, the others wait ``o - 1`` cycles each);
    ``4N + 6 + min(N, 4)(o - 1)`` is the fill (2 cycles of read latency, N words into the
    transposer) and drain (skew, shift-out, deskew, requantiser, the last tile's rows)."""
    return folds * (k + _matmul_stall(size, out_words)) + _matmul_drain(size, out_words)


def matmul_approx(size: int, k: int, folds: int, out_words: int, *, shared: bool) -> int:
    """An estimate of a ``MATMUL`` launch's busy cycles outside :func:`matmul_cycles`'s domain
    (measured on the cycle model for N = 2 to 16; within a few cycles per fold):

    - ``k < matmul_k_min``: a fold takes at least ``N + 7 + s`` cycles (the next fold's
      parameters are gathered once the current fold's last row is in the requantiser) and at
      least ``N o + 1`` (the packer writes the tile's N rows of ``o`` words);
    - ``shared`` (A and the parameters in one bank, the A stream first): each fold after the
      first waits ``N + 6`` cycles for its parameters.
    """
    stall = _matmul_stall(size, out_words)
    period = k + stall
    if k < matmul_k_min(size, out_words):
        period = max(period, size + PARAM_WORDS + stall, size * out_words + 1)
    cycles = folds * period + _matmul_drain(size, out_words)
    if shared:
        cycles += (folds - 1) * (size + 6) + 5
    return cycles


def vector_cycles(op, engine_cycles: int, *, rows: int, length: int, lanes: int, flags,
                  shared: bool, outputs_shared: bool = False, pipeline: str = "short") -> int:
    """Busy cycles of a ``VEC`` launch in the chip from the engine's own
    (:func:`hw.spec.timing.vector.launch_cycles`, every word at once): plus the read latency
    when every stream has a bank of its own.

    ``shared``: operands A and B in one bank, whose port serves one of them per cycle (A
    first): an element-wise op then streams ``W_a + W_b`` words per row through it
    (``rows (W_a + W_b) + L + 2 + w_dl`` when that is its slowest stream, L the unit's
    :func:`hw.spec.timing.vector.latency` of ``pipeline``); LayerNorm reads A and B
    in separate passes and loses one cycle (when it has more than one row; none with the deep
    pipeline, whose longer rsqrt leaves the bank free for the next row's A).
    ``outputs_shared``: LayerNorm's two outputs (``data`` and ``q``) in one bank: one cycle.
    RMSNorm's ops are LayerNorm's (:func:`hw.spec.vector.twin_of`).
    """
    op = twin_of(op)
    cycles = engine_cycles + READ_LATENCY
    if op in (VectorOp.LN, VectorOp.LN_APPLY) and outputs_shared:
        cycles += 1
    if not shared:
        return cycles
    if op is VectorOp.LN:
        # The deep pipeline's longer rsqrt leaves the bank time for the next row's A.
        return cycles + (rows > 1 and pipeline == "short")
    wa = row_words(length, flags.a_bytes, lanes)
    wb = row_words(length, flags.b_bytes, lanes)
    if op is VectorOp.LN_APPLY:
        return cycles + rows * min(wa, wb)
    beats = -(-length // lanes)
    wd = row_words(length, flags.d_bytes, lanes) if flags.wr_data else 0
    last = min(flags.d_bytes, wd - (beats - 1) * flags.d_bytes) if wd else 1
    lat = vector_latency(pipeline)
    return max(engine_cycles, rows * (wa + wb) + lat + 2 + last) + READ_LATENCY


#: :func:`attention_cycles`, a preload of K rows of 2 words and V rows of 1 through one bank:
#: the cycles its last key's load ends behind ``keys`` (by ``keys mod 4``; the read ports'
#: ``READ_FIFO_DEPTH`` = 4 words let K's port run up to two rows ahead of V's).
_K2V1_LAG = (0, 1, 2, 1)


def attention_cycles(engine_cycles: int, *, keys: int, words, shared: bool,
                     interleaved: bool = False, halo: int = 0) -> int:
    """Busy cycles of an ``ATTN`` launch in the chip from the engine's own
    (:func:`hw.spec.timing.attention.launch_cycles`, every word at once): plus the read
    latency. ``words``: words per row of every stream, or ``{"k", "v", "q"}`` per stream
    (heads at lane offsets, :func:`hw.spec.attention.launch_words`). ``shared``: K, V and Q in
    one bank (one tensor, as the compiler stores them), whose port serves one of them per
    cycle. A preload launch then loads each key's K and V words one after the other,
    ``keys * min(w_k, w_v) + w_q - 1`` more cycles (``keys * w + w - 1`` when they are
    equal; K rows of 2 words and V rows of 1: ``keys + max(w_q - 1, lag)``, the lag 0, 1, 2,
    1 for ``keys mod 4`` = 1, 2, 3, 0: the read FIFOs' depth; measured against the cycle model
    for rows of 1 to 4 words); an interleaved one loses ``(halo + 4) * w + 7`` (the halo keys
    load that way too, then the ports prefetch each key's words while the previous query
    runs; equal words only: ValueError otherwise)."""
    if isinstance(words, int):
        words = {"k": words, "v": words, "q": words}
    kw, vw, qw = words["k"], words["v"], words["q"]
    extra = 0
    if shared and interleaved:
        if not kw == vw == qw:
            raise ValueError(f"no closed form of an interleaved launch with rows of {kw}, {vw} "
                             f"and {qw} words in one bank")
        extra = (halo + 4) * kw + 7
    elif shared:
        tail = qw - 1
        if (kw, vw) == (2, 1):
            tail = max(tail, _K2V1_LAG[(keys - 1) % 4])
        extra = keys * min(kw, vw) + tail
    return engine_cycles + READ_LATENCY + extra
