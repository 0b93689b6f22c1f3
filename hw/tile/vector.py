"""Vector unit: residual add, bias add, requantisation, ReLU, activation LUT, LayerNorm.

Works on vectors streamed ``lanes`` elements per beat; the numeric definitions (bit-exact) are
those of :mod:`sim.golden.vector`, the encodings those of :mod:`hw.spec.vector`.
"""

from amaranth.hdl import Const, Elaboratable, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..layouts import lanes_layout
from ..spec.vector import (
    GSHIFT_BITS,
    LENGTH_BITS,
    LN_D_MAX,
    LN_Z_BITS,
    LN_Z_FRAC_BITS,
    LUT_ENTRIES,
    N_BITS,
    RSQRT_FRAC_BITS,
    RSQRT_NEWTON_STEPS,
    RSQRT_SEED_BASE,
    RSQRT_SEED_SHIFT,
    VectorOp,
    rsqrt_seed_table,
)

__all__ = ["VectorUnit", "cmd_layout", "vec_layout", "out_layout", "stats_layout",
           "RSQRT_CYCLES", "op_cycles"]

#: Cycles the LayerNorm spends between its statistics and its first normalised beat:
#: D = n*S2 - S1^2, normalisation + table seed, then 3 multiplies per Newton step.
RSQRT_CYCLES = 2 + 3 * RSQRT_NEWTON_STEPS


def cmd_layout() -> data.StructLayout:
    """Payload of ``i_cmd`` (fields as in :class:`hw.spec.vector.VectorCmd`)."""
    return data.StructLayout({
        "op": unsigned(4),
        "length": unsigned(LENGTH_BITS),
        "n": unsigned(N_BITS),
        "mult": unsigned(16),
        "shift": unsigned(6),
        "gshift": unsigned(GSHIFT_BITS),
        "out16": unsigned(1),
        "per_channel": unsigned(1),
    })


def vec_layout(lanes: int) -> data.StructLayout:
    """Payload of ``i_a`` and ``i_b``: ``lanes`` x signed(32) plus ``last``."""
    return lanes_layout(signed(32), lanes)


def out_layout(lanes: int) -> data.StructLayout:
    """Payload of ``o_data``: ``data`` (``lanes`` x signed(32)), ``q`` (x signed(8)), ``last``."""
    return lanes_layout(signed(32), lanes, q=data.ArrayLayout(signed(8), lanes))


def stats_layout() -> data.StructLayout:
    """Payload of ``i_stats`` and ``o_stats``: ``[sum x, sum x^2]`` as 2 x signed(64), ``last``."""
    return lanes_layout(signed(64), 2)


def op_cycles(op: VectorOp, length: int, lanes: int) -> int:
    """Cycles from the ``i_cmd`` transfer to the last output transfer (LOAD_LUT: last input).

    With every input valid and every output ready. B = ceil(length / lanes) beats:
    element-wise ops B + 1, LN 2B + RSQRT_CYCLES + 1, LN_STATS B + 1,
    LN_APPLY B + RSQRT_CYCLES + 2, LOAD_LUT ceil(256 / lanes). One more cycle per command
    is spent in IDLE accepting the next command, so back-to-back element-wise vectors take
    B + 1 cycles each.
    """
    op = VectorOp(op)
    b = -(-length // lanes)
    if op is VectorOp.LOAD_LUT:
        return -(-LUT_ENTRIES // lanes)
    if op is VectorOp.LN:
        return 2 * b + RSQRT_CYCLES + 1
    if op is VectorOp.LN_APPLY:
        return b + RSQRT_CYCLES + 2
    return b + 1


def _clamp(m, value, bits, name):
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    out = Signal(signed(bits), name=name)
    with m.If(value > hi):
        m.d.comb += out.eq(hi)
    with m.Elif(value < lo):
        m.d.comb += out.eq(lo)
    with m.Else():
        m.d.comb += out.eq(value)
    return out


def _round_shift(value, amount):
    """``(value + ((1 << amount) >> 1)) >> amount``, arithmetic: rounds half up."""
    return (value + ((Const(1, 1) << amount) >> 1)) >> amount


def _requant(m, value, mult, shift, bits, name):
    """DESIGN.md §3: ``clamp((value * mult + (1 << (shift-1))) >> shift)`` to ``bits``."""
    return _clamp(m, _round_shift(value * mult, shift), bits, name)


class VectorUnit(wiring.Component):
    """Element-wise ops and LayerNorm on vectors streamed ``lanes`` elements per beat.

    One command on ``i_cmd`` processes one vector of ``length`` elements (``1..d_model_max``),
    carried as B = ceil(length / lanes) beats on each vector stream; the unit counts the beats
    from ``length`` and sets ``last`` on its final output beat (input ``last`` flags are not
    needed). Lanes past ``length`` in the final beat are ignored on input and 0 on output.

    Streams (:func:`hw.layouts.lanes_layout`; every data lane is a signed 32-bit container):

    ``i_cmd``: :func:`cmd_layout` (``op``, ``length``, ``n``, ``mult``, ``shift``, ``gshift``,
    ``out16``, ``per_channel``), see :class:`hw.spec.vector.VectorCmd`.
    ``i_a``: ``lanes`` x signed(32): the operand vector.
    ``i_b``: ``lanes`` x signed(32): second operand or per-lane parameters.
    ``i_stats``: 2 x signed(64): global ``[sum x (int32 range), sum x^2]`` for LN_APPLY.
    ``o_data``: ``lanes`` x signed(32) ``data`` plus ``q``: ``lanes`` x signed(8).
    ``o_stats``: 2 x signed(64): local ``[sum x, sum x^2]`` from LN_STATS, ``last`` = 1.

    ==========  ====================  ============================  ======================
    op          i_a (B beats)         i_b (B beats)                 output
    ==========  ====================  ============================  ======================
    ADD         int16 residual        int16 residual                data = clamp16(a + b)
    BIAS        int32 accumulator     int32 bias                    data = wrap32(a + b)
    REQUANT     int8/int16/int32      only if per_channel: packed   data = requant(a) to
                                      mult (bits 0-15), shift       int8, or int16 if
                                      (16-21)                       out16
    RELU        any                   --                            data = max(a, 0)
    LUT         int8 (low byte used)  --                            data = lut[a & 0xFF]
    LOAD_LUT    256 int8 entries      --                            -- (256/lanes beats)
    LN          int16 x               gamma (0-15), beta (16-31)    data = y16, q = q8
    LN_STATS    int16 x               --                            o_stats (1 beat)
    LN_APPLY    int16 x               gamma, beta                   data = y16, q = q8
    ==========  ====================  ============================  ======================

    LN_APPLY first takes one beat from ``i_stats`` and uses the command's ``n`` (the count over
    all chips); LN uses its own statistics and ``n = length``. Both run the one-pass integer
    formula of :mod:`sim.golden.vector` (n*S2 - S1^2, table-seeded rsqrt with two Newton steps),
    so statistics summed over chips give the full LayerNorm bit for bit. ``q8`` is
    ``requant(y16, mult, shift, 8)``: the int8 input of the next matmul, emitted with the int16
    result in the same beat (post-norm needs both).

    The activation LUT (256 x int8, indexed by the input's low byte) is programmable at run
    time by LOAD_LUT, as a compiler loads GELU for its scales; it resets to ReLU at unchanged
    scale. LN keeps its vector in an internal buffer (``ceil(d_model_max / lanes)`` words of
    ``lanes`` x int16), so the vector is streamed once; LN_STATS + LN_APPLY stream it twice.

    Timing (:func:`op_cycles`): element-wise ops run at one beat per cycle with one cycle of
    latency (registered output); LayerNorm adds :data:`RSQRT_CYCLES` cycles after its
    statistics, and LN reads its buffer back in a second pass of B cycles.
    Undefined (never emitted by the compiler): ``length`` 0 or above ``d_model_max`` for LN,
    ``shift`` outside 1..47.
    """

    def __init__(self, *, lanes: int, d_model_max: int):
        if not isinstance(lanes, int) or isinstance(lanes, bool):
            raise TypeError(f"lanes must be an integer, not {lanes!r}")
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, not {lanes!r}")
        if not isinstance(d_model_max, int) or isinstance(d_model_max, bool):
            raise TypeError(f"d_model_max must be an integer, not {d_model_max!r}")
        if not 1 <= d_model_max < 1 << LENGTH_BITS:
            raise ValueError(f"d_model_max must be in [1, {(1 << LENGTH_BITS) - 1}], "
                             f"not {d_model_max!r}")
        self._lanes = lanes
        self._d_model_max = d_model_max
        super().__init__({
            "i_cmd": In(stream.Signature(cmd_layout())),
            "i_a": In(stream.Signature(vec_layout(lanes))),
            "i_b": In(stream.Signature(vec_layout(lanes))),
            "i_stats": In(stream.Signature(stats_layout())),
            "o_data": Out(stream.Signature(out_layout(lanes))),
            "o_stats": Out(stream.Signature(stats_layout())),
        })

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def d_model_max(self) -> int:
        return self._d_model_max

    @property
    def buffer_depth(self) -> int:
        return -(-self._d_model_max // self._lanes)

    def elaborate(self, platform) -> Elaboratable:
        m = Module()
        lanes = self._lanes
        depth = self.buffer_depth

        cmd = Signal(cmd_layout())
        remaining = Signal(LENGTH_BITS + 1)   # elements still to come in this pass
        beat = Signal(range(max(depth, LUT_ENTRIES) + 1))
        last_beat = Signal()
        m.d.comb += last_beat.eq(remaining <= lanes)
        lane_ok = [Signal(name=f"lane_ok{j}") for j in range(lanes)]
        m.d.comb += [ok.eq(remaining > j) for j, ok in enumerate(lane_ok)]

        # LayerNorm state: statistics, count, rsqrt result.
        s1 = Signal(signed(32))
        s2 = Signal(signed(64))
        n = Signal(N_BITS)
        d = Signal(62)
        m_norm = Signal(32)
        y_r = Signal(RSQRT_FRAC_BITS + 2)
        y2 = Signal(RSQRT_FRAC_BITS + 2)
        my2 = Signal(RSQRT_FRAC_BITS + 3)
        zs = Signal(6)                          # z = (t * Y) >> zs, zs = 23 + h
        step = Signal(range(RSQRT_CYCLES))

        m.submodules.lut = lut = memory.Memory(
            shape=signed(8), depth=LUT_ENTRIES,
            init=[max(i if i < 128 else i - 256, 0) for i in range(LUT_ENTRIES)])
        lut_w = [lut.write_port() for _ in range(lanes)]
        lut_r = [lut.read_port(domain="comb") for _ in range(lanes)]

        m.submodules.buf = buf = memory.Memory(
            shape=data.ArrayLayout(signed(16), lanes), depth=depth, init=[])
        buf_w = buf.write_port()
        buf_r = buf.read_port()

        a, b, o = self.i_a.payload.data, self.i_b.payload.data, self.o_data
        op = cmd.op

        # Output register: loaded by `o_load`, drained by the consumer.
        o_free = Signal()
        o_load = Signal()
        m.d.comb += o_free.eq(~o.valid | o.ready)
        with m.If(o_load):
            m.d.sync += [o.valid.eq(1), o.payload.last.eq(last_beat)]
        with m.Elif(o.ready):
            m.d.sync += o.valid.eq(0)

        def out_lanes(values, qs=None):
            for j in range(lanes):
                m.d.sync += o.payload.data[j].eq(Mux(lane_ok[j], values[j], 0))
                m.d.sync += o.payload.q[j].eq(0 if qs is None else Mux(lane_ok[j], qs[j], 0))

        # ---- element-wise datapath ---------------------------------------------------------
        elem = []
        for j in range(lanes):
            mult = Signal(16, name=f"mult{j}")
            shift = Signal(6, name=f"shift{j}")
            with m.If(cmd.per_channel):
                m.d.comb += [mult.eq(b[j][0:16]), shift.eq(b[j][16:22])]
            with m.Else():
                m.d.comb += [mult.eq(cmd.mult), shift.eq(cmd.shift)]
            m.d.comb += [lut_r[j].addr.eq(a[j][0:8])]
            add = _clamp(m, a[j] + b[j], 16, f"add{j}")
            rq8 = _requant(m, a[j], mult, shift, 8, f"rq8_{j}")
            rq16 = _requant(m, a[j], mult, shift, 16, f"rq16_{j}")
            value = Signal(signed(32), name=f"elem{j}")
            with m.Switch(op):
                with m.Case(VectorOp.ADD):
                    m.d.comb += value.eq(add)
                with m.Case(VectorOp.BIAS):
                    m.d.comb += value.eq(a[j] + b[j])
                with m.Case(VectorOp.REQUANT):
                    with m.If(cmd.out16):
                        m.d.comb += value.eq(rq16)
                    with m.Else():
                        m.d.comb += value.eq(rq8)
                with m.Case(VectorOp.RELU):
                    m.d.comb += value.eq(0)
                    with m.If(a[j] > 0):
                        m.d.comb += value.eq(a[j])
                with m.Case(VectorOp.LUT):
                    m.d.comb += value.eq(lut_r[j].data)
            elem.append(value)

        # ---- LayerNorm datapath --------------------------------------------------------------
        x_src = Signal(data.ArrayLayout(signed(16), lanes))
        with m.If(op == VectorOp.LN):
            m.d.comb += x_src.eq(buf_r.data)
        with m.Else():
            m.d.comb += [x_src[j].eq(a[j][0:16]) for j in range(lanes)]
        ln_y16, ln_q8 = [], []
        for j in range(lanes):
            gamma = b[j][0:16].as_signed()
            beta = b[j][16:32].as_signed()
            t = n * x_src[j] - s1
            z = _clamp(m, _round_shift(t * y_r, zs), LN_Z_BITS, f"z{j}")
            y = _round_shift(z * gamma, cmd.gshift) + beta
            y16 = _clamp(m, y, 16, f"y16_{j}")
            ln_y16.append(y16)
            ln_q8.append(_requant(m, y16, cmd.mult, cmd.shift, 8, f"q8_{j}"))

        # Statistics of the incoming beat (lanes past `length` count as 0).
        xa = [Signal(signed(16), name=f"xa{j}") for j in range(lanes)]
        m.d.comb += [xa[j].eq(Mux(lane_ok[j], a[j][0:16], 0)) for j in range(lanes)]
        beat_s1 = sum(xa[1:], xa[0])
        beat_s2 = sum((x * x for x in xa[1:]), xa[0] * xa[0])

        need_b = Signal()
        m.d.comb += need_b.eq((op == VectorOp.ADD) | (op == VectorOp.BIAS)
                              | ((op == VectorOp.REQUANT) & cmd.per_channel))
        m.d.comb += [buf_w.addr.eq(beat), buf_r.addr.eq(beat)]
        m.d.comb += [buf_w.data[j].eq(xa[j]) for j in range(lanes)]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i_cmd.ready.eq(1)
                with m.If(self.i_cmd.valid):
                    p = self.i_cmd.payload
                    m.d.sync += [cmd.eq(p), beat.eq(0), s1.eq(0), s2.eq(0), n.eq(p.length),
                                 remaining.eq(p.length)]
                    with m.Switch(p.op):
                        with m.Case(VectorOp.LOAD_LUT):
                            m.d.sync += remaining.eq(LUT_ENTRIES)
                            m.next = "LOAD"
                        with m.Case(VectorOp.LN, VectorOp.LN_STATS):
                            m.next = "ACC"
                        with m.Case(VectorOp.LN_APPLY):
                            m.d.sync += n.eq(p.n)
                            m.next = "GET_STATS"
                        with m.Default():
                            m.next = "ELEM"

            with m.State("ELEM"):
                m.d.comb += [
                    self.i_a.ready.eq(o_free & (~need_b | self.i_b.valid)),
                    self.i_b.ready.eq(need_b & o_free & self.i_a.valid),
                ]
                with m.If(self.i_a.valid & self.i_a.ready):
                    m.d.comb += o_load.eq(1)
                    out_lanes(elem)
                    m.d.sync += remaining.eq(remaining - lanes)
                    with m.If(last_beat):
                        m.next = "IDLE"

            with m.State("LOAD"):
                m.d.comb += self.i_a.ready.eq(1)
                for j in range(lanes):
                    m.d.comb += [lut_w[j].addr.eq(beat + j), lut_w[j].data.eq(a[j][0:8]),
                                 lut_w[j].en.eq(self.i_a.valid & lane_ok[j])]
                with m.If(self.i_a.valid):
                    m.d.sync += [beat.eq(beat + lanes), remaining.eq(remaining - lanes)]
                    with m.If(last_beat):
                        m.next = "IDLE"

            with m.State("ACC"):
                m.d.comb += self.i_a.ready.eq(1)
                with m.If(self.i_a.valid):
                    m.d.comb += buf_w.en.eq(op == VectorOp.LN)
                    m.d.sync += [s1.eq(s1 + beat_s1), s2.eq(s2 + beat_s2),
                                 beat.eq(beat + 1), remaining.eq(remaining - lanes)]
                    with m.If(last_beat):
                        with m.If(op == VectorOp.LN):
                            m.d.sync += step.eq(0)
                            m.next = "RSQRT"
                        with m.Else():
                            m.next = "STATS"

            with m.State("STATS"):
                m.d.comb += [self.o_stats.valid.eq(1),
                             self.o_stats.payload.data[0].eq(s1),
                             self.o_stats.payload.data[1].eq(s2),
                             self.o_stats.payload.last.eq(1)]
                with m.If(self.o_stats.ready):
                    m.next = "IDLE"

            with m.State("GET_STATS"):
                m.d.comb += self.i_stats.ready.eq(1)
                with m.If(self.i_stats.valid):
                    m.d.sync += [s1.eq(self.i_stats.payload.data[0][0:32]),
                                 s2.eq(self.i_stats.payload.data[1]),
                                 step.eq(0)]
                    m.next = "RSQRT"

            with m.State("RSQRT"):
                m.d.sync += [step.eq(step + 1), beat.eq(0), remaining.eq(cmd.length)]
                self._rsqrt(m, step, n, s1, s2, d, m_norm, y_r, y2, my2, zs)
                with m.If(step == RSQRT_CYCLES - 1):
                    m.next = "NORM"

            with m.State("NORM"):
                from_buf = op == VectorOp.LN
                m.d.comb += [
                    self.i_a.ready.eq(~from_buf & o_free & self.i_b.valid),
                    self.i_b.ready.eq(o_free & (from_buf | self.i_a.valid)),
                ]
                with m.If(self.i_b.valid & self.i_b.ready):
                    m.d.comb += o_load.eq(1)
                    out_lanes(ln_y16, ln_q8)
                    m.d.sync += [remaining.eq(remaining - lanes), beat.eq(beat + 1)]
                    # The buffer's read port is synchronous: present the next address now.
                    with m.If(~last_beat):
                        m.d.comb += buf_r.addr.eq(beat + 1)
                    with m.If(last_beat):
                        m.next = "IDLE"
        return m

    @staticmethod
    def _rsqrt(m, step, n, s1, s2, d, m_norm, y_r, y2, my2, zs):
        """Fixed-latency rsqrt of D = n*S2 - S1^2, as :func:`sim.golden.vector.rsqrt_fixed`."""
        q = RSQRT_FRAC_BITS
        with m.Switch(step):
            with m.Case(0):
                full = Signal(signed(96))
                m.d.comb += full.eq(n * s2 - s1 * s1)
                with m.If(full < 0):
                    m.d.sync += d.eq(0)
                with m.Elif(full > LN_D_MAX):
                    m.d.sync += d.eq(LN_D_MAX)
                with m.Else():
                    m.d.sync += d.eq(full)
            with m.Case(1):
                # Normalise D to m in [2**30, 2**32) by an even shift s = 2h (zs = 23 + h),
                # one constant shift per bit length e of D; seed Y from m's top 7 bits.
                norm = Signal(32)
                m.d.comb += norm.eq(0)
                m.d.sync += zs.eq(RSQRT_FRAC_BITS + 15 - LN_Z_FRAC_BITS)
                with m.Switch(d):
                    for e in range(62, 0, -1):
                        s = e - 31 if (e - 31) % 2 == 0 else e - 32
                        pattern = "0" * (62 - e) + "1" + "-" * (e - 1)
                        with m.Case(pattern):
                            m.d.comb += norm.eq(d >> s if s >= 0 else d << -s)
                            m.d.sync += zs.eq(RSQRT_FRAC_BITS + 15 - LN_Z_FRAC_BITS + s // 2)
                m.d.sync += [m_norm.eq(norm), y_r.eq(0)]
                table = rsqrt_seed_table()
                with m.Switch(norm[RSQRT_SEED_SHIFT:32]):
                    for i, seed in enumerate(table):
                        with m.Case(i + RSQRT_SEED_BASE):
                            m.d.sync += y_r.eq(seed)
            for k in range(RSQRT_NEWTON_STEPS):
                with m.Case(2 + 3 * k):
                    m.d.sync += y2.eq((y_r * y_r) >> q)
                with m.Case(3 + 3 * k):
                    m.d.sync += my2.eq((m_norm * y2) >> 30)
                with m.Case(4 + 3 * k):
                    m.d.sync += y_r.eq((y_r * (Const(3 << q) - my2)) >> (q + 1))
