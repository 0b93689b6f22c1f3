"""Attention buffer: a K/V ring of W tokens, score rows for the softmax unit, and P.V.

Golden model: ``sim.golden.attention`` (bit-exact).
"""

from amaranth.hdl import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..arith import lut_product, saturate, tree_sum
from ..layouts import lanes_layout
from ..spec.attention import POS_BITS
from ..spec.formats import ACC_BITS, MULT_BITS, OPERAND_BITS, PROB_BITS, SCORE_BITS, SHIFT_BITS
from ..spec.timing.chip import (
    ATTN_DOT_CYCLES,
    ATTN_PARTIAL_CYCLES,
    ATTN_PV_CYCLES,
    ATTN_REDUCED_CYCLES,
    check_attn_pipeline,
    check_built,
)

__all__ = ["AttentionBuffer", "kv_layout", "q_layout", "raw_layout", "scores_layout",
           "probs_layout", "out_layout"]

# The pipeline registers behind each sweep (see the class docstring), named in the order a lane
# passes them. A result is offered one cycle after its last lane leaves them (the FSM's state
# register); the fixed overheads on top of the W-cycle sweeps are the timing constants of
# hw.spec.timing.chip, checked against these at construction.
_DOT_STAGES = ("K read", "products", "dot sum")     # v1, v2, v3
_REQUANT_STAGES = ("requantiser",)                  # va
_PV_STAGES = ("V read", "products")                 # pv1, pv2


def kv_layout(d_head):
    """``i_kv``: K in ``data[0:D]``, V in ``data[D:2D]``, absolute ``pos``, ``first``."""
    return lanes_layout(signed(OPERAND_BITS), 2 * d_head, pos=unsigned(POS_BITS), first=1)


def q_layout(d_head):
    """``i_q``: Q lanes, absolute ``pos``, score scaling ``(mult, shift)``, mode bits."""
    return lanes_layout(signed(OPERAND_BITS), d_head, pos=unsigned(POS_BITS),
                        mult=unsigned(MULT_BITS), shift=unsigned(SHIFT_BITS), bidir=1, split=1)


def raw_layout(length):
    """``o_partial`` / ``i_reduced``: raw int32 scores, one per lane."""
    return lanes_layout(signed(ACC_BITS), length)


def scores_layout(length):
    """``o_scores``: the softmax unit's input row (signed 16-bit scores and a visibility mask)."""
    return lanes_layout(signed(SCORE_BITS), length, mask=data.ArrayLayout(1, length))


def probs_layout(length):
    """``i_probs``: the softmax unit's output row (unsigned 8-bit, p/256)."""
    return lanes_layout(unsigned(PROB_BITS), length)


def out_layout(d_head):
    """``o_out``: raw int32 P.V sums, one per head dimension."""
    return lanes_layout(signed(ACC_BITS), d_head)


class AttentionBuffer(wiring.Component):
    """K/V ring buffer of ``window`` tokens with causal-window masking, score rows and P.V.

    Parameters (keyword-only)
    -------------------------
    window : int
        W, tokens held (``attn_window``), >= 1.
    d_head : int
        D, lanes of Q, K, V (``d_head_max``), >= 1. A head with fewer dimensions (or one shard
        of a head in split-score mode) puts its lanes first and **zeros in the others** of Q.
    length : int
        L, lanes of the score/probability rows (``softmax_len``), >= W.

    Storage and lane mapping
    ------------------------
    K (with the token's absolute position) and V live in two ``lib.memory.Memory`` of W words
    (``D`` int8 lanes each), filled as a ring **in write order**: a token whose ``first`` bit is
    set restarts the ring (goes to slot 0 and drops every other slot), the next goes to slot 1,
    and so on; after W writes the oldest slot is overwritten. **Lane j of a score or probability
    row is slot j**; lanes ``W .. L-1`` are always masked (and 0). Softmax and P.V do not depend
    on the order of the keys, so lanes need not follow positions.

    Masking, against absolute positions (unsigned ``POS_BITS`` bits; a chunk's position base is
    simply the position of its first token): lane j is visible to a query at position ``i`` when
    slot j has been written since the last restart and, in causal mode, ``i - W < pos_j <= i``;
    in bidirectional mode (``i_q.bidir``) every held slot is visible. Halo injection: a chip
    writes its neighbour's K/V (positions below its chunk base, e.g. ``base-W+1 .. base-1``)
    through ``i_kv`` first (the first of them with ``first`` set), then its own tokens.

    Ports
    -----
    i_kv : In(stream), ``lanes_layout(signed(8), 2*D, pos=unsigned(POS_BITS), first=1)``
        One token: ``data[0:D]`` = K, ``data[D:2D]`` = V, ``pos`` its absolute position,
        ``first`` restarts the ring. Accepted in one cycle, only while no query is in flight
        (from its ``i_q`` transfer to its ``o_out`` transfer), so a query's scores and its P.V
        see the same keys and values. A token and a query transferred in the same cycle: the
        token is written first. Ordering between ``i_kv`` and ``i_q`` is otherwise the producer's
        (the sequencer's): typically write token t, then query t.
    i_q : In(stream), ``lanes_layout(signed(8), D, pos=unsigned(POS_BITS), mult=unsigned(16),
            shift=unsigned(SHIFT_BITS), bidir=1, split=1)``
        One query: Q lanes, its absolute position, the score scaling ``(mult, shift)`` (shift in
        1..47, not checked), ``bidir`` (bidirectional mask) and ``split`` (split-score mode).
        ``last`` is copied to the query's ``o_partial``, ``o_scores`` and ``o_out``.
    o_partial : Out(stream), ``lanes_layout(signed(32), L)``
        Split-score mode only: the raw int32 partial scores ``q . k_j`` of this chip's lanes
        (lanes >= W are 0; masked lanes carry their raw value too).
    i_reduced : In(stream), ``lanes_layout(signed(32), L)``
        Split-score mode only: the reduced (summed over the shards, wrapping) int32 scores.
        Lanes >= W are ignored.
    o_scores : Out(stream), ``lanes_layout(signed(16), L, mask=ArrayLayout(1, L))``
        The score row for the softmax unit: ``requant(raw, mult, shift, 16)`` exactly as
        ``sim.golden.matmul.requant`` (round half up, saturate) on visible lanes, 0 on masked
        lanes; ``mask[j]`` = 1 visible. Scores are signed 16-bit with ``SCORE_FRAC_BITS``
        fraction bits when the compiler folds 1/sqrt(d_head), the Q/K scales and 2**8 into
        ``(mult, shift)``.
    i_probs : In(stream), ``lanes_layout(unsigned(8), L)``
        The probability row (p/256) of the oldest query whose scores were sent. Probabilities
        on masked lanes (and lanes >= W) are ignored (treated as 0).
    o_out : Out(stream), ``lanes_layout(signed(32), D)``
        ``sum_j p_j * v_j[d]`` over visible lanes, unsigned 8-bit x int8 products summed in
        int32 (wrapping); raw, not requantised (the next unit requantises).

    Datapath and timing
    -------------------
    Two dedicated datapaths of D multipliers each: the score sweep reads one K slot per cycle
    (D int8 x int8 MACs and an adder tree, then one requantiser), the P.V sweep reads one V slot
    per cycle (D unsigned-8 x int8 MACs into D int32 accumulators). Each sweep takes W cycles
    plus a fixed pipeline overhead; with every stream ready (transfer-to-transfer):

    - normal query: ``i_q`` -> ``o_scores`` in ``W + ATTN_DOT_CYCLES`` (= W + 5) cycles;
    - split query: ``i_q`` -> ``o_partial`` in ``W + ATTN_PARTIAL_CYCLES`` (= W + 4),
      ``i_reduced`` -> ``o_scores`` in ``W + ATTN_REDUCED_CYCLES`` (= W + 2) (the requantiser
      sweeps the row);
    - ``i_probs`` -> ``o_out`` in ``W + ATTN_PV_CYCLES`` (= W + 3).

    The constants are :mod:`hw.spec.timing.chip`'s: one cycle per pipeline register of the
    sweep (K read, products, dot sum, requantiser; V read, products) and one for the state that
    offers the result. The constructor refuses constants that do not match these registers.

    The sweeps use different memories, so the score sweep of the next query overlaps the P.V
    sweep of the previous one. Per query, with a softmax that answers the cycle after the score
    row (each cycle it takes longer adds one):

    - back-to-back queries (no K/V write between them: bidirectional attention, or queries over
      already loaded keys): ``W + ATTN_DOT_CYCLES + 1`` (= W + 6) cycles; ideal W (two D-wide MAC
      arrays, W*D MACs each);
    - interleaved causal prefill or decode (write token t, query t): the write of token t+1
      overwrites a key that query t sees, so it waits for query t's ``o_out``:
      ``2W + ATTN_DOT_CYCLES + ATTN_PV_CYCLES + 3`` (= 2W + 11) cycles per token; ideal 2W.

    A finished score row waits in the unit while the probabilities of the previous row are
    outstanding (one row in the softmax at a time). ``last`` on ``i_reduced`` and ``i_probs``
    is ignored. After reset the ring is empty (every lane masked).

    ``pipeline`` (``"short"``, default, or ``"deep"``: the NPU file's ``attention_pipeline``)
    changes no cycle: with ``"deep"`` the requantiser's operand is a 2:1 choice between
    registers (the dot sum, or lane 0 of the raw row, which rotates one lane a cycle through
    the reduced row's sweep, selected by a flag register) instead of the score FSM's choice
    between the dot sum and a W-way multiplexer of the raw row, so that no path runs from
    the FSM's state through a wide multiplexer into the multiplier; the score's clamp to 16
    bits is by bit tests (``hw.arith.saturate``), not two compares.
    """

    def __init__(self, *, window, d_head, length, pipeline="short"):
        for name, value in (("window", window), ("d_head", d_head), ("length", length)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an integer, not {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, not {value!r}")
        if length < window:
            raise ValueError(f"length={length} must be >= window={window}: each key slot "
                             f"needs a lane of the score row")
        if window > 1 << POS_BITS:
            raise ValueError(f"window={window} exceeds the {POS_BITS}-bit position range")
        for name, value, stages in (
                ("ATTN_DOT_CYCLES", ATTN_DOT_CYCLES, _DOT_STAGES + _REQUANT_STAGES),
                ("ATTN_PARTIAL_CYCLES", ATTN_PARTIAL_CYCLES, _DOT_STAGES),
                ("ATTN_REDUCED_CYCLES", ATTN_REDUCED_CYCLES, _REQUANT_STAGES),
                ("ATTN_PV_CYCLES", ATTN_PV_CYCLES, _PV_STAGES)):
            check_built(name, value, len(stages) + 1,
                        f"cycles ({', '.join(stages)}, the offering state)",
                        "hw/tile/attention.py")
        self._window, self._d_head, self._length = window, d_head, length
        self._pipeline = check_attn_pipeline(pipeline)
        super().__init__({
            "i_kv": In(stream.Signature(kv_layout(d_head))),
            "i_q": In(stream.Signature(q_layout(d_head))),
            "o_partial": Out(stream.Signature(raw_layout(length))),
            "i_reduced": In(stream.Signature(raw_layout(length))),
            "o_scores": Out(stream.Signature(scores_layout(length))),
            "i_probs": In(stream.Signature(probs_layout(length))),
            "o_out": Out(stream.Signature(out_layout(d_head))),
        })

    @property
    def window(self):
        return self._window

    @property
    def d_head(self):
        return self._d_head

    @property
    def length(self):
        return self._length

    def elaborate(self, platform):
        m = Module()
        W, D, L = self._window, self._d_head, self._length
        i8 = signed(OPERAND_BITS)

        m.submodules.kmem = kmem = Memory(
            shape=data.StructLayout({"k": data.ArrayLayout(i8, D), "pos": unsigned(POS_BITS)}),
            depth=W, init=[])
        m.submodules.vmem = vmem = Memory(shape=data.ArrayLayout(i8, D), depth=W, init=[])
        k_wr, k_rd = kmem.write_port(), kmem.read_port()
        v_wr, v_rd = vmem.write_port(), vmem.read_port()

        # --- ring state --------------------------------------------------------------------
        wptr = Signal(range(W))     # next slot to write
        full = Signal()             # every slot held (wrapped at least once since the restart)

        # --- unit-level handshake state ------------------------------------------------------
        score_idle = Signal()       # comb, from the FSMs below
        pv_idle = Signal()
        pv_full = Signal()          # scores sent, probabilities not yet received
        all_idle = score_idle & pv_idle & ~pv_full

        # --- K/V writes -----------------------------------------------------------------------
        kv = self.i_kv.payload
        m.d.comb += self.i_kv.ready.eq(all_idle)
        slot = Mux(kv.first, 0, wptr)
        m.d.comb += [
            k_wr.addr.eq(slot), v_wr.addr.eq(slot),
            k_wr.data.pos.eq(kv.pos),
            k_wr.en.eq(self.i_kv.valid & all_idle), v_wr.en.eq(self.i_kv.valid & all_idle),
        ]
        for d in range(D):
            m.d.comb += [k_wr.data.k[d].eq(kv.data[d]), v_wr.data[d].eq(kv.data[D + d])]
        with m.If(self.i_kv.valid & all_idle):
            with m.If(slot == W - 1):
                m.d.sync += [wptr.eq(0), full.eq(1)]
            with m.Else():
                m.d.sync += [wptr.eq(slot + 1), full.eq(full & ~kv.first)]

        # --- score side ----------------------------------------------------------------------
        q = Signal(data.ArrayLayout(i8, D))
        qpos = Signal(POS_BITS)
        mult = Signal(MULT_BITS)
        shift = Signal(SHIFT_BITS)
        bidir, split, qlast = Signal(), Signal(), Signal()
        raw_row = Signal(data.ArrayLayout(signed(ACC_BITS), L))
        score_row = Signal(data.ArrayLayout(signed(SCORE_BITS), L))
        mask_row = Signal(L)

        issuing = Signal()          # the sweep counter `j` is running
        in_dot = Signal()           # comb: the sweep reads K (not the requantiser-only sweep)
        j = Signal(range(W))
        # stage 1: K slot read; stage 2: products and mask; stage 3: raw dot product
        v1, v2, v3 = Signal(), Signal(), Signal()
        l1, l2, l3 = Signal(range(W)), Signal(range(W)), Signal(range(W))
        prods = Signal(data.ArrayLayout(signed(2 * OPERAND_BITS), D))
        m2, m3 = Signal(), Signal()
        raw3 = Signal(signed(ACC_BITS))
        # requantiser: stage A = raw * mult + rounding; its result is written the cycle after
        rq_v, rq_l, rq_raw = Signal(), Signal(range(W)), Signal(signed(ACC_BITS))
        va, la = Signal(), Signal(range(W))
        pa = Signal(signed(ACC_BITS + MULT_BITS + 2))
        deep = self._pipeline == "deep"
        if deep:
            rq_row = Signal()       # the requantiser sweeps the raw row (REQUANT)
            m.d.comb += rq_raw.eq(Mux(rq_row, raw_row[0], raw3))

        m.d.comb += [k_rd.addr.eq(j), k_rd.en.eq(1)]
        m.d.sync += [v1.eq(issuing & in_dot), l1.eq(j)]
        with m.If(issuing):
            m.d.sync += j.eq(j + 1)
            with m.If(j == W - 1):
                m.d.sync += [issuing.eq(0), j.eq(0)]

        # The slot's visibility: its distance from the query in stage 2 (one subtractor after
        # the block RAM's output), the window's compares on that register in stage 3.
        held = full | (l1 < wptr)
        diff2 = Signal(signed(POS_BITS + 1))
        bidir2 = Signal()
        m.d.sync += [v2.eq(v1), l2.eq(l1), m2.eq(held), bidir2.eq(bidir),
                     diff2.eq(qpos - k_rd.data.pos)]
        for d in range(D):
            m.d.sync += prods[d].eq(lut_product(q[d], k_rd.data.k[d], m=m, name=f"qk{d}"))
        in_window = (diff2 >= 0) & (diff2 < W)
        m.d.sync += [v3.eq(v2), l3.eq(l2), m3.eq(m2 & (bidir2 | in_window)),
                     raw3.eq(tree_sum((prods[d] for d in range(D)), m=m, name="dot"))]
        with m.If(v3):
            m.d.sync += [raw_row[l3].eq(raw3), mask_row.bit_select(l3, 1).eq(m3)]

        rounding = (Const(1, 1) << shift) >> 1
        m.d.sync += [va.eq(rq_v), la.eq(rq_l), pa.eq(rq_raw * mult + rounding)]
        shifted = pa >> shift
        lo, hi = -(1 << (SCORE_BITS - 1)), (1 << (SCORE_BITS - 1)) - 1
        if deep:
            # The clamp by bit tests, not two carry chains as long as the shifted product.
            score = saturate(m, shifted, SCORE_BITS, "rq_score")
        else:
            score = Mux(shifted < lo, lo, Mux(shifted > hi, hi, shifted[:SCORE_BITS]))
        with m.If(va):
            m.d.sync += score_row[la].eq(score)

        # P.V-side hand-off: the mask and `last` of a query whose scores were sent.
        pv_mask = Signal(L)
        pv_last = Signal()

        m.d.comb += [self.o_partial.payload.data.eq(raw_row),
                     self.o_partial.payload.last.eq(qlast),
                     self.o_scores.payload.last.eq(qlast)]
        for lane in range(L):
            m.d.comb += [
                self.o_scores.payload.data[lane].eq(Mux(mask_row[lane], score_row[lane], 0)),
                self.o_scores.payload.mask[lane].eq(mask_row[lane]),
            ]

        with m.FSM(name="score"):
            with m.State("IDLE"):
                m.d.comb += [self.i_q.ready.eq(1), score_idle.eq(1)]
                with m.If(self.i_q.valid):
                    p = self.i_q.payload
                    m.d.sync += [q.eq(p.data), qpos.eq(p.pos), mult.eq(p.mult),
                                 shift.eq(p.shift), bidir.eq(p.bidir), split.eq(p.split),
                                 qlast.eq(p.last), issuing.eq(1), j.eq(0)]
                    m.next = "DOT"
            with m.State("DOT"):
                m.d.comb += [in_dot.eq(1), rq_v.eq(v3 & ~split), rq_l.eq(l3)]
                if not deep:
                    m.d.comb += rq_raw.eq(raw3)
                with m.If(split & v3 & (l3 == W - 1)):
                    m.next = "PARTIAL"
                with m.If(~split & va & (la == W - 1)):
                    m.next = "SCORES"
            with m.State("PARTIAL"):
                m.d.comb += self.o_partial.valid.eq(1)
                with m.If(self.o_partial.ready):
                    m.next = "REDUCED"
            with m.State("REDUCED"):
                m.d.comb += self.i_reduced.ready.eq(1)
                with m.If(self.i_reduced.valid):
                    for lane in range(W):
                        m.d.sync += raw_row[lane].eq(self.i_reduced.payload.data[lane])
                    m.d.sync += [issuing.eq(1), j.eq(0)]
                    if deep:
                        m.d.sync += rq_row.eq(1)
                    m.next = "REQUANT"
            with m.State("REQUANT"):
                # Sweep the reduced row through the requantiser, one lane per cycle (the K
                # reads that `j` addresses meanwhile are ignored: `in_dot` is low).
                m.d.comb += [rq_v.eq(issuing), rq_l.eq(j)]
                if deep:
                    # Lane j is in lane 0 after j rotations; W of them restore the row.
                    with m.If(issuing):
                        m.d.sync += [raw_row[lane].eq(raw_row[(lane + 1) % W])
                                     for lane in range(W)]
                else:
                    m.d.comb += rq_raw.eq(raw_row[j])
                with m.If(va & (la == W - 1)):
                    if deep:
                        m.d.sync += rq_row.eq(0)
                    m.next = "SCORES"
            with m.State("SCORES"):
                m.d.comb += self.o_scores.valid.eq(~pv_full)
                with m.If(~pv_full & self.o_scores.ready):
                    m.d.sync += [pv_full.eq(1), pv_mask.eq(mask_row), pv_last.eq(qlast)]
                    m.next = "IDLE"

        # --- P.V side ------------------------------------------------------------------------
        probs = Signal(data.ArrayLayout(unsigned(PROB_BITS), W))
        out_acc = Signal(data.ArrayLayout(signed(ACC_BITS), D))
        out_last = Signal()
        pv_issuing = Signal()
        pj = Signal(range(W))
        pv1, pv2 = Signal(), Signal()
        pl1, pl2 = Signal(range(W)), Signal(range(W))
        vprods = Signal(data.ArrayLayout(signed(PROB_BITS + OPERAND_BITS), D))

        m.d.comb += [v_rd.addr.eq(pj), v_rd.en.eq(1)]
        m.d.sync += [pv1.eq(pv_issuing), pl1.eq(pj), pv2.eq(pv1), pl2.eq(pl1)]
        with m.If(pv_issuing):
            m.d.sync += pj.eq(pj + 1)
            with m.If(pj == W - 1):
                m.d.sync += [pv_issuing.eq(0), pj.eq(0)]
        for d in range(D):
            m.d.sync += vprods[d].eq(lut_product(v_rd.data[d], probs[pl1], m=m, name=f"pv{d}"))
            with m.If(pv2):
                m.d.sync += out_acc[d].eq(out_acc[d] + vprods[d])

        m.d.comb += [self.o_out.payload.data.eq(out_acc), self.o_out.payload.last.eq(out_last)]
        with m.FSM(name="pv"):
            with m.State("IDLE"):
                m.d.comb += [pv_idle.eq(1), self.i_probs.ready.eq(pv_full)]
                with m.If(pv_full & self.i_probs.valid):
                    for lane in range(W):
                        m.d.sync += probs[lane].eq(
                            Mux(pv_mask[lane], self.i_probs.payload.data[lane], 0))
                    m.d.sync += [pv_full.eq(0), out_last.eq(pv_last), pv_issuing.eq(1),
                                 pj.eq(0), out_acc.eq(0)]
                    m.next = "SWEEP"
            with m.State("SWEEP"), m.If(pv2 & (pl2 == W - 1)):
                m.next = "OUT"
            with m.State("OUT"):
                m.d.comb += self.o_out.valid.eq(1)
                with m.If(self.o_out.ready):
                    m.next = "IDLE"
        return m
