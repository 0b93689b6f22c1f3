"""Cycles of the vector unit (``hw/tile/vector.py``) and of one ``VEC`` launch in the vector
engine (``hw/tile/vector_engine.py``), with every input word valid and every output word ready.

Plain Python: the gateware, the tests and the ISS's timing model read the same formulas.
"""

from __future__ import annotations

from ..vector import GELU16_KNOTS, LUT_ENTRIES, RSQRT_NEWTON_STEPS, VectorOp, twin_of
from ..vector_engine import (
    LOAD_OPS,
    VecFlags,
    record_words,
    row_beats,
    row_words,
    table_entries,
    uses_b,
)

__all__ = ["PIPELINES", "check_pipeline", "latency", "rsqrt_cycles", "stats_cycles",
           "op_cycles", "launch_cycles"]

#: The vector unit's pipelines, the NPU file's ``vector_pipeline``: ``"short"``, each of its
#: four steps a product, its rounding shift and its clamp in one cycle; ``"deep"``, for a
#: faster clock, every product in a register (in the DSPs' outputs), then its shift, then the
#: rounding and the clamp, each in a cycle of its own, and the beat statistics of LN_STATS and
#: LayerNorm registered before they are added up.
PIPELINES = ("short", "deep")


def check_pipeline(pipeline, key: str = "vector_pipeline") -> str:
    """``pipeline`` if it is one of :data:`PIPELINES`, else a ValueError naming the NPU file's
    ``key`` (the attention engine's ``attention_pipeline`` has the same two choices)."""
    if pipeline not in PIPELINES:
        raise ValueError(f"{key}={pipeline!r} is not one of "
                         f"{', '.join(map(repr, PIPELINES))}")
    return pipeline


def latency(pipeline: str = "short") -> int:
    """Pipeline stages from an input beat's transfer to its output beat's transfer: 4 (a
    product, its rounding shift and its clamp per cycle), 13 with the ``deep`` pipeline (step
    0: the operands, their partial products, their sum; step 1: the partial products of
    t * Y, their sum, the shift, the rounding and clamp; steps 2 and 3: the product, the shift,
    the rounding and clamp)."""
    return 13 if check_pipeline(pipeline) == "deep" else 4


def rsqrt_cycles(pipeline: str = "short") -> int:
    """Cycles the LayerNorm spends between its statistics and its first normalised beat.

    ``short``: D = n*S2 - S1^2, normalisation + table seed, then 3 multiplies per Newton step
    (one cycle each): 8. ``deep``: three cycles for the last beat's statistics, the partial
    products of n*S2 and S1^2, their sums, D, D's bit length, the normalised m, the seed, then
    per Newton step each of its 3 multiplies in two cycles (partial products; their sum,
    shifted, and the next multiply's subtraction): 9 + 6 per step = 21.
    """
    if check_pipeline(pipeline) == "deep":
        return 9 + 6 * RSQRT_NEWTON_STEPS
    return 2 + 3 * RSQRT_NEWTON_STEPS


def stats_cycles(pipeline: str = "short") -> int:
    """Cycles between the last beat of LN_STATS or ARGMAX (not ARGMAX combining records) and
    its record: 1, 4 with the ``deep`` pipeline (a beat's statistics take four registered
    steps: its lanes; their squares, sum and maximum; the squares' sum, S1 and the running
    maximum; S2)."""
    return 4 if check_pipeline(pipeline) == "deep" else 1


def op_cycles(op: VectorOp, length: int, lanes: int, *, pairs: bool = False,
              pipeline: str = "short") -> int:
    """Cycles from the ``i_cmd`` transfer to the last output transfer (LOAD_LUT, LOAD_LUT16:
    last input).

    With every input valid and every output ready. B = ceil(length / lanes) beats,
    L = :func:`latency` (the pipeline depth) and R = :func:`rsqrt_cycles` of ``pipeline``:
    element-wise ops (GELU16 included) B + L, LN
    2B + R + L, LN_STATS and ARGMAX B + :func:`stats_cycles`, LN_APPLY B + R + L + 1,
    ONEHOT B + L + 1 (its record, then B generated beats), ARGMAX with ``pairs`` length + 1
    (one record per cycle), LOAD_LUT ceil(256 / lanes),
    LOAD_LUT16 ceil(257 / lanes): never dependent on the data. The
    pipeline is not drained between commands: the next command is accepted the cycle after
    the last input beat, so back-to-back element-wise vectors take B + 1 cycles each.
    RMS and RMS_APPLY take LN's and LN_APPLY's cycles (:func:`hw.spec.vector.twin_of`).
    """
    op = twin_of(op)
    lat, rsqrt = latency(pipeline), rsqrt_cycles(pipeline)
    b = -(-length // lanes)
    if op is VectorOp.LOAD_LUT:
        return -(-LUT_ENTRIES // lanes)
    if op is VectorOp.LOAD_LUT16:
        return -(-GELU16_KNOTS // lanes)
    if op is VectorOp.LN:
        return 2 * b + rsqrt + lat
    if op is VectorOp.LN_APPLY:
        return b + rsqrt + lat + 1
    if op is VectorOp.ARGMAX and pairs:
        return length + 1
    if op in (VectorOp.LN_STATS, VectorOp.ARGMAX):
        return b + stats_cycles(pipeline)
    if op is VectorOp.ONEHOT:
        return b + lat + 1
    return b + lat


def _beat_words(words: int, per_beat: int, beats: int) -> list[int]:
    """Words of each beat of a row: ``per_beat`` each, the rest in the last one."""
    return [min(per_beat, words - k * per_beat) for k in range(beats)]


def launch_cycles(op, *, rows: int, length: int, lanes: int, flags: VecFlags,
                  pipeline: str = "short") -> int:
    """Cycles from the ``i_cfg`` transfer to the launch's last output word transfer (LOAD_LUT,
    LOAD_LUT16: to the last cycle of ``busy``), with every input word valid and every output
    word ready.

    Per row: B = ``ceil(length / lanes)`` beats; W_a, W_b, W_d words of A, B and data (W_b = 0
    when the op does not read B, W_d = 0 unless ``wr_data``); each beat takes ``e_x`` =
    element-bytes words of stream x (the last beat the rest); w0 = the larger of A's and B's
    first-beat words; w_dl = the last beat's data words (1 if only ``q`` is written);
    L = :func:`latency` and R_s = :func:`rsqrt_cycles` of ``pipeline`` (4 and 8 ``short``).

    - element-wise ops (ADD, BIAS, REQUANT, RELU, LUT, GELU16)::

          max(rows * W_a + L + 2 + t_a,  rows * W_b + L + 2 + t_b,
              rows * (B + 1) + L + w0 + t_1,  rows * W_d + L + 2 + w0)

      i.e. a row period of max(W_a, W_b, W_d, B + 1): the slowest stream (one word per cycle)
      or the unit (one beat per cycle plus one cycle per command); ``t_x = max_k(sum_{j>=k}
      o_j - sum_{j>k} x_j)`` is the writer's backlog after the last row's last beat when its
      beats arrive x_j cycles apart (a_j, b_j: their words; 1: the unit's rate), o_j the
      output words of beat j: w_dl, unless a short last beat follows one with more output
      words than it has input words (int32 in, int16 out, a last beat of one word);
    - LN: ``rows * (W_a - w_a0 + W_b - w_b0 + 3 + R_s) + L + w_a0 + t`` where w_x0
      are the first beat's words and ``t = max_k(sum_{j>=k} o_j - sum_{j>k} b_j)`` over the
      row's beats k, with b_j the words of B beat j and o_j = max(data words, q words) of
      output beat j. A row is serial in the unit: one cycle for the command, the statistics
      pass (A beats; the first one was fetched during the previous row), R_s, the
      normalisation pass (B beats; the first one prefetched likewise); results drain while
      the next row starts, ``t`` being the packer's backlog after the last beat (valid for
      ``b_bytes >= d_bytes``, as :func:`sim.compiler.vector_launch.ln_launch` emits);
    - LN_STATS and ARGMAX (R = words of their record: a statistics record, an argmax record):
      ``max(rows * (W_a - w_a0 + 2 + S) + w_a0 - 1 + R, rows * (R + 1) + S + W_a)`` with S =
      :func:`stats_cycles` (1 ``short``, 2 ``deep``): a row is one cycle for the command, the
      pass over A and S cycles to emit the record, which is written as R words while the next
      row runs;
    - ARGMAX with ``pairs`` (k = ``length`` argmax records of R words per row, read through
      RD5): ``rows * k * (R + 1) + (rows - 1) * max(0, 2 - R) + R + 1``: a record every R + 1
      cycles (its words, then the cycle the unit takes it), and between rows the command and the
      emitted record, 2 cycles, of which the next record's words hide R;
    - ONEHOT (R = words of an argmax record, read through RD5; no A): with g = max(2, R + 1)
      the cycle the first record is taken and P = max(B + 2, R + 1) the row period,
      ``max(g + (rows - 1) * P + L + 2 + t, rows * W_d + L + 2 + g)`` with the last row's
      backlog
      ``t = max_k(k + sum_{j>=k} o_j)`` (o_j the output words of beat j): a row is one cycle for
      the command, one to take its record (the next one is read meanwhile, R words after the
      previous one was taken) and B generated beats, one per cycle; or the data words, one per
      cycle;
    - LN_APPLY: ``rows * (sum_{k>=1} c_k + 3 + R_s) + R + L + t`` with
      c_k = max(A words, B words) of beat k (A and B beats are taken together) and ``t`` as
      for LN with c_j in place of b_j; the next row's record (R <= 8 words) is read during
      the current row;
    - LOAD_LUT, LOAD_LUT16 (the 256 or 257 table entries, B beats and W_a words per row):
      ``max(rows * W_a + 2, rows * (B + 1) + 1)``: the unit takes one cycle per command and
      one per beat, the words arrive one per cycle (the next row's first word is gathered
      during the command cycle); LOAD_LUT of int8 entries is ``rows * (256 / lanes + 1) + 1``,
      LOAD_LUT16 of int16 knots ``rows * W_a + 2``.

    RMS and RMS_APPLY are LN and LN_APPLY (:func:`hw.spec.vector.twin_of`).
    """
    op = twin_of(op)
    lat, rsqrt = latency(pipeline), rsqrt_cycles(pipeline)
    length = table_entries(op) or length
    beats = row_beats(op, length, lanes)
    wa = row_words(length, flags.a_bytes, lanes)
    if op in LOAD_OPS:
        return max(rows * wa + 2, rows * (beats + 1) + 1)
    wb = row_words(length, flags.b_bytes, lanes) if uses_b(op, flags.per_channel) else 0
    wd = row_words(length, flags.d_bytes, lanes) if flags.wr_data else 0
    rec = record_words(op, lanes)
    if op is VectorOp.ARGMAX and flags.pairs:
        return rows * length * (rec + 1) + (rows - 1) * max(0, 2 - rec) + rec + 1
    if op is VectorOp.ONEHOT:
        o = [max(d, 1) for d in _beat_words(wd, flags.d_bytes, beats)] if wd else [1] * beats
        g = max(2, rec + 1)
        tail = max(k + sum(o[k:]) for k in range(beats))
        return max(g + (rows - 1) * max(beats + 2, rec + 1) + lat + 2 + tail,
                   rows * wd + lat + 2 + g)
    a_beats = _beat_words(wa, flags.a_bytes, beats)
    b_beats = _beat_words(wb, flags.b_bytes, beats) if wb else [0] * beats
    d_beats = _beat_words(wd, flags.d_bytes, beats) if wd else [0] * beats
    o_beats = [max(d, int(flags.wr_q)) for d in d_beats]
    if op in (VectorOp.LN_STATS, VectorOp.ARGMAX):
        emit = stats_cycles(pipeline)
        return max(rows * (wa - a_beats[0] + 2 + emit) + a_beats[0] - 1 + rec,
                   rows * (rec + 1) + emit + wa)
    if op is VectorOp.LN_APPLY:
        # The normalisation pass takes A and B beats together.
        c_beats = [max(x, y) for x, y in zip(a_beats, b_beats, strict=True)]
        tail = max(sum(o_beats[k:]) - sum(c_beats[k + 1:]) for k in range(beats))
        return rows * (sum(c_beats[1:]) + 3 + rsqrt) + rec + lat + tail
    if op is VectorOp.LN:
        tail = max(sum(o_beats[k:]) - sum(b_beats[k + 1:]) for k in range(beats))
        period = wa - a_beats[0] + wb - b_beats[0] + 3 + rsqrt
        return rows * period + lat + a_beats[0] + tail
    w0 = max(a_beats[0], b_beats[0])

    def tail(period):
        # The writer's backlog after the last beat that arrived ``period`` apart.
        return max(sum(o_beats[k:]) - sum(period[k + 1:]) for k in range(beats))

    return max(rows * wa + lat + 2 + tail(a_beats),
               rows * wb + lat + 2 + tail(b_beats) if wb else 0,
               rows * (beats + 1) + lat + w0 + tail([1] * beats), rows * wd + lat + 2 + w0)


