"""Fixed-length masked softmax unit: int16 score rows in, unsigned 8-bit probability rows out
(or, in partial mode, unnormalised probabilities with the row's maximum and sum)."""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..layouts import lanes_layout
from ..spec.formats import PROB_BITS, SCORE_BITS
from ..spec.softmax import (
    D_MAX,
    EXP_BITS,
    EXP_FRAC_BITS,
    EXP_LUT,
    LOG2E_MULT,
    LOG2E_SHIFT,
    PARTIAL_SHIFT,
    RECIP_BITS,
    Y_MASKED,
    max_sum_exponent,
    partial_sum_bits,
    sum_bits,
)
from ..spec.timing.chip import SOFTMAX_STAGES, check_built

__all__ = ["SoftmaxUnit", "softmax_in_layout", "softmax_out_layout"]

#: The row stages :meth:`SoftmaxUnit.elaborate` builds, in order; their count is the spec's
#: ``SOFTMAX_STAGES``, checked at construction.
_ROW_STAGES = ("max", "log2", "exp and sum", "reciprocal", "normalise")


def softmax_in_layout(length):
    """``i``: a score row (int16 lanes), its visibility mask, ``partial`` (partial mode)."""
    return lanes_layout(signed(SCORE_BITS), length, mask=data.ArrayLayout(1, length), partial=1)


def softmax_out_layout(length):
    """``o``: a probability row (unsigned 8-bit lanes) and, in partial mode, the row's maximum
    ``max`` (int16) and the sum of its lanes ``sum``."""
    return lanes_layout(unsigned(PROB_BITS), length, max=signed(SCORE_BITS),
                        sum=unsigned(partial_sum_bits(length)))


class SoftmaxUnit(wiring.Component):
    """Softmax over rows of ``length`` masked scores, in integers.

    The integer algorithm (max-subtraction, base-2 exp with a 256-entry table, sum, one
    normalised reciprocal per row by long division, multiply, round half up, saturate) is
    specified in :mod:`hw.spec.softmax`; :func:`sim.golden.softmax.softmax` is bit-exact with
    this unit. Its error against float64 is below 2**-8 per probability (tests).

    Parameters
    ----------
    length : int
        ``L`` lanes per row (``softmax_len``), at least 2.
    lanes_per_cycle : int
        ``P`` lanes each lane-serial stage handles per cycle; it divides ``length``. Default 1.

    Members
    -------
    i : ``In(stream.Signature(softmax_in_layout(L)))``
        One score row per beat: ``data[j]`` is lane ``j``'s score in Q8.8 (logit = score / 256,
        already scaled by 1/sqrt(d_head)); ``mask[j] = 1`` if lane ``j`` is visible; ``last``
        marks the end of a group of rows and is passed through unchanged; ``partial`` selects
        partial mode for this row.
    o : ``Out(stream.Signature(softmax_out_layout(L)))``
        One probability row per input row, in order: ``data[j] = round(256 * p_j)``; a lane whose
        probability rounds to 256 gives 255; masked lanes are exactly 0; a fully masked row is
        all zeros. ``last`` as received. In partial mode (``hw.spec.softmax``) ``data[j] =
        min((e_j + 64) >> 7, 255)``, unnormalised (the maximum lane 255), ``max`` the row's
        largest visible score (-32768 if none) and ``sum`` the sum of ``data``; outside partial
        mode ``max`` is the same and ``sum`` is 0.

    Micro-architecture and timing
    -----------------------------
    Five row stages (``hw.spec.timing.chip.SOFTMAX_STAGES``) in a lock-step pipeline, each holding
    one row in a register that rotates ``P`` lanes per cycle (no wide multiplexers, no per-lane
    dividers; the only per-lane-copy resources are ``P`` exp tables, ``P`` 12x15 and ``P`` 16x13
    multipliers):

    1. running maximum over the visible lanes;
    2. ``y = (M - s) * log2(e)`` per lane, written back in place;
    3. ``e`` by exp table lookup and shift per lane, written back in place, and the sum ``S``;
    4. ``R = 2**(z+12) // S``: restoring long division of ``quotient_bits = 13 + log2(L)``
       bits, ``divide_bits = ceil(quotient_bits / (L/P))`` per cycle (2 for ``L = 16, P = 1``;
       1 for ``L = 64, P = 1``), stopping ``KMAX - k`` bits early instead of shifting the
       quotient by them afterwards; the row waits in its register;
    5. ``p = min((e*R + half) >> sh, 255)`` per lane, written back in place (partial mode:
       ``u = min((e + 64) >> 7, 255)`` and their sum);

    then an output register that holds the row on ``o`` until it is taken. The row's maximum
    travels with it from stage 1 (a 16-bit register per stage); partial mode costs the
    multiplexer of stage 5, its sum's adder and those registers, and no cycle. All stages advance
    together every ``slot_cycles = L / P`` cycles (the *throughput*: back-to-back rows without
    backpressure come out one every ``L / P`` cycles). ``i.ready`` is high in the last cycle of
    a slot, or at once while the unit is empty. A row accepted in cycle ``t`` is valid on ``o``
    from cycle ``t + latency``, ``latency = 5 * L / P + 1`` (the *latency*). When the output
    register is still full at the end of a slot, the whole pipeline waits for ``o``.

    Cost: about ``90 * L`` flip-flops of row registers (5.8k at ``L = 64``) and their 2:1
    load/rotate multiplexers; ``2 * P`` multipliers (one ECP5 DSP each) and ``P`` 256 x 16
    tables. Each stage's combinational path is one multiply, or one table lookup and add (the
    exp stage's sum feeds only a register), or ``divide_bits`` subtractions, so no path chains
    the whole algorithm.
    """

    def __init__(self, *, length, lanes_per_cycle=1):
        if not isinstance(length, int) or isinstance(length, bool):
            raise TypeError(f"length must be an integer, not {length!r}")
        if length < 2:
            raise ValueError(f"length must be at least 2, not {length}")
        if not isinstance(lanes_per_cycle, int) or isinstance(lanes_per_cycle, bool):
            raise TypeError(f"lanes_per_cycle must be an integer, not {lanes_per_cycle!r}")
        if lanes_per_cycle < 1 or length % lanes_per_cycle:
            raise ValueError(f"lanes_per_cycle must be a positive divisor of length {length}, "
                             f"not {lanes_per_cycle}")
        self._length = length
        self._lanes = lanes_per_cycle
        check_built("SOFTMAX_STAGES", SOFTMAX_STAGES, len(_ROW_STAGES),
                    f"row stages ({', '.join(_ROW_STAGES)})", "hw/tile/softmax.py")
        super().__init__({
            "i": In(stream.Signature(softmax_in_layout(length))),
            "o": Out(stream.Signature(softmax_out_layout(length))),
        })

    @property
    def length(self) -> int:
        return self._length

    @property
    def lanes_per_cycle(self) -> int:
        return self._lanes

    @property
    def beats(self) -> int:
        """Cycles a lane-serial stage needs for one row: ``L / P``."""
        return self._length // self._lanes

    @property
    def quotient_bits(self) -> int:
        """Bits of the un-normalised quotient ``2**(EXP_BITS + KMAX + RECIP_BITS) // S``:
        ``RECIP_BITS + 1 + floor(log2(L))``."""
        return RECIP_BITS + 1 + max_sum_exponent(self._length)

    @property
    def divide_bits(self) -> int:
        """Quotient bits the divider computes per cycle, ``ceil(quotient_bits / (L / P))``, so
        that the reciprocal never takes longer than a row's beats."""
        return -(-self.quotient_bits // self.beats)

    @property
    def divide_cycles(self) -> int:
        """Cycles of the long division: ``ceil(quotient_bits / divide_bits) <= L / P``."""
        return -(-self.quotient_bits // self.divide_bits)

    @property
    def slot_cycles(self) -> int:
        """Cycles per row at full throughput: ``L / P`` (the divider always fits in it)."""
        assert self.divide_cycles <= self.beats
        return self.beats

    @property
    def latency(self) -> int:
        """Cycles from the cycle a row is accepted on ``i`` to the first cycle it is valid on
        ``o``: ``SOFTMAX_STAGES * L / P + 1`` (= ``5 * L / P + 1``)."""
        return SOFTMAX_STAGES * self.slot_cycles + 1

    def elaborate(self, platform):
        m = Module()
        L, P, T = self._length, self._lanes, self.beats
        W = sum_bits(L)              # bits of the sum S
        KMAX = max_sum_exponent(L)   # S < 2**(EXP_BITS + KMAX + 1)
        QB = self.quotient_bits
        score_min = -(1 << (SCORE_BITS - 1))
        y_bits = Y_MASKED.bit_length()

        cnt = Signal(range(T), init=T - 1)
        boundary = Signal()
        run = Signal()
        step = Signal()     # the lane-serial stages process beat `cnt` in this cycle
        dstep = Signal()    # the divider computes divide_bits quotient bits this cycle
        v = [Signal(name=f"valid{k}") for k in range(SOFTMAX_STAGES)]
        last = [Signal(name=f"last{k}") for k in range(SOFTMAX_STAGES)]
        part = [Signal(name=f"partial{k}") for k in range(SOFTMAX_STAGES)]
        # The row's maximum, stages 2..5 (stage 1's is `top1` below).
        tops = [Signal(signed(SCORE_BITS), name=f"top{k}") for k in range(2, SOFTMAX_STAGES)]

        m.d.comb += [
            boundary.eq(cnt == T - 1),
            # Only a full output register that nobody takes at a slot boundary stops the unit.
            run.eq(~(boundary & v[-1] & self.o.valid & ~self.o.ready)),
            self.i.ready.eq(boundary & run),
            step.eq(run),
            dstep.eq(run & (cnt < self.divide_cycles)),
        ]

        def lanes(name, shape):
            return [Signal(shape, name=f"{name}_{j}") for j in range(L)]

        def rotate(regs, tails, name, shape):
            """Next value of a register rotating P lanes per step: heads leave, ``tails`` enter."""
            nxt = lanes(f"{name}_nxt", shape)
            for j, (reg, new) in enumerate(zip(regs, regs[P:] + list(tails), strict=True)):
                m.d.comb += nxt[j].eq(Mux(step, new, reg))
            return nxt

        # Stage 0: running maximum of the visible lanes.
        buf0, msk0 = lanes("s0", SCORE_BITS), lanes("m0", 1)
        acc0 = Signal(signed(SCORE_BITS), init=score_min)
        # A tree of maxima (the beat's P lanes, masked ones as the minimum, then the running
        # maximum), not a chain of P compares: log2(P) + 1 compares deep. A signal per node,
        # or the expression tree doubles with every level.
        level = []
        for p in range(P):
            lane = Signal(signed(SCORE_BITS), name=f"max{p}")
            m.d.comb += lane.eq(Mux(msk0[p], buf0[p].as_signed(), score_min))
            level.append(lane)
        level.append(acc0)
        depth = 0
        while len(level) > 1:
            nxt = []
            for i in range(0, len(level) - 1, 2):
                node = Signal(signed(SCORE_BITS), name=f"max_{depth}_{i // 2}")
                m.d.comb += node.eq(Mux(level[i + 1] > level[i], level[i + 1], level[i]))
                nxt.append(node)
            if len(level) % 2:
                nxt.append(level[-1])
            level, depth = nxt, depth + 1
        cand = level[0]
        nxt_acc0 = Signal(signed(SCORE_BITS))
        m.d.comb += nxt_acc0.eq(Mux(step, cand, acc0))
        nxt_buf0 = rotate(buf0, buf0[:P], "s0", SCORE_BITS)
        nxt_msk0 = rotate(msk0, msk0[:P], "m0", 1)

        # Stage 1: y = d * log2(e) with 8 fraction bits, in place of the score; masked lanes
        # get Y_MASKED, whose exp is 0, so that no mask travels further.
        buf1, msk1 = lanes("s1", SCORE_BITS), lanes("m1", 1)
        top1 = Signal(signed(SCORE_BITS))
        ys = []
        for p in range(P):
            dist = Signal(signed(SCORE_BITS + 2), name=f"dist{p}")
            dcl = Signal(range(D_MAX + 1), name=f"dclamp{p}")
            y = Signal(y_bits, name=f"y{p}")
            m.d.comb += [
                dist.eq(top1 - buf1[p].as_signed()),
                # Masked lanes may lie above the maximum (negative distance); they are replaced.
                dcl.eq(Mux(dist > D_MAX, D_MAX, dist[:D_MAX.bit_length()])),
                y.eq(Mux(msk1[p],
                         (dcl * LOG2E_MULT + (1 << (LOG2E_SHIFT - 1))) >> LOG2E_SHIFT,
                         Y_MASKED)),
            ]
            ys.append(y)
        nxt_buf1 = rotate(buf1, ys, "s1", SCORE_BITS)
        nxt_msk1 = rotate(msk1, msk1[:P], "m1", 1)

        # Stage 2: e = EXP_LUT[y % 256] >> (y // 256) in place of y, and the sum S.
        buf2 = lanes("y2", EXP_BITS + 1)
        sum2 = Signal(W)
        exps = []
        for p in range(P):
            m.submodules[f"exp_lut{p}"] = lut = Memory(shape=EXP_BITS + 1,
                                                       depth=1 << EXP_FRAC_BITS, init=EXP_LUT)
            rd = lut.read_port(domain="comb")
            e = Signal(EXP_BITS + 1, name=f"e{p}")
            m.d.comb += [
                rd.addr.eq(buf2[p][:EXP_FRAC_BITS]),
                e.eq(rd.data >> buf2[p][EXP_FRAC_BITS:y_bits]),
            ]
            exps.append(e)
        nxt_sum2 = Signal(W)
        m.d.comb += nxt_sum2.eq(Mux(step, sum2 + sum(exps), sum2))
        nxt_buf2 = rotate(buf2, exps, "y2", EXP_BITS + 1)

        # Stage 3: Q = 2**(EXP_BITS + KMAX + RECIP_BITS) // S by restoring long division of QB
        # quotient bits (no normalisation on the way in), then R = Q >> (KMAX - k), which is
        # 2**(z + RECIP_BITS) // S exactly, with k = z - EXP_BITS from a priority encoder.
        buf3 = lanes("e3", EXP_BITS + 1)
        div3 = Signal(W)
        rem = Signal(W + 1)
        quo = Signal(QB)
        nxt_quo = Signal(QB)
        nxt_rem = Signal(W + 1)
        # divide_bits steps chained in one cycle; steps past the last quotient bit leave
        # quotient and remainder alone. The last bit is QB - norm (norm = KMAX - k), not QB:
        # the first n quotient bits of a long division are the quotient of the dividend's
        # top n bits, floor(2**X / S) >> norm exactly, so R needs no shift after the divider.
        def norm_of(div):
            """``(k, KMAX - k)``: the sum's highest bit above EXP_BITS (a priority encoder)."""
            k_val, norm_val = Const(0, range(KMAX + 1)), Const(KMAX, range(KMAX + 1))
            for kk in range(KMAX + 1):   # the highest set bit wins
                k_val = Mux(div[EXP_BITS + kk], kk, k_val)
                norm_val = Mux(div[EXP_BITS + kk], KMAX - kk, norm_val)
            return k_val, norm_val

        k3 = Signal(range(KMAX + 1))
        m.d.comb += k3.eq(norm_of(div3)[0])
        # Which steps compute a quotient bit this cycle (cnt * divide_bits + b < QB - norm):
        # a register loaded from the counter's and the divisor's next values, so that the
        # chained steps start at the remainder register, not at a compare of the counter.
        DB = self.divide_bits
        cnt_nxt = Signal(range(T))
        div_nxt = Signal(W)
        act = Signal(DB, name="div_act",
                     init=sum(1 << b for b in range(DB) if (T - 1) * DB + b < QB - KMAX))
        m.d.comb += [div_nxt.eq(Mux(run & boundary, nxt_sum2, div3)), cnt_nxt.eq(cnt)]
        with m.If(run):
            # At a boundary, stay there while the pipeline is empty, so that a new row is
            # taken at once.
            m.d.comb += cnt_nxt.eq(Mux(boundary,
                                       Mux(self.i.valid | Cat(v[:-1]).any(), 0, T - 1),
                                       cnt + 1))
        norm_nxt = norm_of(div_nxt)[1]
        m.d.sync += [cnt.eq(cnt_nxt),
                     *(act[b].eq(cnt_nxt * DB + b < QB - norm_nxt) for b in range(DB))]
        r, q = rem, quo
        for b in range(self.divide_bits):
            ge = Signal(name=f"ge{b}")
            active = Signal(name=f"active{b}")
            r_b, q_b = Signal(W + 1, name=f"rem{b}"), Signal(QB, name=f"quo{b}")
            m.d.comb += [
                ge.eq(r >= div3),
                active.eq(act[b]),
                r_b.eq(Mux(active, Mux(ge, r - div3, r) << 1, r)),
                q_b.eq(Mux(active, Cat(ge, q[:-1]), q)),
            ]
            r, q = r_b, q_b
        m.d.comb += [
            nxt_quo.eq(Mux(dstep, q, quo)),
            nxt_rem.eq(Mux(dstep, r, rem)),
        ]
        recip = Signal(RECIP_BITS + 1)
        m.d.comb += [
            # S == 0 only for a fully masked row, whose e are all 0: any R gives p = 0 there.
            # When the division ends before the slot's last cycle, the quotient register
            # holds it there.
            recip.eq(quo if self.divide_cycles < T else nxt_quo),
        ]

        # Stage 4: p = min((e * R + 2**(sh-1)) >> sh, 255), sh = z + RECIP_BITS - 8, in place;
        # partial mode: u = min((e + 64) >> 7, 255), and their sum.
        buf4 = lanes("e4", EXP_BITS + 1)
        recip4 = Signal(RECIP_BITS + 1)
        k4 = Signal(range(KMAX + 1))
        sum4 = Signal(partial_sum_bits(L))
        probs = []
        for p in range(P):
            prod = Signal(EXP_BITS + RECIP_BITS + 2, name=f"prod{p}")
            wide = Signal(EXP_BITS + RECIP_BITS + 3, name=f"rounded{p}")
            q9 = Signal(PROB_BITS + 4, name=f"q{p}")
            prob = Signal(PROB_BITS, name=f"prob{p}")
            half = Const(1 << (RECIP_BITS + EXP_BITS - PROB_BITS - 1),
                         RECIP_BITS + EXP_BITS + KMAX)
            unit = Signal(EXP_BITS + 1 - PARTIAL_SHIFT + 1, name=f"u{p}")
            m.d.comb += [
                prod.eq(buf4[p] * recip4),
                wide.eq(prod + (half << k4)),
                q9.eq((wide >> (RECIP_BITS + EXP_BITS - PROB_BITS)) >> k4),
                unit.eq((buf4[p] + (1 << (PARTIAL_SHIFT - 1))) >> PARTIAL_SHIFT),
                # Saturation at 255 by the bits above the result, not a comparison.
                prob.eq(Mux(part[-1],
                            Mux(unit[PROB_BITS:].any(), (1 << PROB_BITS) - 1, unit),
                            Mux(q9[PROB_BITS:].any(), (1 << PROB_BITS) - 1, q9))),
            ]
            probs.append(prob)
        nxt_buf4 = rotate(buf4, probs, "e4", EXP_BITS + 1)
        nxt_sum4 = Signal(partial_sum_bits(L))
        m.d.comb += nxt_sum4.eq(Mux(step & part[-1], sum4 + sum(probs), sum4))

        with m.If(run):
            with m.If(boundary):
                # Every row moves one stage on; stage 0 takes the new row, if any.
                m.d.sync += [
                    v[0].eq(self.i.valid), last[0].eq(self.i.payload.last), acc0.eq(score_min),
                    part[0].eq(self.i.payload.partial),
                    top1.eq(nxt_acc0), tops[0].eq(top1),
                    *(tops[k + 1].eq(tops[k]) for k in range(len(tops) - 1)),
                    sum4.eq(0),
                    sum2.eq(0),
                    div3.eq(nxt_sum2), rem.eq(1 << EXP_BITS), quo.eq(0),
                    recip4.eq(recip), k4.eq(k3),
                ]
                m.d.sync += [v[k + 1].eq(v[k]) for k in range(SOFTMAX_STAGES - 1)]
                m.d.sync += [last[k + 1].eq(last[k]) for k in range(SOFTMAX_STAGES - 1)]
                m.d.sync += [part[k + 1].eq(part[k]) for k in range(SOFTMAX_STAGES - 1)]
                for j in range(L):
                    m.d.sync += [
                        buf0[j].eq(self.i.payload.data[j]), msk0[j].eq(self.i.payload.mask[j]),
                        buf1[j].eq(nxt_buf0[j]), msk1[j].eq(nxt_msk0[j]),
                        buf2[j].eq(nxt_buf1[j]),
                        buf3[j].eq(nxt_buf2[j]),
                        buf4[j].eq(buf3[j]),
                    ]
                with m.If(v[-1]):
                    m.d.sync += [self.o.valid.eq(1), self.o.payload.last.eq(last[-1]),
                                 self.o.payload.max.eq(tops[-1]),
                                 self.o.payload.sum.eq(nxt_sum4)]
                    m.d.sync += [self.o.payload.data[j].eq(nxt_buf4[j][:PROB_BITS])
                                 for j in range(L)]
                with m.Elif(self.o.ready):
                    m.d.sync += self.o.valid.eq(0)
            with m.Else():
                m.d.sync += [
                    acc0.eq(nxt_acc0),
                    sum2.eq(nxt_sum2),
                    quo.eq(nxt_quo),
                    rem.eq(nxt_rem),
                    sum4.eq(nxt_sum4),
                ]
                for j in range(L):
                    m.d.sync += [
                        buf0[j].eq(nxt_buf0[j]), msk0[j].eq(nxt_msk0[j]),
                        buf1[j].eq(nxt_buf1[j]), msk1[j].eq(nxt_msk1[j]),
                        buf2[j].eq(nxt_buf2[j]),
                        buf4[j].eq(nxt_buf4[j]),
                    ]
                with m.If(self.o.ready):
                    m.d.sync += self.o.valid.eq(0)
        return m
