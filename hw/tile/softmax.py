"""Fixed-length masked softmax unit: int16 score rows in, unsigned 8-bit probability rows out."""

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
    RECIP_BITS,
    max_sum_exponent,
    sum_bits,
)

__all__ = ["SoftmaxUnit"]

#: Pipeline stages a row passes through (max, exp+sum, reciprocal, normalise).
STAGES = 4


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
    i : ``In(stream.Signature(lanes_layout(signed(16), L, mask=ArrayLayout(1, L))))``
        One score row per beat: ``data[j]`` is lane ``j``'s score in Q8.8 (logit = score / 256,
        already scaled by 1/sqrt(d_head)); ``mask[j] = 1`` if lane ``j`` is visible; ``last``
        marks the end of a group of rows and is passed through unchanged.
    o : ``Out(stream.Signature(lanes_layout(unsigned(8), L)))``
        One probability row per input row, in order: ``data[j] = round(256 * p_j)``; a lane whose
        probability rounds to 256 gives 255; masked lanes are exactly 0; a fully masked row is
        all zeros. ``last`` as received.

    Micro-architecture and timing
    -----------------------------
    Four row stages in a lock-step pipeline, each holding one row in a register that rotates
    ``P`` lanes per cycle (no wide multiplexers, no per-lane dividers; the only per-lane-copy
    resources are ``P`` exp tables, ``P`` 12x15 and ``P`` 16x13 multipliers):

    1. running maximum over the visible lanes;
    2. ``e`` by exp table lookup and shift per lane, written back in place, and the sum ``S``;
    3. ``R = 2**(z+12) // S`` by restoring long division of 13 quotient bits,
       ``divide_bits = ceil(13 / (L/P))`` bits per cycle (1 bit for ``L/P >= 13``), while the
       row waits in its register;
    4. ``p = min((e*R + half) >> sh, 255)`` per lane, written back in place;

    then an output register that holds the row on ``o`` until it is taken. All stages advance
    together every ``slot_cycles = L / P`` cycles (the *throughput*: back-to-back rows without
    backpressure come out one every ``L / P`` cycles). ``i.ready`` is high in the last cycle of
    a slot, or at once while the unit is empty. A row accepted in cycle ``t`` is valid on ``o``
    from cycle ``t + latency``, ``latency = 4 * L / P + 1`` (the *latency*). When the output
    register is still full at the end of a slot, the whole pipeline waits for ``o``.

    Cost: about ``74 * L`` flip-flops of row registers (4.7k at ``L = 64``) and their 2:1
    load/rotate multiplexers; ``2 * P`` multipliers (one ECP5 DSP each) and ``P`` 256 x 16
    tables. The longest combinational path is stage 2's (subtract, multiply, table, shift,
    add into ``S``, normalise ``S`` at the slot end); split that stage if fmax needs it.
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
        super().__init__({
            "i": In(stream.Signature(lanes_layout(signed(SCORE_BITS), length,
                                                  mask=data.ArrayLayout(1, length)))),
            "o": Out(stream.Signature(lanes_layout(unsigned(PROB_BITS), length))),
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
    def divide_bits(self) -> int:
        """Quotient bits the divider computes per cycle: ``ceil(13 / (L / P))``, so that the
        reciprocal never takes longer than a row's beats."""
        return -(-(RECIP_BITS + 1) // self.beats)

    @property
    def divide_cycles(self) -> int:
        """Cycles of the reciprocal's long division: ``ceil(13 / divide_bits) <= L / P``."""
        return -(-(RECIP_BITS + 1) // self.divide_bits)

    @property
    def slot_cycles(self) -> int:
        """Cycles per row at full throughput: ``L / P`` (the divider always fits in it)."""
        assert self.divide_cycles <= self.beats
        return self.beats

    @property
    def latency(self) -> int:
        """Cycles from the cycle a row is accepted on ``i`` to the first cycle it is valid on
        ``o``: ``4 * L / P + 1``."""
        return STAGES * self.slot_cycles + 1

    def elaborate(self, platform):
        m = Module()
        L, P, T, TS = self._length, self._lanes, self.beats, self.slot_cycles
        W = sum_bits(L)              # bits of the sum S
        KMAX = max_sum_exponent(L)   # S < 2**(EXP_BITS + KMAX + 1)
        D = self.divide_cycles
        score_min = -(1 << (SCORE_BITS - 1))

        cnt = Signal(range(TS), init=TS - 1)
        boundary = Signal()
        run = Signal()
        step = Signal()     # the lane-serial stages process beat `cnt` in this cycle
        dstep = Signal()    # the divider computes divide_bits quotient bits this cycle
        v = [Signal(name=f"valid{k}") for k in range(STAGES)]
        last = [Signal(name=f"last{k}") for k in range(STAGES)]

        m.d.comb += [
            boundary.eq(cnt == TS - 1),
            # Only a full output register that nobody takes at a slot boundary stops the unit.
            run.eq(~(boundary & v[3] & self.o.valid & ~self.o.ready)),
            self.i.ready.eq(boundary & run),
            step.eq(run & (cnt < T)),
            dstep.eq(run & (cnt < D)),
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
        cand = acc0
        for p in range(P):
            s = buf0[p].as_signed()
            # A signal per link of the chain, or the expression tree doubles with every lane.
            cand_p = Signal(signed(SCORE_BITS), name=f"max{p}")
            m.d.comb += cand_p.eq(Mux(msk0[p] & (s > cand), s, cand))
            cand = cand_p
        nxt_acc0 = Signal(signed(SCORE_BITS))
        m.d.comb += nxt_acc0.eq(Mux(step, cand, acc0))
        nxt_buf0 = rotate(buf0, buf0[:P], "s0", SCORE_BITS)
        nxt_msk0 = rotate(msk0, msk0[:P], "m0", 1)

        # Stage 1: e = EXP_LUT[y % 256] >> (y // 256) with y = d * log2(e), and the sum.
        # Scores come in and e values (EXP_BITS + 1 = 16 bits, unsigned) go out in the same lanes.
        buf1, msk1 = lanes("s1", SCORE_BITS), lanes("m1", 1)
        top1 = Signal(signed(SCORE_BITS))
        sum1 = Signal(W)
        exps = []
        for p in range(P):
            m.submodules[f"exp_lut{p}"] = lut = Memory(shape=EXP_BITS + 1, depth=1 << EXP_FRAC_BITS,
                                                       init=EXP_LUT)
            rd = lut.read_port(domain="comb")
            dist = Signal(signed(SCORE_BITS + 2), name=f"dist{p}")
            dcl = Signal(range(D_MAX + 1), name=f"dclamp{p}")
            y = Signal(range(((D_MAX * LOG2E_MULT) >> LOG2E_SHIFT) + 2), name=f"y{p}")
            e = Signal(EXP_BITS + 1, name=f"e{p}")
            m.d.comb += [
                dist.eq(top1 - buf1[p].as_signed()),
                # Masked lanes may lie above the maximum (negative distance): their e is 0.
                dcl.eq(Mux(dist > D_MAX, D_MAX, dist[:D_MAX.bit_length()])),
                y.eq((dcl * LOG2E_MULT + (1 << (LOG2E_SHIFT - 1))) >> LOG2E_SHIFT),
                rd.addr.eq(y[:EXP_FRAC_BITS]),
                e.eq(Mux(msk1[p], rd.data >> y[EXP_FRAC_BITS:], 0)),
            ]
            exps.append(e)
        nxt_sum1 = Signal(W)
        m.d.comb += nxt_sum1.eq(Mux(step, sum1 + sum(exps), sum1))
        nxt_buf1 = rotate(buf1, exps, "s1", SCORE_BITS)
        nxt_msk1 = rotate(msk1, msk1[:P], "m1", 1)

        # Normalise the final sum for the divider: Sn = S << (KMAX - k), k = z - EXP_BITS.
        k_in = Signal(range(KMAX + 1))
        norm_in = Signal(range(KMAX + 1))
        k_val, norm_val = Const(0, range(KMAX + 1)), Const(KMAX, range(KMAX + 1))
        for kk in range(KMAX + 1):   # the highest set bit wins
            k_val = Mux(nxt_sum1[EXP_BITS + kk], kk, k_val)
            norm_val = Mux(nxt_sum1[EXP_BITS + kk], KMAX - kk, norm_val)
        m.d.comb += [k_in.eq(k_val), norm_in.eq(norm_val)]

        # Stage 2: R = 2**(W-1+RECIP_BITS) // Sn = 2**(z+RECIP_BITS) // S, by long division.
        buf2 = lanes("e2", EXP_BITS + 1)
        sn = Signal(W)
        rem = Signal(W + 1)
        quo = Signal(RECIP_BITS + 1)
        k2 = Signal(range(KMAX + 1))
        zero2 = Signal()
        nxt_quo = Signal(RECIP_BITS + 1)
        nxt_rem = Signal(W + 1)
        # divide_bits restoring steps chained in one cycle; steps past the last quotient bit
        # (when divide_bits does not divide RECIP_BITS + 1) leave quotient and remainder alone.
        r, q = rem, quo
        for b in range(self.divide_bits):
            ge = Signal(name=f"ge{b}")
            active = Signal(name=f"active{b}")
            r_b, q_b = Signal(W + 1, name=f"rem{b}"), Signal(RECIP_BITS + 1, name=f"quo{b}")
            m.d.comb += [
                ge.eq(r >= sn),
                active.eq(cnt * self.divide_bits + b < RECIP_BITS + 1),
                r_b.eq(Mux(active, Mux(ge, r - sn, r) << 1, r)),
                q_b.eq(Mux(active, Cat(ge, q[:-1]), q)),
            ]
            r, q = r_b, q_b
        m.d.comb += [
            nxt_quo.eq(Mux(dstep, q, quo)),
            nxt_rem.eq(Mux(dstep, r, rem)),
        ]

        # Stage 3: p = min((e * R + 2**(sh-1)) >> sh, 255), sh = z + RECIP_BITS - 8.
        # e values come in and probabilities go out (in the low PROB_BITS) in the same lanes.
        buf3 = lanes("e3", EXP_BITS + 1)
        recip3 = Signal(RECIP_BITS + 1)
        k3 = Signal(range(KMAX + 1))
        probs = []
        for p in range(P):
            prod = Signal(EXP_BITS + RECIP_BITS + 2, name=f"prod{p}")
            wide = Signal(EXP_BITS + RECIP_BITS + 3, name=f"rounded{p}")
            q9 = Signal(PROB_BITS + 4, name=f"q{p}")
            prob = Signal(PROB_BITS, name=f"prob{p}")
            half = Const(1 << (RECIP_BITS + EXP_BITS - PROB_BITS - 1),
                         RECIP_BITS + EXP_BITS + KMAX)
            m.d.comb += [
                prod.eq(buf3[p] * recip3),
                wide.eq(prod + (half << k3)),
                q9.eq((wide >> (RECIP_BITS + EXP_BITS - PROB_BITS)) >> k3),
                prob.eq(Mux(q9 > (1 << PROB_BITS) - 1, (1 << PROB_BITS) - 1, q9)),
            ]
            probs.append(prob)
        nxt_buf3 = rotate(buf3, probs, "e3", EXP_BITS + 1)

        with m.If(run):
            with m.If(boundary):
                # Every row moves one stage on; stage 0 takes the new row, if any.
                m.d.sync += [
                    v[0].eq(self.i.valid),
                    last[0].eq(self.i.payload.last),
                    acc0.eq(score_min),
                    v[1].eq(v[0]), last[1].eq(last[0]), top1.eq(nxt_acc0), sum1.eq(0),
                    v[2].eq(v[1]), last[2].eq(last[1]),
                    sn.eq((nxt_sum1 << norm_in)[:W]), k2.eq(k_in), zero2.eq(nxt_sum1 == 0),
                    rem.eq(1 << (W - 1)), quo.eq(0),
                    v[3].eq(v[2]), last[3].eq(last[2]),
                    recip3.eq(Mux(zero2, 0, nxt_quo)), k3.eq(k2),
                    # Stay at the boundary while the pipeline is empty, so that a new row is
                    # taken at once.
                    cnt.eq(Mux(self.i.valid | v[0] | v[1] | v[2], 0, TS - 1)),
                ]
                for j in range(L):
                    m.d.sync += [
                        buf0[j].eq(self.i.payload.data[j]), msk0[j].eq(self.i.payload.mask[j]),
                        buf1[j].eq(nxt_buf0[j]), msk1[j].eq(nxt_msk0[j]),
                        buf2[j].eq(nxt_buf1[j]),
                        buf3[j].eq(buf2[j]),
                    ]
                with m.If(v[3]):
                    m.d.sync += [self.o.valid.eq(1), self.o.payload.last.eq(last[3])]
                    m.d.sync += [self.o.payload.data[j].eq(nxt_buf3[j][:PROB_BITS])
                                 for j in range(L)]
                with m.Elif(self.o.ready):
                    m.d.sync += self.o.valid.eq(0)
            with m.Else():
                m.d.sync += [
                    cnt.eq(cnt + 1),
                    acc0.eq(nxt_acc0),
                    sum1.eq(nxt_sum1),
                    quo.eq(nxt_quo),
                    rem.eq(nxt_rem),
                ]
                for j in range(L):
                    m.d.sync += [
                        buf0[j].eq(nxt_buf0[j]), msk0[j].eq(nxt_msk0[j]),
                        buf1[j].eq(nxt_buf1[j]), msk1[j].eq(nxt_msk1[j]),
                        buf3[j].eq(nxt_buf3[j]),
                    ]
                with m.If(self.o.ready):
                    m.d.sync += self.o.valid.eq(0)
        return m
