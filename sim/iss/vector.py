"""The ``VEC`` launch in the instruction-set simulator, at word level.

Same semantics as :class:`hw.tile.vector_engine.VectorEngine`: ``VU_ROWS`` commands of the
vector unit (:class:`sim.golden.vector.VectorUnitModel`), one per row of ``VU_LEN`` elements;
operand A words from RD3 (every op but ONEHOT), operand B words from RD4 (only for the ops that
read B), records from RD5 (statistics: LN_APPLY, RMS_APPLY; an argmax record: ONEHOT),
``data`` words to WR1 (if ``wr_data``), ``q`` words (the LayerNorm and RMSNorm ops' int8
output, GELU16's low byte) or records (statistics: LN_STATS; argmax: ARGMAX) to WR2 (if
``wr_q``); see ``docs/isa.md``, VEC.
The activation LUT and the GELU16 table are chip state: they live on the :class:`~sim.iss.Iss`
as ``vector_unit`` (created on first use, with the unit's reset contents).
"""

from __future__ import annotations

import numpy as np

from hw.spec import vector_engine as engine
from hw.spec.memory import pack_rows, unpack_rows
from hw.spec.vector import (
    GELU16_G_MAX,
    GELU16_G_MIN,
    VectorCmd,
    VectorOp,
    pack_argmax,
    twin_of,
    unpack_argmax,
)

from ..golden.matmul import wrap
from ..golden.vector import VectorUnitModel, unpack_requant
from .errors import IssError

__all__ = ["exec_vector", "vector_unit"]


def vector_unit(iss) -> VectorUnitModel:
    """The chip's vector unit model (its LUT persists across launches)."""
    unit = getattr(iss, "vector_unit", None)
    if unit is None:
        unit = VectorUnitModel()
        iss.vector_unit = unit
    return unit


def _rows(iss, gen: str, rows: int, length: int, eb: int, what: str) -> np.ndarray:
    words = iss._gather(gen)
    want = rows * engine.row_words(length, eb, iss.n)
    if len(words) != want:
        raise IssError(f"VEC {what} via {gen} walks {len(words)} words, but {rows} rows of "
                       f"{length} x {eb}-byte elements are {want} words")
    return unpack_rows(words, rows, length, eb)


def exec_vector(iss):
    """Execute one ``VEC`` launch on ``iss`` (registers as set by the program)."""
    r = iss._reg
    try:
        op = VectorOp(r("VU_OP"))
    except ValueError:
        raise IssError(f"VEC with VU_OP={r('VU_OP')}: not a vector-unit op") from None
    try:
        flags = engine.VecFlags.decode(r("VU_FLAGS"))
    except ValueError as exc:
        raise IssError(f"VEC: {exc}") from None
    like = twin_of(op)             # RMS and RMS_APPLY are checked as LN and LN_APPLY
    rows, length = r("VU_ROWS"), r("VU_LEN")
    if not 1 <= rows < 1 << 16:
        raise IssError(f"VEC with VU_ROWS={rows}: must be in 1..65535")
    if op in engine.LOAD_OPS:
        entries = engine.table_entries(op)
        if length != entries:
            raise IssError(f"VEC {op.name} with VU_LEN={length}: must be {entries}")
        if flags.wr_data or flags.wr_q:
            raise IssError(f"VEC {op.name} writes nothing: clear wr_data and wr_q in VU_FLAGS")
    elif like is VectorOp.LN and not 1 <= length <= iss.npu.d_model_max:
        raise IssError(f"VEC {op.name} with VU_LEN={length}: must be in 1..{iss.npu.d_model_max} "
                       "(d_model_max, the unit's buffer)")
    elif not 1 <= length < 1 << 16:
        raise IssError(f"VEC with VU_LEN={length}: must be in 1..65535")
    ln = like in (VectorOp.LN, VectorOp.LN_APPLY)
    if op in engine.RECORD_OUT_OPS:
        what = "statistics" if op is VectorOp.LN_STATS else "records"
        if flags.wr_data or not flags.wr_q:
            raise IssError(f"VEC {op.name} writes its {what} through WR2: set wr_q and clear "
                           "wr_data in VU_FLAGS")
    elif op not in engine.LOAD_OPS and not (flags.wr_data or flags.wr_q):
        raise IssError(f"VEC {op.name} writes nothing: set wr_data and/or wr_q in VU_FLAGS")
    if flags.wr_q and op not in engine.Q_OPS and op not in engine.RECORD_OUT_OPS:
        raise IssError(f"VEC {op.name} has no q output: clear wr_q in VU_FLAGS")
    pairs = engine.combines(op, flags.pairs)
    if flags.pairs and op is not VectorOp.ARGMAX:
        raise IssError(f"VEC {op.name} has no pair mode: clear pairs in VU_FLAGS")
    if pairs and r("VU_N") != 0:
        raise IssError(f"VEC ARGMAX pairs with VU_N={r('VU_N')}: must be 0 (the records hold "
                       "global indices)")
    if op is VectorOp.ARGMAX and not pairs and flags.a_bytes > 2:
        raise IssError(f"VEC ARGMAX compares int16 elements: a_bytes must be 1 or 2, not "
                       f"{flags.a_bytes}")
    if op is VectorOp.GELU16 and not GELU16_G_MIN <= r("VU_SHIFT") <= GELU16_G_MAX:
        raise IssError(f"VEC GELU16 with VU_SHIFT={r('VU_SHIFT')}: the knot spacing g must be "
                       f"in {GELU16_G_MIN}..{GELU16_G_MAX}")
    if op in engine.STATS_IN_OPS and not 1 <= r("VU_N") < 1 << 16:
        raise IssError(f"VEC {op.name} with VU_N={r('VU_N')}: must be in 1..65535 (the count "
                       "over all chips)")
    needs_shift = ln or op is VectorOp.MUL or (op is VectorOp.REQUANT
                                               and not flags.per_channel)
    if needs_shift and not 1 <= r("VU_SHIFT") <= 47:
        raise IssError(f"VEC {op.name} with VU_SHIFT={r('VU_SHIFT')}: must be in 1..47")
    try:
        cmd = VectorCmd(op, length, n=r("VU_N"), mult=r("VU_MULT"), shift=r("VU_SHIFT"),
                        gshift=r("VU_GSHIFT"), out16=flags.out16,
                        per_channel=flags.per_channel, pairs=flags.pairs)
    except ValueError as exc:
        raise IssError(f"VEC: {exc}") from None

    a = [None] * rows
    if engine.uses_a(op, flags.pairs):
        a = _rows(iss, "RD3", rows, length, flags.a_bytes, "operand A")
    b = None
    if engine.uses_b(op, flags.per_channel):
        b = _rows(iss, "RD4", rows, length, flags.b_bytes, "operand B")
        if op is VectorOp.REQUANT:
            shifts = unpack_requant(b)[1]
            if shifts.min() < 1 or shifts.max() > 47:
                bad = np.argwhere((shifts < 1) | (shifts > 47))[0]
                raise IssError(f"VEC REQUANT per-channel shift {shifts[tuple(bad)]} at row "
                               f"{bad[0]} element {bad[1]} outside 1..47")
    stats = [None] * rows
    if op in engine.STATS_IN_OPS:
        rec = engine.stats_words(iss.n)
        words = iss._gather("RD5")
        if len(words) != rows * rec:
            raise IssError(f"VEC {op.name} statistics via RD5 walk {len(words)} words, but "
                           f"{rows} records are {rows * rec} words")
        raw = np.ascontiguousarray(words.reshape(rows, rec * iss.n)[:, :engine.STATS_BYTES])
        pairs = raw.view("<i8").astype(np.int64)
        stats = [(int(s1), int(s2)) for s1, s2 in pairs]
    elif op is VectorOp.ONEHOT or pairs:
        rec = engine.record_words(op, iss.n)
        per_row = length if pairs else 1
        words = iss._gather("RD5")
        if len(words) != rows * per_row * rec:
            raise IssError(f"VEC {op.name} records via RD5 walk {len(words)} words, but "
                           f"{rows * per_row} argmax records are {rows * per_row * rec} words")
        index, value = unpack_argmax(words.reshape(rows, per_row, rec, iss.n))
        stats = [list(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(index, value,
                                                                                strict=True)]
        if not pairs:
            stats = [s[0] for s in stats]
    unit = vector_unit(iss)
    outs = [unit.execute(cmd, a[row], None if b is None else b[row], stats[row])
            for row in range(rows)]
    if op in engine.LOAD_OPS:
        return
    if op is VectorOp.LN_STATS:
        rec = engine.stats_words(iss.n)
        out = np.zeros((rows, rec * iss.n), np.uint8)
        pairs = np.array([o["stats"] for o in outs], dtype="<i8")
        out[:, :engine.STATS_BYTES] = pairs.view(np.uint8).reshape(rows, engine.STATS_BYTES)
        iss._scatter("WR2", out.reshape(rows * rec, iss.n))
        return
    if op is VectorOp.ARGMAX:
        index, value = np.array([o["record"] for o in outs], dtype=np.int64).T
        iss._scatter("WR2", pack_argmax(index, value, iss.n).reshape(-1, iss.n))
        return
    if flags.wr_data:
        d = wrap(np.stack([o["data"] for o in outs]), 8 * flags.d_bytes)
        words = pack_rows(d, flags.d_bytes, iss.n)
        mask = None
        if flags.keep:
            # The bytes of a row's last word past the row are left as they are.
            rw = len(words) // rows
            mask = np.zeros((rows, rw * iss.n), bool)
            mask[:, :length * flags.d_bytes] = True
            mask = mask.reshape(rows * rw, iss.n)
        iss._scatter("WR1", words, mask=mask)
    if flags.wr_q:
        iss._scatter("WR2", pack_rows(np.stack([o["q"] for o in outs]), 1, iss.n))
