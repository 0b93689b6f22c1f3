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
from ..spec.timing.chip import (
    check_attn_pipeline,
    check_built,
    softmax_divide_stages,
    softmax_stages,
)

__all__ = ["SoftmaxUnit", "softmax_in_layout", "softmax_out_layout"]

#: The row stages :meth:`SoftmaxUnit.elaborate` builds, in order, per pipeline; their count is
#: the spec's ``softmax_stages(pipeline)``, checked at construction.
_ROW_STAGES = {
    "short": ("max", "log2", "exp and sum", "reciprocal", "normalise"),
    "deep": ("max", "log2", "exp and sum", "reciprocal's first bits", "reciprocal's last bits",
             "normalise"),
}


#: The deep pipeline's ``d * LOG2E_MULT + 2**(LOG2E_SHIFT - 1)`` (``0 <= d <= D_MAX``) as the
#: sum of two tables, of d's bits from ``LOG2E_HALF`` up and of those below.
LOG2E_HALF = D_MAX.bit_length() // 2


def log2e_tables():
    """``(hi, lo)``: ``hi[a] = (a << LOG2E_HALF) * LOG2E_MULT + 2**(LOG2E_SHIFT - 1)``, ``lo[b] =
    b * LOG2E_MULT``, so that ``hi[d >> LOG2E_HALF] + lo[d % 2**LOG2E_HALF]`` is ``d *
    LOG2E_MULT + 2**(LOG2E_SHIFT - 1)`` exactly."""
    hi_size = 1 << (D_MAX.bit_length() - LOG2E_HALF)
    hi = [((a << LOG2E_HALF) * LOG2E_MULT) + (1 << (LOG2E_SHIFT - 1)) for a in range(hi_size)]
    lo = [b * LOG2E_MULT for b in range(1 << LOG2E_HALF)]
    return hi, lo


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
    pipeline : str
        ``"short"`` (default) or ``"deep"`` (the NPU file's ``attention_pipeline``): the long
        division in one row stage, or spread over two (below).

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
    Five row stages (six with the deep pipeline: ``hw.spec.timing.chip.softmax_stages``) in a
    lock-step pipeline, each holding
    one row in a register that rotates ``P`` lanes per cycle (no wide multiplexers, no per-lane
    dividers; the only per-lane-copy resources are ``P`` exp tables, ``P`` 12x15 and ``P`` 16x13
    multipliers):

    1. running maximum over the visible lanes;
    2. ``y = (M - s) * log2(e)`` per lane, written back in place;
    3. ``e`` by exp table lookup and shift per lane, written back in place, and the sum ``S``;
    4. ``R = 2**(z+12) // S``: restoring long division of ``quotient_bits = 13 + log2(L)``
       bits, ``divide_bits = ceil(quotient_bits / (L/P))`` per cycle (2 for ``L = 16, P = 1``;
       1 for ``L = 64, P = 1``), stopping ``KMAX - k`` bits early instead of shifting the
       quotient by them afterwards; the row waits in its register. Deep pipeline: two stages
       (``softmax_divide_stages``) of ``2 L / P`` cycles between them, each with its own
       divisor, remainder and quotient registers, so that a row in the second stage and the
       next in the first divide at once. The dividend's top bits are ``2**(EXP_BITS + k)``
       (the quotient's ``k`` leading zeros skipped): R's ``RECIP_BITS + 1`` = 13 bits. The
       first cycle finds ``k`` and the first bit (``S`` a power of two: no bit below its top
       one) without a subtraction, then the other 12 at ``divide_bits = ceil(12 / (2 L / P -
       2))`` per cycle (2 at ``L / P = 4``), so that the last cycle has R in a register;
    5. ``p = min((e*R + half) >> sh, 255)`` per lane, written back in place (partial mode:
       ``u = min((e + 64) >> 7, 255)`` and their sum). Deep pipeline: the products ``e*R``
       are a register loaded a cycle ahead from the lanes and ``R`` the stage holds next
       (the first beat's from stage 4's row and its quotient register), and the partial sum
       adds the ``u`` lanes, not the multiplexed ``p``: no path runs from a multiplier
       through the rounding into the sum;

    then an output register that holds the row on ``o`` until it is taken. The row's maximum
    travels with it from stage 1 (a 16-bit register per stage); partial mode costs the
    multiplexer of stage 5, its sum's adder and those registers, and no cycle. All stages advance
    together every ``slot_cycles = L / P`` cycles (the *throughput*: back-to-back rows without
    backpressure come out one every ``L / P`` cycles). ``i.ready`` is high in the last cycle of
    a slot, or at once while the unit is empty. A row accepted in cycle ``t`` is valid on ``o``
    from cycle ``t + latency``, ``latency = E * L / P + 1`` (the *latency*; ``E`` the row stages,
    5 or 6). When the output
    register is still full at the end of a slot, the whole pipeline waits for ``o``.

    Cost: about ``90 * L`` flip-flops of row registers (5.8k at ``L = 64``) and their 2:1
    load/rotate multiplexers; ``2 * P`` multipliers (one ECP5 DSP each) and ``P`` 256 x 16
    tables. Each stage's combinational path is one multiply, or one table lookup and add (the
    exp stage's sum feeds only a register), or ``divide_bits`` subtractions, so no path chains
    the whole algorithm.
    """

    def __init__(self, *, length, lanes_per_cycle=1, pipeline="short"):
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
        self._pipeline = check_attn_pipeline(pipeline)
        stages = _ROW_STAGES[self._pipeline]
        check_built("softmax_stages", softmax_stages(self._pipeline), len(stages),
                    f"row stages ({', '.join(stages)})", "hw/tile/softmax.py")
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
    def pipeline(self) -> str:
        return self._pipeline

    @property
    def stages(self) -> int:
        """Row stages: ``hw.spec.timing.chip.softmax_stages(pipeline)``, 5 or 6."""
        return softmax_stages(self._pipeline)

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
        that the reciprocal never takes longer than a row's beats; deep pipeline: ``ceil(
        RECIP_BITS / max(1, 2 L / P - 2))`` (its first cycle finds the first bit, its last is
        left free when ``L / P >= 2``)."""
        if self._pipeline == "deep":
            return -(-RECIP_BITS // max(1, self._divider_slots * self.beats - 2))
        return -(-self.quotient_bits // self.beats)

    @property
    def divide_cycles(self) -> int:
        """Cycles of the long division: ``ceil(quotient_bits / divide_bits) <= L / P``; deep
        pipeline: ``1 + ceil(RECIP_BITS / divide_bits) <= 2 L / P``."""
        if self._pipeline == "deep":
            return 1 + -(-RECIP_BITS // self.divide_bits)
        return -(-self.quotient_bits // self.divide_bits)

    @property
    def _divider_slots(self) -> int:
        return softmax_divide_stages(self._pipeline)

    @property
    def slot_cycles(self) -> int:
        """Cycles per row at full throughput: ``L / P`` (the divider always fits in its
        stages)."""
        assert self.divide_cycles <= self._divider_slots * self.beats
        return self.beats

    @property
    def latency(self) -> int:
        """Cycles from the cycle a row is accepted on ``i`` to the first cycle it is valid on
        ``o``: ``softmax_stages(pipeline) * L / P + 1`` (``5 * L / P + 1``, deep ``6 * L / P +
        1``)."""
        return self.stages * self.slot_cycles + 1

    def elaborate(self, platform):
        m = Module()
        L, P, T = self._length, self._lanes, self.beats
        NS = self.stages
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
        v = [Signal(name=f"valid{k}") for k in range(NS)]
        last = [Signal(name=f"last{k}") for k in range(NS)]
        part = [Signal(name=f"partial{k}") for k in range(NS)]
        # The row's maximum, stages 2..5 (stage 1's is `top1` below).
        tops = [Signal(signed(SCORE_BITS), name=f"top{k}") for k in range(2, NS)]

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

        cnt_nxt = Signal(range(T))
        m.d.comb += cnt_nxt.eq(cnt)
        with m.If(run):
            # At a boundary, stay there while the pipeline is empty, so that a new row is
            # taken at once.
            m.d.comb += cnt_nxt.eq(Mux(boundary,
                                       Mux(self.i.valid | Cat(v[:-1]).any(), 0, T - 1),
                                       cnt + 1))
        m.d.sync += cnt.eq(cnt_nxt)
        deep = self._pipeline == "deep"
        if deep:
            first = Signal(name="slot_first", init=T == 1)   # the slot's first cycle
            m.d.sync += first.eq(cnt_nxt == 0)

        def advance(regs, tails):
            """The first P lanes of a rotating register after a step (``tails`` entering):
            the deep pipeline's registers loaded a cycle ahead take them, or a stage's next
            row's at a boundary, while the pipeline runs (and hold while it waits), so that
            the stall (``run``) is only their enable, not in their data path."""
            return [(list(regs) + list(tails))[p + P] for p in range(P)]

        def max_tree(level, name):
            """A tree of maxima over ``level``, not a chain: ``ceil(log2(len))`` compares deep.
            A signal per node, or the expression tree doubles with every level."""
            depth = 0
            while len(level) > 1:
                nxt = []
                for i in range(0, len(level) - 1, 2):
                    node = Signal(signed(SCORE_BITS), name=f"{name}_{depth}_{i // 2}")
                    m.d.comb += node.eq(Mux(level[i + 1] > level[i], level[i + 1], level[i]))
                    nxt.append(node)
                if len(level) % 2:
                    nxt.append(level[-1])
                level, depth = nxt, depth + 1
            return level[0]

        def masked(scores, masks, name):
            out = []
            for p, (score, mask) in enumerate(zip(scores, masks, strict=True)):
                lane = Signal(signed(SCORE_BITS), name=f"{name}{p}")
                m.d.comb += lane.eq(Mux(mask, score.as_signed(), score_min))
                out.append(lane)
            return out

        # Stage 0: running maximum of the visible lanes.
        buf0, msk0 = lanes("s0", SCORE_BITS), lanes("m0", 1)
        acc0 = Signal(signed(SCORE_BITS), init=score_min)
        nxt_buf0 = rotate(buf0, buf0[:P], "s0", SCORE_BITS)
        nxt_msk0 = rotate(msk0, msk0[:P], "m0", 1)
        nxt_acc0 = Signal(signed(SCORE_BITS))
        if not deep:
            # A tree of maxima (the beat's P lanes, masked ones as the minimum, then the
            # running maximum), not a chain of P compares: log2(P) + 1 compares deep.
            cand = max_tree([*masked(buf0[:P], msk0[:P], "max"), acc0], "max")
            m.d.comb += nxt_acc0.eq(Mux(step, cand, acc0))
        else:
            # The slot's first beat: the tree of its lanes (log2(P) compares; the running
            # maximum is the minimum then); every other beat's maximum is a register loaded
            # a cycle ahead from the lanes the stage holds next, and one compare with the
            # running maximum.
            beat = max_tree(masked(buf0[:P], msk0[:P], "max"), "max")
            ahead = Signal(signed(SCORE_BITS), name="beat_max")
            with m.If(run):
                m.d.sync += ahead.eq(max_tree(masked(advance(buf0, buf0[:P]),
                                                     advance(msk0, msk0[:P]), "max_next"),
                                              "max_next"))
            cand = Signal(signed(SCORE_BITS), name="max_run")
            acc_step = Signal(signed(SCORE_BITS), name="max_step")
            ahead_gt = Signal(name="max_ahead_gt")
            m.d.comb += [ahead_gt.eq(ahead > acc0),
                         cand.eq(Mux(ahead_gt, ahead, acc0)),
                         acc_step.eq(Mux(first, beat, cand)),
                         nxt_acc0.eq(Mux(step, acc_step, acc0))]

        # Stage 1: y = d * log2(e) with 8 fraction bits, in place of the score; masked lanes
        # get Y_MASKED, whose exp is 0, so that no mask travels further.
        # Deep pipeline: each beat's clamped distance is a register loaded a cycle ahead from
        # the maximum and the lanes the stage holds next (the first beat's from stage 0's
        # final compare and row), and its product with log2(e) the sum of two tables of its
        # high and low bits (LUTs, no multiplier between registers and the adder).
        buf1, msk1 = lanes("s1", SCORE_BITS), lanes("m1", 1)
        top1 = Signal(signed(SCORE_BITS))
        ys = []
        d_bits = D_MAX.bit_length()
        if deep:
            top1_nxt = Signal(signed(SCORE_BITS), name="top1_next")
            m.d.comb += top1_nxt.eq(Mux(boundary, acc_step, top1))
            hi_tab, lo_tab = log2e_tables()
        for p in range(P):
            dist = Signal(signed(SCORE_BITS + 2), name=f"dist{p}")
            dcl = Signal(range(D_MAX + 1), name=f"dclamp{p}")
            y = Signal(y_bits, name=f"y{p}")
            if not deep:
                m.d.comb += [
                    dist.eq(top1 - buf1[p].as_signed()),
                    # Masked lanes may lie above the maximum (negative distance); they are
                    # replaced.
                    dcl.eq(Mux(dist > D_MAX, D_MAX, dist[:d_bits])),
                    y.eq(Mux(msk1[p],
                             (dcl * LOG2E_MULT + (1 << (LOG2E_SHIFT - 1))) >> LOG2E_SHIFT,
                             Y_MASKED)),
                ]
            else:
                head = Signal(SCORE_BITS, name=f"s1_next{p}")
                # buf1[p]'s next value (its rotation does not depend on y while L >= 2P).
                nxt_head = buf1[p + P] if p + P < L else y
                m.d.comb += head.eq(Mux(boundary, advance(buf0, buf0[:P])[p], nxt_head))
                if T > 1:
                    # A slot's last beat is never its first: at the boundary the row's
                    # maximum is `cand`, and the distance is chosen between both candidates'
                    # (the compare beside the subtractors, not before them).
                    subs = [Signal(signed(SCORE_BITS + 2), name=f"dist_{n}{p}")
                            for n in ("ahead", "acc", "top")]
                    m.d.comb += [sub.eq(x - head.as_signed())
                                 for sub, x in zip(subs, (ahead, acc0, top1), strict=True)]
                    m.d.comb += dist.eq(Mux(boundary, Mux(ahead_gt, subs[0], subs[1]), subs[2]))
                else:
                    m.d.comb += dist.eq(top1_nxt - head.as_signed())
                # dist > D_MAX = 2**d_bits - 1 by its sign and the bits above d_bits.
                with m.If(run):
                    m.d.sync += dcl.eq(Mux(~dist[-1] & dist[d_bits:].any(), D_MAX,
                                           dist[:d_bits]))
                parts = []
                for name, tab, bits in (("hi", hi_tab, dcl[LOG2E_HALF:]),
                                        ("lo", lo_tab, dcl[:LOG2E_HALF])):
                    m.submodules[f"log2e_{name}{p}"] = rom = Memory(
                        shape=max(tab).bit_length(), depth=len(tab), init=tab)
                    rd = rom.read_port(domain="comb")
                    m.d.comb += rd.addr.eq(bits)
                    parts.append(rd.data)
                m.d.comb += y.eq(Mux(msk1[p], (parts[0] + parts[1]) >> LOG2E_SHIFT, Y_MASKED))
            ys.append(y)
        nxt_buf1 = rotate(buf1, ys, "s1", SCORE_BITS)
        nxt_msk1 = rotate(msk1, msk1[:P], "m1", 1)

        # Stage 2: e = EXP_LUT[y % 256] >> (y // 256) in place of y, and the sum S.
        # Deep pipeline: each beat's e is a register loaded a cycle ahead from the lanes the
        # stage holds next (the first beat's from stage 1's row), so that the table and its
        # shift do not chain into the sum.
        buf2 = lanes("y2", EXP_BITS + 1)
        sum2 = Signal(W)
        exps = []
        for p in range(P):
            m.submodules[f"exp_lut{p}"] = lut = Memory(shape=EXP_BITS + 1,
                                                       depth=1 << EXP_FRAC_BITS, init=EXP_LUT)
            rd = lut.read_port(domain="comb")
            e = Signal(EXP_BITS + 1, name=f"e{p}")
            y_in = buf2[p]
            if deep:
                y_in = Signal(EXP_BITS + 1, name=f"y2_next{p}")
                # buf2[p]'s next value (its rotation does not depend on e while L >= 2P).
                nxt_head = buf2[p + P] if p + P < L else e
                m.d.comb += y_in.eq(Mux(boundary, advance(buf1, ys)[p], nxt_head))
            e_val = Signal(EXP_BITS + 1, name=f"e_val{p}")
            m.d.comb += [
                rd.addr.eq(y_in[:EXP_FRAC_BITS]),
                e_val.eq(rd.data >> y_in[EXP_FRAC_BITS:y_bits]),
            ]
            if deep:
                with m.If(run):
                    m.d.sync += e.eq(e_val)
            else:
                m.d.comb += e.eq(e_val)
            exps.append(e)
        nxt_sum2 = Signal(W)
        m.d.comb += nxt_sum2.eq(Mux(step, sum2 + sum(exps), sum2))
        nxt_buf2 = rotate(buf2, exps, "y2", EXP_BITS + 1)

        # Stage 3: Q = 2**(EXP_BITS + KMAX + RECIP_BITS) // S by restoring long division of QB
        # quotient bits (no normalisation on the way in), then R = Q >> (KMAX - k), which is
        # 2**(z + RECIP_BITS) // S exactly, with k = z - EXP_BITS from a priority encoder.
        # `div_load` and `div_hold` are its registers' assignments at a slot boundary and
        # inside a slot; `bufs3` its row registers, in order.
        def norm_of(div):
            """``(k, KMAX - k)``: the sum's highest bit above EXP_BITS (a priority encoder)."""
            k_val, norm_val = Const(0, range(KMAX + 1)), Const(KMAX, range(KMAX + 1))
            for kk in range(KMAX + 1):   # the highest set bit wins
                k_val = Mux(div[EXP_BITS + kk], kk, k_val)
                norm_val = Mux(div[EXP_BITS + kk], KMAX - kk, norm_val)
            return k_val, norm_val

        def divide_steps(rem, quo, div, act, suffix=""):
            """``divide_bits`` restoring steps chained in one cycle from ``rem``, ``quo``; step
            ``b`` only where ``act[b]``, else it leaves quotient and remainder alone."""
            r, q = rem, quo
            for b in range(self.divide_bits):
                ge = Signal(name=f"ge{suffix}{b}")
                active = Signal(name=f"active{suffix}{b}")
                r_b = Signal(len(rem), name=f"rem{suffix}{b}")
                q_b = Signal(len(quo), name=f"quo{suffix}{b}")
                m.d.comb += [
                    ge.eq(r >= div),
                    active.eq(act[b]),
                    r_b.eq(Mux(active, Mux(ge, r - div, r) << 1, r)),
                    q_b.eq(Mux(active, Cat(ge, q[:-1]), q)),
                ]
                r, q = r_b, q_b
            return r, q

        DB = self.divide_bits
        recip = Signal(RECIP_BITS + 1)
        k3 = Signal(range(KMAX + 1))
        if self._pipeline == "short":
            bufs3 = [lanes("e3", EXP_BITS + 1)]
            div3 = Signal(W)
            rem = Signal(W + 1)
            quo = Signal(QB)
            nxt_quo = Signal(QB)
            nxt_rem = Signal(W + 1)
            # The last bit is QB - norm (norm = KMAX - k), not QB: the first n quotient bits
            # of a long division are the quotient of the dividend's top n bits, floor(2**X /
            # S) >> norm exactly, so R needs no shift after the divider.
            m.d.comb += k3.eq(norm_of(div3)[0])
            # Which steps compute a quotient bit this cycle (cnt * divide_bits + b < QB -
            # norm): a register loaded from the counter's and the divisor's next values, so
            # that the chained steps start at the remainder register, not at a compare of the
            # counter.
            div_nxt = Signal(W)
            act = Signal(DB, name="div_act",
                         init=sum(1 << b for b in range(DB) if (T - 1) * DB + b < QB - KMAX))
            m.d.comb += div_nxt.eq(Mux(run & boundary, nxt_sum2, div3))
            norm_nxt = norm_of(div_nxt)[1]
            m.d.sync += [act[b].eq(cnt_nxt * DB + b < QB - norm_nxt) for b in range(DB)]
            r, q = divide_steps(rem, quo, div3, act)
            m.d.comb += [
                nxt_quo.eq(Mux(dstep, q, quo)),
                nxt_rem.eq(Mux(dstep, r, rem)),
                # S == 0 only for a fully masked row, whose e are all 0: any R gives p = 0
                # there. When the division ends before the slot's last cycle, the quotient
                # register holds it there.
                recip.eq(quo if self.divide_cycles < T else nxt_quo),
            ]
            div_load = [div3.eq(nxt_sum2), rem.eq(1 << EXP_BITS), quo.eq(0)]
            div_hold = [quo.eq(nxt_quo), rem.eq(nxt_rem)]
        else:
            # Two stages, a and b, 2T cycles. The quotient R = 2**(EXP_BITS + k + RECIP_BITS)
            # // S = floor(2**X / S) >> (KMAX - k) has QN = RECIP_BITS + 1 bits (S < 2**(
            # EXP_BITS + k + 1)): the dividend's top bits are 2**(EXP_BITS + k), the quotient's
            # k leading zeros skipped. Its first bit, 2**(EXP_BITS + k) >= S, is whether S is
            # that power of two (no bit of S below its top one), found with k in the first
            # cycle of a without a subtraction; the other QN - 1 bits follow, DB a cycle, in
            # cycles 1 .. 2T - 2 when T >= 2, so that R is in quo_b in the stages' last cycle,
            # from which the normalisation's first products are computed a cycle ahead.
            QN = RECIP_BITS + 1
            bufs3 = [lanes("e3a", EXP_BITS + 1), lanes("e3b", EXP_BITS + 1)]
            div_a, div_b = Signal(W, name="div_a"), Signal(W, name="div_b")
            rem_a, rem_b = Signal(W + 1, name="rem_a"), Signal(W + 1, name="rem_b")
            quo_a, quo_b = Signal(QN, name="quo_a"), Signal(QN, name="quo_b")

            def acts(base):
                """Which steps run in the stages' cycle ``base + cnt``, as a register loaded
                from the counter's next value (its reset value: the slot's last cycle)."""
                def bits(c):
                    return sum(1 << b for b in range(DB)
                               if c >= 1 and 1 <= (c - 1) * DB + b + 1 < QN)
                reg = Signal(DB, name=f"div_act{base // T}", init=bits(base + T - 1))
                with m.Switch(cnt_nxt):
                    for c in range(T):
                        with m.Case(c):
                            m.d.sync += reg.eq(bits(base + c))
                return reg

            act_a, act_b = acts(0), acts(T)
            k_a = norm_of(div_a)[0]
            # The first quotient bit: no bit of S below bit EXP_BITS + k.
            pow2_val = ~div_a[:EXP_BITS].any()
            for kk in range(1, KMAX + 1):   # the highest set bit wins, as in norm_of
                pow2_val = Mux(div_a[EXP_BITS + kk], ~div_a[:EXP_BITS + kk].any(), pow2_val)
            pow2 = Signal(name="div_pow2")
            m.d.comb += pow2.eq(pow2_val)
            start = Signal(W + 1, name="rem_start")
            m.d.comb += [start.eq(Mux(pow2, 0, Const(1, W + 1) << (EXP_BITS + 1 + k_a))),
                         k3.eq(norm_of(div_b)[0])]
            r_a, q_a = divide_steps(rem_a, quo_a, div_a, act_a, "a")
            r_b, q_b = divide_steps(rem_b, quo_b, div_b, act_b, "b")
            nxt_rem_a, nxt_quo_a = Signal(W + 1), Signal(QN)
            nxt_rem_b, nxt_quo_b = Signal(W + 1), Signal(QN)
            m.d.comb += [
                nxt_rem_a.eq(Mux(first, start, r_a)),
                nxt_quo_a.eq(Mux(first, pow2, q_a)),
                nxt_rem_b.eq(r_b),
                nxt_quo_b.eq(q_b),
                recip.eq(quo_b if self.divide_cycles < 2 * T else nxt_quo_b),
            ]
            div_load = [div_a.eq(nxt_sum2), div_b.eq(div_a),
                        rem_b.eq(nxt_rem_a), quo_b.eq(nxt_quo_a)]
            div_hold = [rem_a.eq(nxt_rem_a), quo_a.eq(nxt_quo_a),
                        rem_b.eq(nxt_rem_b), quo_b.eq(nxt_quo_b)]

        # Stage 4: p = min((e * R + 2**(sh-1)) >> sh, 255), sh = z + RECIP_BITS - 8, in place;
        # partial mode: u = min((e + 64) >> 7, 255), and their sum.
        buf4 = lanes("e4", EXP_BITS + 1)
        recip4 = Signal(RECIP_BITS + 1)
        k4 = Signal(range(KMAX + 1))
        sum4 = Signal(partial_sum_bits(L))
        probs, units, prods = [], [], []
        for p in range(P):
            prod = Signal(EXP_BITS + RECIP_BITS + 2, name=f"prod{p}")
            wide = Signal(EXP_BITS + RECIP_BITS + 3, name=f"rounded{p}")
            q9 = Signal(PROB_BITS + 4, name=f"q{p}")
            prob = Signal(PROB_BITS, name=f"prob{p}")
            half = Const(1 << (RECIP_BITS + EXP_BITS - PROB_BITS - 1),
                         RECIP_BITS + EXP_BITS + KMAX)
            unit = Signal(EXP_BITS + 1 - PARTIAL_SHIFT + 1, name=f"u{p}")
            if not deep:
                m.d.comb += prod.eq(buf4[p] * recip4)
            prods.append(prod)
            unit_sat = Signal(PROB_BITS, name=f"usat{p}")
            m.d.comb += [
                wide.eq(prod + (half << k4)),
                q9.eq((wide >> (RECIP_BITS + EXP_BITS - PROB_BITS)) >> k4),
                unit.eq((buf4[p] + (1 << (PARTIAL_SHIFT - 1))) >> PARTIAL_SHIFT),
                # Saturation at 255 by the bits above the result, not a comparison.
                unit_sat.eq(Mux(unit[PROB_BITS:].any(), (1 << PROB_BITS) - 1, unit)),
                prob.eq(Mux(part[-1], unit_sat,
                            Mux(q9[PROB_BITS:].any(), (1 << PROB_BITS) - 1, q9))),
            ]
            probs.append(prob)
            units.append(unit_sat)
        nxt_buf4 = rotate(buf4, probs, "e4", EXP_BITS + 1)
        nxt_sum4 = Signal(partial_sum_bits(L))
        if deep:
            # The partial sum from the partial lanes (what prob is when the sum counts), so
            # that no path runs from the multiplier through the sum; the products a register
            # computed a cycle ahead from the lanes and R the stage holds in the next cycle.
            m.d.comb += nxt_sum4.eq(Mux(step & part[-1], sum4 + sum(units), sum4))
            recip4_nxt = Signal(RECIP_BITS + 1)
            m.d.comb += recip4_nxt.eq(Mux(boundary, recip, recip4))
            for p, prod in enumerate(prods):
                head = Signal(EXP_BITS + 1, name=f"e4_next{p}")
                m.d.comb += head.eq(Mux(boundary, bufs3[-1][p], advance(buf4, probs)[p]))
                with m.If(run):
                    m.d.sync += prod.eq(head * recip4_nxt)
        else:
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
                    *div_load,
                    recip4.eq(recip), k4.eq(k3),
                ]
                m.d.sync += [v[k + 1].eq(v[k]) for k in range(NS - 1)]
                m.d.sync += [last[k + 1].eq(last[k]) for k in range(NS - 1)]
                m.d.sync += [part[k + 1].eq(part[k]) for k in range(NS - 1)]
                for j in range(L):
                    m.d.sync += [
                        buf0[j].eq(self.i.payload.data[j]), msk0[j].eq(self.i.payload.mask[j]),
                        buf1[j].eq(nxt_buf0[j]), msk1[j].eq(nxt_msk0[j]),
                        buf2[j].eq(nxt_buf1[j]),
                        bufs3[0][j].eq(nxt_buf2[j]),
                        *(bufs3[k + 1][j].eq(bufs3[k][j]) for k in range(len(bufs3) - 1)),
                        buf4[j].eq(bufs3[-1][j]),
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
                    *div_hold,
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
