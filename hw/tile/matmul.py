"""Systolic int8 matmul array, requantiser, and the two wired together.

Number formats follow ``hw.spec.formats``; the golden model is
``sim.golden.matmul``.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..arith import lut_product, shift_round_saturate
from ..layouts import lanes_layout
from ..spec.formats import ACC_BITS, BIAS_BITS, MULT_BITS, SHIFT_BITS, OutMode
from ..spec.timing.chip import check_built
from ..spec.timing.matmul import REQUANT_LATENCY, array_latency, unit_latency

#: Low bits of the requantiser's 32-bit operand taken unsigned into the first DSP: 17 + 1 sign
#: bit fit an 18x18 multiplier, and the high 15 bits (signed) the second.
LO_BITS = 17

__all__ = ["MatmulArray", "Requantizer", "MatmulUnit", "a_layout", "b_layout", "acc_layout",
           "param_layout"]


class _Lanes(wiring.Component):
    """A component ``size`` lanes wide, its signature ``members(size)``, built once ``size`` is
    checked."""

    def __init__(self, size, members):
        if not isinstance(size, int) or isinstance(size, bool) or size < 2:
            raise ValueError(f"Array size must be an integer of at least 2, not {size!r}")
        self._size = size
        super().__init__(members(size))

    @property
    def size(self):
        return self._size


def a_layout(size):
    """A operand beat: column ``k`` of an A tile (``size`` rows), its mode, and ``last``."""
    return lanes_layout(signed(8), size, unsigned=1)


def b_layout(size):
    """B operand beat: row ``k`` of a B tile (``size`` columns)."""
    return data.StructLayout({"data": data.ArrayLayout(signed(8), size)})


def acc_layout(size):
    """One row of an output tile, int32 lanes; ``last`` marks the tile's final row."""
    return lanes_layout(signed(ACC_BITS), size)


def param_layout(size):
    """Per-tile post-processing parameters: one bias, mult and shift per output column."""
    return data.StructLayout({
        "bias": data.ArrayLayout(signed(BIAS_BITS), size),
        "mult": data.ArrayLayout(unsigned(MULT_BITS), size),
        "shift": data.ArrayLayout(unsigned(SHIFT_BITS), size),
        "mode": unsigned(2),  # an OutMode
    })


class MatmulArray(_Lanes):
    """Output-stationary ``size`` x ``size`` systolic array: int8 x int8 -> int32.

    Computes ``C = A @ B`` for one output tile per *fold*: A is ``size`` x K, B is K x ``size``,
    K >= 1 free per fold. Products are 9 x 8-bit signed (the A operand is sign- or zero-extended
    by the beat's ``unsigned`` flag) and accumulate in int32, wrapping modulo 2**32.

    Dataflow
    --------
    Beat ``k`` of a fold carries column k of A on ``i_a`` and row k of B on ``i_b``; the pair
    is taken when both are valid (the streams are joined). Row ``i`` of A enters PE row ``i``
    through ``i + 1`` skew registers and moves right; column ``j`` of B enters PE column ``j``
    through ``j + 1`` skew registers and moves down, so that A[i, k] and B[k, j] meet in
    PE(i, j). The beat's ``last`` flag travels with A: when PE(i, j) sees it, it moves its
    finished sum into a hold register and restarts accumulation, so the next fold streams in
    with no gap. When the last beat reaches the bottom PE of column j, the column's hold
    registers are copied in parallel into a shift chain that moves the column out upwards, one
    element per cycle (results are shifted out; there is no N²:1 read-out multiplexer). Columns
    leave skewed by one cycle each and are deskewed into whole rows on ``o``: row 0 of the tile
    first, ``last`` on row ``size - 1``.

    Timing (no stalls; cycle 0 is the cycle the first beat of the fold is taken)
    -------------------------------------------------------------------------------
    - Row ``r`` of the tile is on ``o`` in cycle ``K + 2*size + r``: a lone fold takes
      ``K + 3*size`` cycles from its first input to its last output row (``o`` is driven by the
      deskew registers directly).
    - Folds overlap completely: fold f + 1 may start the cycle after fold f's last beat, so F
      back-to-back folds of K beats take ``F*K + 3*size`` cycles (one beat per cycle,
      ``size``² MACs per cycle in steady state).
    - A fold's last beat is taken no earlier than ``size`` cycles after the previous fold's
      last beat (the hold registers and the shift chain must be free): folds with K < ``size``
      are padded with idle cycles by ``ready``, so throughput is ``min(1, K/size)`` folds per
      ``K`` cycles. Nothing is ever overwritten.
    - Backpressure on ``o`` stalls the whole array (one clock enable), so no result is dropped;
      an idle input cycle inserts a bubble that carries no data.

    Products: ``pe_dsp=False`` (default) builds each PE's 9 x 8 product from LUTs and carry
    chains (:func:`hw.arith.lut_product`), ``pe_dsp=True`` as a multiplication that synthesis
    maps to one 18 x 18 DSP per PE (an FPGA build whose DSPs suffice: ``hw.fpga.board``). The
    function and the timing are the same. Either way a PE registers its product (with the beat's
    ``valid`` and ``last``) and accumulates it in the next cycle; the bottom row's finished
    sums go from its adders straight into the column's shift chain, so the register costs no
    cycle.

    Members
    -------
    i_a : ``In(stream.Signature(a_layout(size)))``
        ``data[i]`` = A[i, k] as a raw byte; ``unsigned`` = 1 reads it as 0..255 (softmax
        probabilities), 0 as -128..127. ``last`` = 1 on the fold's final beat (k = K - 1).
    i_b : ``In(stream.Signature(b_layout(size)))``
        ``data[j]`` = B[k, j].
    o : ``Out(stream.Signature(acc_layout(size)))``
        Row ``r`` of the output tile, ``data[j]`` = C[r, j] (int32, wrapped).
    """

    def __init__(self, *, size, pe_dsp=False):
        self._pe_dsp = bool(pe_dsp)
        super().__init__(size, lambda size: {
            "i_a": In(stream.Signature(a_layout(size))),
            "i_b": In(stream.Signature(b_layout(size))),
            "o": Out(stream.Signature(acc_layout(size))),
        })

    @property
    def pe_dsp(self):
        return self._pe_dsp

    @staticmethod
    def latency(size, k):
        """Cycles from a fold's first input beat to its last output row, inclusive
        (:func:`hw.spec.timing.matmul.array_latency`)."""
        return array_latency(size, k)

    def elaborate(self, platform):
        m = Module()
        n = self._size

        # One clock enable for everything: the pipeline moves unless the output is blocked.
        en = Signal()
        m.d.comb += en.eq(~self.o.valid | self.o.ready)

        # A fold's last beat must wait until the previous fold's hold registers are free.
        since_last = Signal(range(n + 1), init=n)
        last_ok = Signal()
        m.d.comb += last_ok.eq((since_last == n) | ~self.i_a.payload.last)
        take = Signal()
        m.d.comb += [
            take.eq(en & self.i_a.valid & self.i_b.valid & last_ok),
            self.i_a.ready.eq(en & self.i_b.valid & last_ok),
            self.i_b.ready.eq(en & self.i_a.valid & last_ok),
        ]
        with m.If(en):
            with m.If(take & self.i_a.payload.last):
                m.d.sync += since_last.eq(1)
            with m.Elif(since_last != n):
                m.d.sync += since_last.eq(since_last + 1)

        # Edge of the array: extend A to 9-bit signed per the beat's mode.
        a_edge = [Signal(signed(9), name=f"a_edge{i}") for i in range(n)]
        for i in range(n):
            byte = self.i_a.payload.data[i]
            ext = Mux(self.i_a.payload.unsigned, 0, byte[7])
            m.d.comb += a_edge[i].eq(Cat(byte, ext).as_signed())

        def delay_line(value, stages, name):
            """``stages`` registers behind ``value`` (advancing on ``en``); returns the tail."""
            for s in range(stages):
                reg = Signal.like(value, name=f"{name}_d{s}")
                with m.If(en):
                    m.d.sync += reg.eq(value)
                value = reg
            return value

        # Skew lines: row i and column j enter through i + 1 and j + 1 registers.
        a_in, v_in, l_in, b_in = {}, {}, {}, {}
        for i in range(n):
            a_in[i, 0] = delay_line(a_edge[i], i + 1, f"a_skew{i}")
            v_in[i, 0] = delay_line(take, i + 1, f"v_skew{i}")
            l_in[i, 0] = delay_line(take & self.i_a.payload.last, i + 1, f"l_skew{i}")
        for j in range(n):
            b_in[0, j] = delay_line(self.i_b.payload.data[j], j + 1, f"b_skew{j}")

        res = {}
        col_done = {}
        for i in range(n):
            for j in range(n):
                a, v, last, b = a_in[i, j], v_in[i, j], l_in[i, j], b_in[i, j]
                a_out = Signal(signed(9), name=f"pe{i}_{j}_a")
                v_out = Signal(name=f"pe{i}_{j}_v")
                l_out = Signal(name=f"pe{i}_{j}_l")
                b_out = Signal(signed(8), name=f"pe{i}_{j}_b")
                acc = Signal(signed(ACC_BITS), name=f"pe{i}_{j}_acc")
                hold = Signal(signed(ACC_BITS), name=f"pe{i}_{j}_hold")
                prod = Signal(signed(17), name=f"pe{i}_{j}_prod")
                # LUTs unless pe_dsp: the chip's other units may need the ECP5-85k's 156
                # DSPs, and a 9x8 product takes a whole 18x18 one.
                m.d.comb += prod.eq(a * b if self._pe_dsp else
                                    lut_product(a, b, m=m, name=f"pe{i}_{j}_pp"))
                # The product is registered with its beat's flags and accumulated a cycle
                # later: the multiplier and the accumulator's carry chain are not one path.
                prod_r = Signal(signed(17), name=f"pe{i}_{j}_prod_r")
                v_r = Signal(name=f"pe{i}_{j}_v_r")
                l_r = Signal(name=f"pe{i}_{j}_l_r")
                total = Signal(signed(ACC_BITS), name=f"pe{i}_{j}_sum")
                m.d.comb += total.eq(acc + prod_r)
                with m.If(en):
                    m.d.sync += [prod_r.eq(prod), v_r.eq(v), l_r.eq(last)]
                    if j + 1 < n:
                        m.d.sync += [a_out.eq(a), v_out.eq(v), l_out.eq(last)]
                    if i + 1 < n:
                        m.d.sync += b_out.eq(b)
                    with m.If(v_r):
                        with m.If(l_r):
                            m.d.sync += acc.eq(0)
                            if i + 1 < n:
                                m.d.sync += hold.eq(total)
                        with m.Else():
                            m.d.sync += acc.eq(total)
                a_in[i, j + 1], v_in[i, j + 1], l_in[i, j + 1] = a_out, v_out, l_out
                b_in[i + 1, j] = b_out
                # The bottom row's sum is final in the cycle its column loads (below), one
                # cycle after its last beat: the load takes it from the adder, so the product
                # register costs no cycle. The rows above finished earlier, into ``hold``.
                res[i, j] = hold if i + 1 < n else total
                if i == n - 1:
                    col_done[j] = v & last

        # Per column: copy the hold registers into a shift chain once the bottom PE is done,
        # then shift up one element per cycle.
        col_out = []
        for j in range(n):
            load = Signal(name=f"col{j}_load")
            with m.If(en):
                m.d.sync += load.eq(col_done[j])
            sh = [Signal(signed(ACC_BITS), name=f"col{j}_sh{i}") for i in range(n)]
            sv = [Signal(name=f"col{j}_sv{i}") for i in range(n)]
            sl = [Signal(name=f"col{j}_sl{i}") for i in range(n)]
            with m.If(en):
                with m.If(load):
                    for i in range(n):
                        m.d.sync += [sh[i].eq(res[i, j]), sv[i].eq(1), sl[i].eq(i == n - 1)]
                with m.Else():
                    for i in range(n):
                        if i + 1 < n:
                            m.d.sync += [sh[i].eq(sh[i + 1]), sv[i].eq(sv[i + 1]),
                                         sl[i].eq(sl[i + 1])]
                        else:
                            m.d.sync += [sv[i].eq(0), sl[i].eq(0)]
            # Deskew: column j leaves j cycles after column 0; delay it by n - 1 - j.
            col_out.append((delay_line(sh[0], n - 1 - j, f"col{j}_deskew"),
                            delay_line(sv[0], n - 1 - j, f"col{j}_vdeskew"),
                            delay_line(sl[0], n - 1 - j, f"col{j}_ldeskew")))

        # The deskewed columns are registers already: they are the output (an output register
        # behind them would only add a cycle; the requantiser's DSP stage uses it instead).
        m.d.comb += [
            self.o.valid.eq(col_out[0][1]),
            self.o.payload.last.eq(col_out[0][2]),
        ]
        for j in range(n):
            m.d.comb += self.o.payload.data[j].eq(col_out[j][0])
        return m


class Requantizer(_Lanes):
    """Per-column bias add and requantisation of output tiles (``hw.spec.formats``).

    For every row of a tile and every column j::

        y = wrap32(acc[j] + bias[j])
        RAW:   out[j] = y
        INT8:  out[j] = clamp((y * mult[j] + (1 << (shift[j] - 1))) >> shift[j], -128, 127)
        INT16: same, clamped to -32768..32767

    with ``>>`` arithmetic; the 49-bit product is exact and the result saturates, never wraps.
    ``shift`` must be 1..47 in INT8/INT16 modes (the compiler guarantees it; 0 or > 47 gives
    an unspecified value, never a hang). Bit-exact with ``sim.golden.matmul.matmul_unit``.

    One ``i_param`` beat applies to one tile: it must be valid while the tile's rows pass and
    is consumed with the tile's ``last`` row.

    Timing: four pipeline stages (bias add; the two partial products, one DSP each, with
    registered inputs and outputs; their sum, shifted keeping the bit below the result, ``w =
    (v << 1) >> shift``, by shift's multiple of 8; the rest of the shift, the rounding ``(w +
    1) >> 1``, which is ``(v + 2**(shift-1)) >> shift``, and the saturation, tested on ``w``'s
    bits: :func:`hw.arith.shift_round_saturate`); one
    row per cycle; a row taken in cycle t is on ``o`` in cycle t + 4
    (:data:`hw.spec.timing.matmul.REQUANT_LATENCY`). Backpressure on ``o`` stalls all stages.

    Members
    -------
    i : ``In(stream.Signature(acc_layout(size)))``
    i_param : ``In(stream.Signature(param_layout(size)))``
    o : ``Out(stream.Signature(acc_layout(size)))``
        Values within the range of the mode (int32 for RAW).
    """

    #: The pipeline stages :meth:`elaborate` builds, in order: ``REQUANT_LATENCY`` of them
    #: (checked at construction).
    _STAGES = ("bias add", "partial products", "sum and coarse shift",
               "fine shift, rounding and saturation")

    def __init__(self, *, size):
        check_built("REQUANT_LATENCY", REQUANT_LATENCY, len(self._STAGES),
                    f"stages ({', '.join(self._STAGES)})", "hw/tile/matmul.py")
        super().__init__(size, lambda size: {
            "i": In(stream.Signature(acc_layout(size))),
            "i_param": In(stream.Signature(param_layout(size))),
            "o": Out(stream.Signature(acc_layout(size))),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._size
        par = self.i_param.payload

        en = Signal()
        take = Signal()
        m.d.comb += [
            en.eq(~self.o.valid | self.o.ready),
            take.eq(en & self.i.valid & self.i_param.valid),
            self.i.ready.eq(en & self.i_param.valid),
            self.i_param.ready.eq(en & self.i.valid & self.i.payload.last),
        ]

        # Stage 1: bias add (wrapping, as the int32 accumulator does).
        v1, l1 = Signal(), Signal()
        mode1 = Signal(2)
        y1 = [Signal(signed(ACC_BITS), name=f"y1_{j}") for j in range(n)]
        mult1 = [Signal(unsigned(MULT_BITS), name=f"mult1_{j}") for j in range(n)]
        shift1 = [Signal(unsigned(SHIFT_BITS), name=f"shift1_{j}") for j in range(n)]
        # Stage 2: the two partial products of y * mult, each one 18x18 DSP with registered
        # inputs and outputs (low 17 bits of y unsigned, high 15 bits signed).
        v2, l2 = Signal(), Signal()
        mode2 = Signal(2)
        raw2 = [Signal(signed(ACC_BITS), name=f"raw2_{j}") for j in range(n)]
        lo2 = [Signal(unsigned(LO_BITS + MULT_BITS), name=f"lo2_{j}") for j in range(n)]
        hi2 = [Signal(signed(ACC_BITS - LO_BITS + MULT_BITS), name=f"hi2_{j}") for j in range(n)]
        shift2 = [Signal(unsigned(SHIFT_BITS), name=f"shift2_{j}") for j in range(n)]
        # Stage 3: the exact product v (49 bits) shifted keeping the bit below the result,
        # w = (v << 1) >> shift, in two steps: by shift's multiple of 8 here, by the rest in
        # stage 4 (two 8-way multiplexers, one per stage, rather than a 48-way one after the
        # adder).
        v3, l3 = Signal(), Signal()
        mode3 = Signal(2)
        raw3 = [Signal(signed(ACC_BITS), name=f"raw3_{j}") for j in range(n)]
        w3 = [Signal(signed(ACC_BITS + MULT_BITS + 2), name=f"w3_{j}") for j in range(n)]
        fine3 = [Signal(3, name=f"fine3_{j}") for j in range(n)]

        # The combinational logic (the product's adder, the shifter, the rounding and the
        # saturation) is driven outside ``m.If(en)``: a ``comb`` signal assigned under the
        # enable is gated by it (0 when it is low), which put the enable, fanned out to every
        # lane, in front of the carry chains instead of only on the registers' clock enables.
        w3_next, out = [], []
        for j in range(n):
            # v = (hi << 17) + lo: one carry chain over the bits from 17 up; the low 17 are lo's.
            top = Signal(signed(ACC_BITS + MULT_BITS + 1 - LO_BITS), name=f"top2_{j}")
            m.d.comb += top.eq(hi2[j] + (lo2[j] >> LO_BITS))
            product = Cat(lo2[j][:LO_BITS], top).as_signed()
            w3_next.append(Signal(signed(ACC_BITS + MULT_BITS + 2), name=f"w3_next{j}"))
            m.d.comb += w3_next[j].eq((product << 1) >> Cat(Const(0, 3), shift2[j][3:]))
            out.append(Signal(signed(ACC_BITS), name=f"out_{j}"))
            q8 = shift_round_saturate(m, w3[j], fine3[j], 8, f"q8_{j}")
            q16 = shift_round_saturate(m, w3[j], fine3[j], 16, f"q16_{j}")
            with m.Switch(mode3):
                with m.Case(OutMode.INT8):
                    m.d.comb += out[j].eq(q8)
                with m.Case(OutMode.INT16):
                    m.d.comb += out[j].eq(q16)
                with m.Default():
                    m.d.comb += out[j].eq(raw3[j])

        with m.If(en):
            m.d.sync += [v1.eq(take), l1.eq(self.i.payload.last), mode1.eq(par.mode),
                         v2.eq(v1), l2.eq(l1), mode2.eq(mode1),
                         v3.eq(v2), l3.eq(l2), mode3.eq(mode2),
                         self.o.valid.eq(v3), self.o.payload.last.eq(l3)]
            for j in range(n):
                acc = self.i.payload.data[j]
                m.d.sync += [
                    y1[j].eq((acc + par.bias[j])[:ACC_BITS].as_signed()),
                    mult1[j].eq(par.mult[j]),
                    shift1[j].eq(par.shift[j]),
                    raw2[j].eq(y1[j]),
                    lo2[j].eq(y1[j][:LO_BITS] * mult1[j]),
                    hi2[j].eq(y1[j][LO_BITS:].as_signed() * mult1[j]),
                    shift2[j].eq(shift1[j]),
                    raw3[j].eq(raw2[j]),
                    w3[j].eq(w3_next[j]),
                    fine3[j].eq(shift2[j][:3]),
                    self.o.payload.data[j].eq(out[j]),
                ]
        return m


class MatmulUnit(_Lanes):
    """:class:`MatmulArray` followed by :class:`Requantizer`: the chip's matmul unit.

    Timing: a lone fold of K beats has row ``r`` of its tile on ``o`` in cycle
    ``K + 2*size + 4 + r`` after its first beat is taken (``K + 3*size + 4`` cycles first input to
    last output); back-to-back folds as :class:`MatmulArray`.

    ``pe_dsp``: as :class:`MatmulArray`'s.

    Members
    -------
    i_a, i_b : as :class:`MatmulArray`
    i_param : as :class:`Requantizer` (one beat per output tile)
    o : requantised rows of each output tile
    """

    def __init__(self, *, size, pe_dsp=False):
        self._pe_dsp = bool(pe_dsp)
        super().__init__(size, lambda size: {
            "i_a": In(stream.Signature(a_layout(size))),
            "i_b": In(stream.Signature(b_layout(size))),
            "i_param": In(stream.Signature(param_layout(size))),
            "o": Out(stream.Signature(acc_layout(size))),
        })

    @property
    def pe_dsp(self):
        return self._pe_dsp

    @staticmethod
    def latency(size, k):
        """Cycles from a lone fold's first input beat to its last output row, inclusive
        (:func:`hw.spec.timing.matmul.unit_latency`)."""
        return unit_latency(size, k)

    def elaborate(self, platform):
        m = Module()
        m.submodules.array = array = MatmulArray(size=self._size, pe_dsp=self._pe_dsp)
        m.submodules.requant = requant = Requantizer(size=self._size)
        connect(m, flipped(self.i_a), array.i_a)
        connect(m, flipped(self.i_b), array.i_b)
        connect(m, array.o, requant.i)
        connect(m, flipped(self.i_param), requant.i_param)
        connect(m, requant.o, flipped(self.o))
        return m
