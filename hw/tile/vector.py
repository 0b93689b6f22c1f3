"""Vector unit: residual add, bias add, requantisation, ReLU, activation LUT, LayerNorm,
RMSNorm, int16 GELU, argmax and one-hot rows.

Works on vectors streamed ``lanes`` elements per beat; the numeric definitions (bit-exact) are
those of :mod:`sim.golden.vector`, the encodings those of :mod:`hw.spec.vector`.
"""

from types import SimpleNamespace

from amaranth.hdl import (
    Array,
    Cat,
    Const,
    Elaboratable,
    Module,
    Mux,
    Signal,
    Value,
    signed,
    unsigned,
)
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..arith import round_saturate, saturate, tree_sum
from ..dsp import RegisteredMul
from ..layouts import lanes_layout
from ..spec.timing.vector import check_pipeline, latency, rsqrt_cycles, stats_cycles
from ..spec.vector import (
    GELU16_KNOTS,
    GELU16_ZERO,
    GSHIFT_BITS,
    LENGTH_BITS,
    LN_D_MAX,
    LN_Z_BITS,
    LN_Z_FRAC_BITS,
    LUT_ENTRIES,
    N_BITS,
    RMS_OPS,
    RSQRT_FRAC_BITS,
    RSQRT_NEWTON_STEPS,
    RSQRT_SEED_BASE,
    RSQRT_SEED_SHIFT,
    VectorOp,
    rsqrt_seed_table,
    twin_of,
)
from .lane_table import LaneTable

__all__ = ["VectorUnit", "cmd_layout", "vec_layout", "out_layout", "stats_layout"]

def _lane_ports(table):
    """A :class:`LaneTable`'s ports per lane, named like a memory's write and read ports."""
    writes = [SimpleNamespace(addr=table.w_addr[j], data=table.w_data[j], en=table.w_en[j])
              for j in range(len(table.w_en))]
    reads = [SimpleNamespace(addr=table.r_addr[j], data=table.r_data[j])
             for j in range(len(table.r_addr))]
    return writes, reads


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
        "pairs": unsigned(1),
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


def _clamp(m, value, bits, name):
    return saturate(m, value, bits, name)


def _round_shift(value, amount):
    """``(value + ((1 << amount) >> 1)) >> amount``, arithmetic: rounds half up."""
    return (value + ((Const(1, 1) << amount) >> 1)) >> amount


def _requant(m, value, mult, shift, bits, name):
    """``hw.spec.formats``: ``clamp((value * mult + (1 << (shift-1))) >> shift)`` to ``bits``."""
    return _clamp(m, _round_shift(value * mult, shift), bits, name)


def _chunks(x):
    """``x`` as pieces for 18 x 18 signed multipliers: ``[(piece, shift)]``, 17-bit unsigned
    pieces from the bottom, the top one keeping ``x``'s sign (at most 18 bits signed, 17
    unsigned)."""
    x = Value.cast(x)
    is_signed = x.shape().signed
    top = 18 if is_signed else 17
    pieces = []
    k = 0
    while len(x) - k > top:
        pieces.append((x[k:k + 17], k))
        k += 17
    rest = x[k:]
    pieces.append((rest.as_signed() if is_signed else rest, k))
    return pieces


def _pieces(a, b):
    """``a * b`` as ``[(a piece, b piece, shift)]``: each pieces' product one DSP, the sum of
    the products shifted by their ``shift`` the product."""
    return [(pa, pb, sa + sb) for pa, sa in _chunks(a) for pb, sb in _chunks(b)]


def _clamp_d(m, d, value):
    """``d`` <- LayerNorm's ``D = n S2 - S1^2`` clamped to ``0 .. LN_D_MAX`` (= 2**62 - 1): the
    sign bit and the bits above 62, not comparisons."""
    full = Signal(signed(96))
    m.d.comb += full.eq(value)
    assert (1 << len(d)) - 1 == LN_D_MAX
    with m.If(full[-1]):
        m.d.sync += d.eq(0)
    with m.Elif(full[len(d):].any()):
        m.d.sync += d.eq(LN_D_MAX)
    with m.Else():
        m.d.sync += d.eq(full)


def _leading_one(m, x, name):
    """The bit length of ``x`` (0 for 0) as a tree: each 8-bit group's leading one, then the
    highest non-zero group's."""
    groups = [x[k:k + 8] for k in range(0, len(x), 8)]
    lengths = []
    for g, bits in enumerate(groups):
        length = Signal(range(len(x) + 1), name=f"{name}_g{g}")
        m.d.comb += length.eq(0)
        for i in range(len(bits)):          # the highest one wins: assigned last
            with m.If(bits[i]):
                m.d.comb += length.eq(8 * g + i + 1)
        lengths.append(length)
    out = Signal(range(len(x) + 1), name=name)
    m.d.comb += out.eq(0)
    for g, bits in enumerate(groups):
        with m.If(bits.any()):
            m.d.comb += out.eq(lengths[g])
    return out


def _argmax_tree(m, values):
    """The largest of ``values`` (int16 lanes) and its lane, the lowest lane winning ties: a
    tree of compares in which the right operand (higher lanes) wins only when strictly
    greater."""
    bits = max(1, (len(values) - 1).bit_length())
    nodes = [(v, Const(j, bits)) for j, v in enumerate(values)]
    level = 0
    while len(nodes) > 1:
        nxt = []
        for k in range(0, len(nodes) - 1, 2):
            (lv, li), (rv, ri) = nodes[k], nodes[k + 1]
            v = Signal(signed(16), name=f"amax_v{level}_{k // 2}")
            i = Signal(bits, name=f"amax_i{level}_{k // 2}")
            m.d.comb += [v.eq(Mux(rv > lv, rv, lv)), i.eq(Mux(rv > lv, ri, li))]
            nxt.append((v, i))
        if len(nodes) % 2:
            nxt.append(nodes[-1])
        nodes = nxt
        level += 1
    return nodes[0]


def check_sizes(lanes, d_model_max, *, min_lanes: int):
    """Validate the vector unit's (and its chip wrapper's) size parameters."""
    if not isinstance(lanes, int) or isinstance(lanes, bool):
        raise TypeError(f"lanes must be an integer, not {lanes!r}")
    if lanes < min_lanes:
        raise ValueError(f"lanes must be at least {min_lanes}, not {lanes!r}")
    if not isinstance(d_model_max, int) or isinstance(d_model_max, bool):
        raise TypeError(f"d_model_max must be an integer, not {d_model_max!r}")
    if not 1 <= d_model_max < 1 << LENGTH_BITS:
        raise ValueError(f"d_model_max must be in [1, {(1 << LENGTH_BITS) - 1}], "
                         f"not {d_model_max!r}")


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
    ``i_stats``: 2 x signed(64): global ``[sum x (int32 range), sum x^2]`` for LN_APPLY and
    RMS_APPLY.
    ``o_data``: ``lanes`` x signed(32) ``data`` plus ``q``: ``lanes`` x signed(8).
    ``o_stats``: 2 x signed(64): local ``[sum x, sum x^2]`` from LN_STATS, ``last`` = 1.

    ==========  ====================  ============================  ======================
    op          i_a (B beats)         i_b (B beats)                 output
    ==========  ====================  ============================  ======================
    ADD         int16 residual        int16 residual                data = clamp16(a + b)
    MUL         int8 (low byte used)  int8 (low byte used)          data = requant(a * b) to
                                                                    int8, or int16 if out16
    BIAS        int32 accumulator     int32 bias                    data = wrap32(a + b)
    REQUANT     int8/int16/int32      only if per_channel: packed   data = requant(a) to
                                      mult (bits 0-15), shift       int8, or int16 if
                                      (16-21)                       out16
    RELU        any                   --                            data = max(a, 0)
    LUT         int8 (low byte used)  --                            data = lut[a & 0xFF]
    LOAD_LUT    256 int8 entries      --                            -- (256/lanes beats)
    GELU16      int16 x               --                            data = y >> 8 (int8),
                                                                    or y if out16; q = y & 0xFF
    LOAD_LUT16  257 int16 knots       --                            -- (257/lanes beats)
    LN          int16 x               gamma (0-15), beta (16-31)    data = y16, q = q8
    LN_STATS    int16 x               --                            o_stats (1 beat)
    ARGMAX      int16 x               --                            o_stats (1 beat): record
    ONEHOT      -- (i_stats: record)  --                            data = (lane == idx - n)
    LN_APPLY    int16 x               gamma, beta                   data = y16, q = q8
    RMS         int16 x               gamma, beta (0)               data = y16, q = q8
    RMS_APPLY   int16 x               gamma, beta (0)               data = y16, q = q8
    ==========  ====================  ============================  ======================

    ADD takes the exact sum of its operands (int32 allowed) and saturates it to int16; the LN
    ops and GELU16 read the low 16 bits of ``i_a``, the LUT its low 8 bits. LN_APPLY first
    takes one beat from ``i_stats`` and uses the command's ``n`` (the count over all chips); LN
    uses its own statistics and ``n = length``. Both run the one-pass integer formula of
    :mod:`sim.golden.vector`: D = n*S2 - S1^2, a 96-entry table seed of rsqrt refined by two
    Newton steps in Q24 (relative error <= 2**-22), z = (n*x - S1) * rsqrt(D) with 16 fraction
    bits, ``y16 = clamp(((z * gamma) >> gshift) + beta)`` with gamma and beta int16 per channel
    (the real output in LSBs is ``z * gamma * 2**(16 - gshift) + beta``). Statistics summed over
    chips therefore give the full LayerNorm bit for bit. ``q8 = requant(y16, mult, shift, 8)``
    is the int8 input of the next matmul, emitted in the same beat as the int16 ``y16``:
    post-norm (ADD, then LN) gets the new int16 residual and the int8 matmul input at once;
    pre-norm keeps ADD's output as the residual and uses LN's ``q``.

    MUL multiplies the operands' low bytes as int8 (an exact int16 product), then requantises
    it per tensor with the command's ``mult`` and ``shift`` as REQUANT does (the same stage 1
    rounding and clamp): the gated FFN's ``silu(gate) * up``. It has ADD's streams and cycles
    (:func:`hw.spec.vector.twin_of`).

    RMS and RMS_APPLY are LN and LN_APPLY with S1 taken as 0 (RMSNorm: D = n*S2, z = n*x *
    rsqrt(D)): the unit accepts them as LN and LN_APPLY (:func:`hw.spec.vector.twin_of`)
    with a flag that keeps S1 at 0 (RMS does not accumulate it, RMS_APPLY does not load it from
    ``i_stats``), so they take the same streams, pipeline and cycles.

    The activation LUT (256 x int8, indexed by the input's low byte) is programmable at run
    time by LOAD_LUT, as a compiler loads GELU for its scales; it resets to ReLU at unchanged
    scale. LN keeps its vector in an internal buffer (``ceil(d_model_max / lanes)`` words of
    ``lanes`` x int16), so the vector is streamed once; LN_STATS + LN_APPLY stream it twice.

    GELU16 (:func:`sim.golden.vector.gelu16_apply`) interpolates linearly between the 257
    int16 knots ``T[k]`` loaded by LOAD_LUT16, spaced 2**g apart with g = ``shift`` (1..8):
    ``i = x >> g``, ``f = x - (i << g)``, ``y = T[i+128] + (((T[i+129] - T[i+128]) * f +
    2**(g-1)) >> g)``; ``y = x`` for ``i >= 128`` and 0 for ``i < -128``. The table is held as
    256 entries ``(T[k], T[k+1] - T[k])`` (16 + 17 bits; written by LOAD_LUT16 as each knot
    arrives, the previous knot kept from the lane to its left or the previous beat), so each
    lane reads one entry and does one 17 x 8-bit multiply (stage 1), then the rounding shift
    and the add (stage 2). It resets to all zeros.

    Both tables are per-lane copies in block RAM (:class:`~hw.tile.lane_table.LaneTable` with
    ``sync``): a beat's reads are issued as it enters the pipeline and their entries are used
    one stage later, so they cost no cycle.

    ARGMAX takes its B beats like LN_STATS (one per cycle, no pipeline): a tree of compares
    finds each beat's largest int16 (lanes past ``length`` count as -32768 and, being last,
    never win) and its lowest lane, which replaces the running maximum only when strictly
    greater, so the lowest index wins a tie. It then emits one beat on ``o_stats``:
    ``data[0]`` = the argmax record's first 8 bytes (:func:`hw.spec.vector.pack_argmax`: the
    int32 index plus the command's ``n``, the int16 maximum), ``data[1]`` = 0. ONEHOT takes
    one beat from ``i_stats`` (the record, as ARGMAX emits it: the index in the low 32 bits of
    ``data[0]``) and no ``i_a``, then emits B beats of ``data`` with 1 in the lane at
    ``index - n`` and 0 elsewhere, one per cycle: both take the same cycles for every value.
    ARGMAX with ``pairs`` reads ``length`` records on ``i_stats`` instead of elements on
    ``i_a`` (one per cycle, as offered) and keeps the one with the largest value, a tie going
    to the lower index (signed int32); it emits that record (with ``n`` added: 0 in this mode).

    Timing (:func:`hw.spec.timing.vector.op_cycles`): one beat per cycle through a pipeline of
    :func:`~hw.spec.timing.vector.latency` stages (one multiplier per lane per stage) that
    stalls as a whole only when ``o_data`` is full; one cycle per command to accept it;
    LayerNorm adds :func:`~hw.spec.timing.vector.rsqrt_cycles` cycles after its statistics (one
    multiply per cycle), and LN reads its buffer back in a second pass of B cycles. Commands
    overlap: a beat carries its command's fields down the pipeline. ``pipeline`` (the NPU
    file's ``vector_pipeline``): ``"short"``, 4 stages, each a product, its rounding shift and
    its clamp in one cycle, and a 8-cycle rsqrt; ``"deep"``, 13 stages (the operands, every
    product, its shift, its rounding and clamp in registers of their own), a 21-cycle rsqrt
    (its products likewise registered) and statistics and ARGMAX's maximum in four registered
    steps: the same results, for a faster clock.

    ``room_next`` (the chip's vector engine): with it the unit has an input ``o_room_next``,
    whether ``o_data`` will be ready in the next cycle (its consumer's registers decide it), and
    the pipeline's enable (``~o_data.valid | o_data.ready``) is a register computed a cycle
    ahead from it, the same value, not a function of ``o_data.ready`` fanned out to every
    stage.

    ``ecp5_dsp`` (an ECP5 build, ``npu fpga``): the deep pipeline's products are
    :class:`~hw.dsp.RegisteredMul` instances that instantiate the ECP5's MULT18X18D with its
    registers (each product's operands and product, or its product alone, in the DSP block
    rather than in the fabric); the same cycles and results. No effect on the short pipeline,
    whose products are not registered.

    Undefined (never emitted by the compiler): ``length`` 0 or above ``d_model_max`` for LN,
    ``shift`` outside 1..47 (outside 1..8 for GELU16).
    """

    def __init__(self, *, lanes: int, d_model_max: int, pipeline: str = "short",
                 room_next: bool = False, ecp5_dsp: bool = False):
        check_sizes(lanes, d_model_max, min_lanes=1)
        if not isinstance(ecp5_dsp, bool):
            raise TypeError(f"ecp5_dsp must be a bool, not {ecp5_dsp!r}")
        self._lanes = lanes
        self._d_model_max = d_model_max
        self._pipeline = check_pipeline(pipeline)
        self._room_next = bool(room_next)
        self._ecp5_dsp = ecp5_dsp
        super().__init__({
            "i_cmd": In(stream.Signature(cmd_layout())),
            "i_a": In(stream.Signature(vec_layout(lanes))),
            "i_b": In(stream.Signature(vec_layout(lanes))),
            "i_stats": In(stream.Signature(stats_layout())),
            "o_data": Out(stream.Signature(out_layout(lanes))),
            "o_stats": Out(stream.Signature(stats_layout())),
            **({"o_room_next": In(1)} if room_next else {}),
        })

    @property
    def lanes(self) -> int:
        return self._lanes

    @property
    def d_model_max(self) -> int:
        return self._d_model_max

    @property
    def pipeline(self) -> str:
        return self._pipeline

    @property
    def ecp5_dsp(self) -> bool:
        return self._ecp5_dsp

    @property
    def buffer_depth(self) -> int:
        return -(-self._d_model_max // self._lanes)

    def elaborate(self, platform) -> Elaboratable:
        m = Module()
        lanes = self._lanes
        depth = self.buffer_depth

        deep = self._pipeline == "deep"

        def product(name, a, b, *, en, reg_inputs):
            """The deep pipeline's ``a * b`` (each at most 18 bits) in a register of its own,
            enabled by ``en``: ``reg_inputs``, the operands' values a cycle before the product's
            register (they enter the DSP's input registers with the stage register whose
            next value they are); otherwise registered operands of a stage straight in."""
            a, b = Value.cast(a), Value.cast(b)
            mul = RegisteredMul(a=a.shape(), b=b.shape(), reg_inputs=reg_inputs,
                                ecp5=self._ecp5_dsp)
            m.submodules[name] = mul
            m.d.comb += [mul.a.eq(a), mul.b.eq(b), mul.en.eq(en)]
            return mul.p

        cmd = Signal(cmd_layout())
        remaining = Signal(LENGTH_BITS + 1)   # elements still to come in this pass
        beat = Signal(range(max(depth, GELU16_KNOTS + lanes) + 1))
        # Whether this beat is the pass's last, and which of its lanes are in the vector:
        # compares of `remaining`, registered with it in the deep pipeline (`set_rem`).
        last_beat = Signal(init=1 if deep else 0)
        lane_ok = [Signal(name=f"lane_ok{j}") for j in range(lanes)]
        if not deep:
            m.d.comb += last_beat.eq(remaining <= lanes)
            m.d.comb += [ok.eq(remaining > j) for j, ok in enumerate(lane_ok)]

        def set_rem(value):
            """``remaining.eq(value)``, and in the deep pipeline its compares with it."""
            if not deep:
                return [remaining.eq(value)]
            v = Value.cast(value)[:len(remaining)]
            return [remaining.eq(value), last_beat.eq(v <= lanes),
                    *[ok.eq(v > j) for j, ok in enumerate(lane_ok)]]

        # LayerNorm state: statistics, count, rsqrt result; `rms`: S1 stays 0 (RMSNorm).
        rms = Signal()
        s1 = Signal(signed(32))
        s2 = Signal(signed(64))
        n = Signal(N_BITS)
        d = Signal(62)
        m_norm = Signal(32)
        y_r = Signal(RSQRT_FRAC_BITS + 2)
        y2 = Signal(RSQRT_FRAC_BITS + 2)
        my2 = Signal(RSQRT_FRAC_BITS + 3)
        zs = Signal(6)                          # z = (t * Y) >> zs, zs = 23 + h
        rsqrt_end = rsqrt_cycles(self._pipeline) - 1
        step = Signal(range(rsqrt_end + 1))

        # ARGMAX: the running maximum and its index, the index of this beat's lane 0; ONEHOT:
        # the hot lane relative to this beat's lane 0.
        best_v = Signal(signed(16))
        best_i = Signal(32)                     # pair mode: a record's signed int32 index
        pair_first = Signal()                   # pair mode: no record taken yet
        pos = Signal(LENGTH_BITS + 1)
        rel = Signal(signed(34))

        # Every lane reads the tables in the same cycle and a load writes a beat of entries:
        # LaneTable keeps them in distributed RAM (one Memory with a port per lane would be
        # flip-flops and a 256:1 multiplexer per lane and bit).
        # Both are read synchronously (block RAM, enabled with the pipeline): a beat's
        # entries arrive with it in stage 1.
        m.submodules.lut = lut = LaneTable(
            shape=signed(8), depth=LUT_ENTRIES, lanes=lanes, sync=True,
            init=[max(i if i < 128 else i - 256, 0) for i in range(LUT_ENTRIES)])
        lut_w, lut_r = _lane_ports(lut)

        # GELU16 table: entry k = (T[k], T[k+1] - T[k]), the interval starting at knot k. A
        # LOAD16 beat writes entries beat + j - 1: offset -1.
        m.submodules.lut16 = lut16 = LaneTable(
            shape=data.StructLayout({"base": signed(16), "delta": signed(17)}),
            depth=GELU16_KNOTS - 1, lanes=lanes, offset=-1, sync=True)
        lut16_w, lut16_r = _lane_ports(lut16)
        knot_prev = Signal(signed(16))          # LOAD_LUT16: the previous beat's last knot

        m.submodules.buf = buf = memory.Memory(
            shape=data.ArrayLayout(signed(16), lanes), depth=depth, init=[])
        buf_w = buf.write_port()
        buf_r = buf.read_port()

        a, b, o = self.i_a.payload.data, self.i_b.payload.data, self.o_data
        op = cmd.op
        # deep: the command's decode in registers (LayerNorm's; LN's operand from the buffer;
        # REQUANT's per-lane parameters), set as the command is taken.
        dec_ln, dec_buf, dec_pc, dec_mul = Signal(), Signal(), Signal(), Signal()

        # ---- the pipeline ------------------------------------------------------------------
        # Register stages, all advancing together whenever the output register is free
        # (`adv`); each beat carries its own command fields and rsqrt result, so the next
        # command may start while earlier beats are still in flight. Four steps, each a
        # product, its rounding shift and its clamp:
        #   0 -> 1: operands in: add/bias/relu done; a * mult (requant); n*x - S1 (LN); the
        #           LUT and GELU16 table reads issued (block RAM: the entries are there in 1)
        #   1 -> 2: requant round/shift/clamp; LN z = clamp((t * Y) >> zs); LUT entry; GELU16
        #           delta * f (f, the fraction, came in val)
        #   2 -> 3: LN y16 = clamp(((z * gamma) >> gshift) + beta); GELU16 y = base +
        #           round(delta * f >> g)
        #   3 -> o: LN q8 = requant(y16, mult, shift, 8); GELU16 hi/lo bytes; padding lanes 0
        # The short pipeline does each step in one cycle (stages 1, 2, 3, then the output
        # register). The deep one registers the operands of step 0's multiplier (stage 0r),
        # then every product (stages 0m to 3m, each in the register of its own DSP, `product`:
        # step 0's as two partial products of 17 and 15 bits of the operand, added in the next
        # cycle with LN's `- S1`, or MUL's int8 product, taken by the same DSPs; t * Y, or
        # MUL's int8 product times `mult` (carried in `y`), as four partial products, added in
        # stage 1a; z * gamma as two, added with the shift), then shifts it by the step's
        # amount into stages 1s to 3s (keeping the bit below the result: `w = (v << 1) >> s`),
        # then rounds (`(w + 1) >> 1`, which is `(v + 2**(s-1)) >> s`) and clamps; it issues
        # the table reads from stage 0r and registers the entries in stage 1, before GELU16's
        # multiply. Step 0's products take their operands into the DSPs' input registers with
        # stage 0r; the others take the stage registers' outputs.
        beat_l = data.StructLayout({
            "op": unsigned(4), "out16": 1, "ln": 1, "gshift": GSHIFT_BITS, "mult": 16,
            "shift": 6, "y": RSQRT_FRAC_BITS + 2, "zs": 6, "last": 1, "mask": lanes,
            # deep: S1; whether step 1 takes t * Y (LN, and MUL's product times `mult`)
            **({"s1": signed(32), "ty": 1} if deep else {})})
        lane_l = data.ArrayLayout(data.StructLayout({
            "val": signed(49), "sh": 6, "gamma": signed(16), "beta": signed(16),
            "base": signed(16), "mid": 1,
            # deep: a product or a shifted one (t * Y is the widest; one more bit for the
            # shift's) and the table addresses
            **({"prod": signed(34 + RSQRT_FRAC_BITS + 3), "lut_a": 8, "lut16_a": 8,
                "ma": signed(32), "lut_e": signed(8), "e_base": signed(16),
                "e_delta": signed(17)}
               if deep else {})}), lanes)
        n_regs = latency(self._pipeline) - 1        # stage registers before the output's
        names = ["0", "0r", "0m", "1", "1m", "1a", "1s", "2", "2m", "2s", "3", "3m", "3s"] \
            if deep else ["0", "1", "2", "3"]
        assert len(names) == n_regs + 1
        regs = [(Signal(beat_l, name=f"p{k}_beat"), Signal(lane_l, name=f"p{k}_lanes"))
                for k in names]   # stage 0 is combinational (the input beat)
        valid = [Signal(name=f"p{k}_valid") for k in names]
        # stages[k]: the registers where step k begins (k = 0..3); deep only: prods[k], those of
        # its product, shifts[k] (k = 1..3) those of its shifted product.
        stages = [regs[names.index(str(k))] for k in range(4)]
        prods = [regs[names.index(f"{k}m")] for k in range(4)] if deep else None
        shifts = [None] + [regs[names.index(f"{k}s")] for k in range(1, 4)] if deep else None
        fire = Signal()                        # an input beat enters the pipeline
        if self._room_next:
            # adv = ~o.valid | o.ready, registered: o.valid's next value and the consumer's
            # room next cycle.
            adv = Signal(init=1)
            m.d.sync += adv.eq(~Mux(adv, valid[n_regs], o.valid) | self.o_room_next)
        else:
            adv = Signal()
            m.d.comb += adv.eq(~o.valid | o.ready)
        m.d.comb += [valid[0].eq(fire), lut.r_en.eq(adv), lut16.r_en.eq(adv)]
        with m.If(adv):
            m.d.sync += o.valid.eq(valid[n_regs])
            for k in range(1, n_regs + 1):
                m.d.sync += [valid[k].eq(valid[k - 1]), regs[k][0].eq(regs[k - 1][0]),
                             regs[k][1].eq(regs[k - 1][1])]

        def shift_keep(v, amount):
            """``(v << 1) >> amount``: the shifted value and the bit below it."""
            return (v << 1) >> amount

        def round_kept(w):
            """``(w + 1) >> 1`` of a :func:`shift_keep` result: ``(v + 2**(s-1)) >> s``."""
            return (w + 1) >> 1

        # Stage 0: the input beat.
        sb, sl = stages[0]
        m.d.comb += [sb.op.eq(op), sb.out16.eq(cmd.out16), sb.gshift.eq(cmd.gshift),
                     sb.ln.eq((op == VectorOp.LN) | (op == VectorOp.LN_APPLY)),
                     sb.mult.eq(cmd.mult), sb.shift.eq(cmd.shift), sb.y.eq(y_r), sb.zs.eq(zs),
                     sb.last.eq(last_beat), sb.mask.eq(Cat(*lane_ok))]
        if deep:
            # MUL's second product is step 1's t * Y, with `mult` for Y.
            m.d.comb += [sb.s1.eq(s1), sb.ty.eq(dec_ln | dec_mul),
                         sb.y.eq(Mux(dec_mul, cmd.mult, y_r))]
        pp0_lo, pp0_hi = [], []                 # deep: step 0's partial products (0m)
        x_src = Signal(data.ArrayLayout(signed(16), lanes))
        with m.If(dec_buf if deep else op == VectorOp.LN):
            m.d.comb += x_src.eq(buf_r.data)
        with m.Else():
            m.d.comb += [x_src[j].eq(a[j][0:16]) for j in range(lanes)]
        for j in range(lanes):
            lane = sl[j]
            mult = Signal(16, name=f"mult{j}")
            with m.If(dec_pc if deep else cmd.per_channel & (op == VectorOp.REQUANT)):
                m.d.comb += [mult.eq(b[j][0:16]), lane.sh.eq(b[j][16:22])]
            with m.Else():
                m.d.comb += [mult.eq(cmd.mult), lane.sh.eq(cmd.shift)]
            m.d.comb += [lane.gamma.eq(b[j][0:16]), lane.beta.eq(b[j][16:32])]
            if not deep:
                add = _clamp(m, a[j] + b[j], 16, f"add{j}")
            # One multiplier per lane for stage 0's products, whose ops exclude each other:
            # REQUANT's a * mult, MUL's (a8 * b8) * mult, LayerNorm's n * x (signed 32 x
            # unsigned 16 bits: two 18 x 18 DSPs).
            mul_a = Signal(signed(32), name=f"mul_a{j}")
            mul_b = Signal(16, name=f"mul_b{j}")
            if deep:
                # MUL: its int8 operands, sign-extended; the low 16 bits of the product of
                # their low 17 and 16 bits are a8 * b8 (it fits int16).
                m.d.comb += [
                    mul_a.eq(Mux(dec_ln, x_src[j], Mux(dec_mul, a[j][0:8].as_signed(), a[j]))),
                    mul_b.eq(Mux(dec_ln, n, Mux(dec_mul, b[j][0:8].as_signed(), mult)))]
            else:
                prod8 = Signal(signed(16), name=f"mul{j}")
                m.d.comb += prod8.eq(a[j][0:8].as_signed() * b[j][0:8].as_signed())
                with m.Switch(op):
                    with m.Case(VectorOp.MUL):
                        m.d.comb += [mul_a.eq(prod8), mul_b.eq(mult)]
                    with m.Case(VectorOp.LN, VectorOp.LN_APPLY):
                        m.d.comb += [mul_a.eq(x_src[j]), mul_b.eq(n)]
                    with m.Default():
                        m.d.comb += [mul_a.eq(a[j]), mul_b.eq(mult)]
            if deep:
                # The operands into stage 0r (ADD, BIAS and RELU's) and into the DSPs' input
                # registers; their partial products in 0m.
                prod0 = 0
                m.d.comb += lane.ma.eq(mul_a)
                pp0_lo.append(product(f"pp0_lo{j}", mul_a[0:17], mul_b, en=adv, reg_inputs=True))
                pp0_hi.append(product(f"pp0_hi{j}", mul_a[17:32].as_signed(), mul_b, en=adv,
                                      reg_inputs=True))
            else:
                prod0 = Signal(signed(49), name=f"product{j}")
                m.d.comb += prod0.eq(mul_a * mul_b)
            # GELU16: knot index i = x >> g (g = shift), fraction f = x - (i << g) < 2**g.
            gx = a[j][0:16].as_signed()
            g = cmd.shift[0:4]
            gi = Signal(signed(16), name=f"gelu_i{j}")
            gf = Signal(8, name=f"gelu_f{j}")
            above = Signal(name=f"gelu_above{j}")
            below = Signal(name=f"gelu_below{j}")
            m.d.comb += gi.eq(gx >> g)
            if deep:
                # f = x's low g bits (a mask of g, not a subtraction); i >= ZERO and i < -ZERO
                # by i's bits from log2(ZERO) up (ZERO a power of two), not compares: no carry
                # chain after the shift.
                z = GELU16_ZERO.bit_length() - 1
                assert 1 << z == GELU16_ZERO
                mask = Signal(8, name=f"gelu_mask{j}")
                m.d.comb += [mask.eq(((Const(1, 16) << g) - 1)[0:8]), gf.eq(gx[0:8] & mask),
                             above.eq(~gi[15] & gi[z:15].any()),
                             below.eq(gi[15] & ~gi[z:15].all())]
            else:
                m.d.comb += [gf.eq(gx - (gi << g)), above.eq(gi >= GELU16_ZERO),
                             below.eq(gi < -GELU16_ZERO)]
            if deep:
                # The reads are issued from stage 0r, with the addresses carried there.
                pl0r = regs[1][1][j]
                m.d.comb += [lane.lut_a.eq(a[j][0:8]), lane.lut16_a.eq(gi[0:8] ^ GELU16_ZERO),
                             lut_r[j].addr.eq(pl0r.lut_a), lut16_r[j].addr.eq(pl0r.lut16_a)]
            else:
                m.d.comb += [lut_r[j].addr.eq(a[j][0:8]),
                             lut16_r[j].addr.eq(gi[0:8] ^ GELU16_ZERO)]
            with m.Switch(op):
                # deep: ADD, BIAS and RELU in stage 0r -> 0m, from the operands there.
                with m.Case(VectorOp.ADD):
                    if not deep:
                        m.d.comb += lane.val.eq(add)
                with m.Case(VectorOp.BIAS):
                    if not deep:
                        m.d.comb += lane.val.eq((a[j] + b[j])[0:32].as_signed())
                with m.Case(VectorOp.REQUANT):
                    if not deep:
                        m.d.comb += lane.val.eq(prod0)
                with m.Case(VectorOp.MUL):
                    # MUL: int8 x int8 is exact in 16 bits; times the 16-bit mult, in 32
                    # (deep: in stages 0m and 1).
                    if not deep:
                        m.d.comb += lane.val.eq(prod0)
                with m.Case(VectorOp.RELU):
                    if not deep:
                        m.d.comb += lane.val.eq(Mux(a[j] > 0, a[j], 0))
                with m.Case(VectorOp.LN, VectorOp.LN_APPLY):
                    # deep: S1 is subtracted on the way to stage 1.
                    if not deep:
                        m.d.comb += lane.val.eq(prod0 - s1)
                with m.Case(VectorOp.ONEHOT):
                    m.d.comb += lane.val.eq(rel == j)
                with m.Case(VectorOp.GELU16):
                    # Above the table y = x: (x << g) rounded back by stage 2's >> g. Between
                    # two knots (`mid`) the fraction goes on to meet its entry in stage 1.
                    with m.If(above):
                        m.d.comb += lane.val.eq(gx << g)
                    with m.Elif(~below):
                        m.d.comb += [lane.val.eq(gf), lane.mid.eq(1)]
        if deep:
            # Stage 0r -> 0m: the partial products (REQUANT, LN, MUL) in their DSPs (above);
            # ADD, BIAS and RELU.
            rb, rl = regs[1]
            for j in range(lanes):
                ma = rl[j].ma
                bj = Cat(rl[j].gamma, rl[j].beta).as_signed()       # the B operand
                # The clamp's signals are driven outside the If: a comb signal assigned under
                # it would be gated by the pipeline's enable.
                add = _clamp(m, ma + bj, 16, f"add{j}")
                with m.If(adv & (rb.op == VectorOp.ADD)):
                    m.d.sync += prods[0][1][j].val.eq(add)
                with m.If(adv & (rb.op == VectorOp.BIAS)):
                    m.d.sync += prods[0][1][j].val.eq((ma + bj)[0:32].as_signed())
                with m.If(adv & (rb.op == VectorOp.RELU)):
                    m.d.sync += prods[0][1][j].val.eq(Mux(ma > 0, ma, 0))
            # Stage 0m -> 1: the partial products' sum (REQUANT, LN: minus S1), MUL's int8
            # product (the low partial product's low 16 bits); the table entries.
            pb, pl = prods[0]
            for j in range(lanes):
                entry = lut16_r[j].data
                with m.If(adv):
                    m.d.sync += [stages[1][1][j].lut_e.eq(lut_r[j].data),
                                 stages[1][1][j].e_base.eq(entry.base),
                                 stages[1][1][j].e_delta.eq(entry.delta)]
                whole = pp0_lo[j] + (pp0_hi[j] << 17)
                v1 = Signal(signed(49), name=f"val1_{j}")
                m.d.comb += v1.eq(pl[j].val)
                with m.If(pb.op == VectorOp.REQUANT):
                    m.d.comb += v1.eq(whole)
                with m.If(pb.ln):
                    m.d.comb += v1.eq(whole - pb.s1)
                with m.If(pb.op == VectorOp.MUL):
                    m.d.comb += v1.eq(pp0_lo[j][0:16].as_signed())
                with m.If(adv):
                    m.d.sync += stages[1][1][j].val.eq(v1)

        # Step 1.
        # One rounding shift and one clamp per lane serve the requantiser (REQUANT, MUL: the
        # operand by `sh`, to int8 or int16) and LayerNorm (t * Y by zs, to LN_Z_BITS): the ops
        # of a beat are one or the other, so the shifter and the rounding adder are shared,
        # and the clamp's bound is chosen by the op.
        pb, pl = stages[1]
        for j in range(lanes):
            # |t| = |n*x - S1| < 2**33: a 34-bit operand keeps the multiplier small.
            t = pl[j].val[0:34].as_signed()
            entry = lut16_r[j].data
            if deep:
                # t * Y's partial products and GELU16's delta * f (from stage 1's registers:
                # the table's block RAM output has no register of its own) into stage 1m;
                # t * Y in 1a; the shift into 1s.
                parts = [(product(f"ty_pp{k}_{j}", pa, pyb, en=adv, reg_inputs=False), sh)
                         for k, (pa, pyb, sh) in enumerate(_pieces(t, pb.y))]
                gelu_p = product(f"gelu_p{j}", pl[j].e_delta, pl[j].val[0:8], en=adv,
                                 reg_inputs=False)
                with m.If(adv & (pb.op == VectorOp.LUT)):
                    m.d.sync += prods[1][1][j].val.eq(pl[j].lut_e)
                with m.If(adv & (pb.op == VectorOp.GELU16) & pl[j].mid):
                    m.d.sync += prods[1][1][j].base.eq(pl[j].e_base)
                qb, ql = prods[1]
                sum_ty = tree_sum([pp << sh for pp, sh in parts], m=m, name=f"ty{j}")
                a_lanes = regs[names.index("1a")][1]
                with m.If(adv & qb.ty):
                    m.d.sync += a_lanes[j].prod.eq(sum_ty)
                with m.If(adv & (qb.op == VectorOp.GELU16) & ql[j].mid):
                    m.d.sync += a_lanes[j].val.eq(gelu_p)
                ab, al = regs[names.index("1a")]
                with m.If(adv):
                    m.d.sync += shifts[1][1][j].prod.eq(shift_keep(
                        Mux(ab.ty, al[j].prod, al[j].val), Mux(ab.ln, ab.zs, al[j].sh)))
                rb, rl = shifts[1]
                # The rounding adder as wide as the widest clamp, the bounds by bit tests.
                w = rl[j].prod
                clamped1 = Signal(signed(LN_Z_BITS), name=f"clamp1_{j}")
                m.d.comb += clamped1.eq(Mux(
                    rb.ln, round_saturate(m, w, LN_Z_BITS, f"clz{j}"),
                    Mux(rb.out16, round_saturate(m, w, 16, f"cl16_{j}"),
                        round_saturate(m, w, 8, f"cl8_{j}"))))
            else:
                rb, rl = pb, pl
                src1 = _round_shift(Mux(pb.ln, t * pb.y, pl[j].val), Mux(pb.ln, pb.zs, pl[j].sh))
                rounded1 = Signal(signed(34 + RSQRT_FRAC_BITS + 2), name=f"rs1_{j}")
                m.d.comb += rounded1.eq(src1)
                # The three clamps by bit tests (hw.arith.saturate), chosen by the op, rather
                # than two comparisons of the 62-bit value with a chosen bound.
                clamped1 = Signal(signed(LN_Z_BITS), name=f"clamp1_{j}")
                m.d.comb += clamped1.eq(Mux(pb.ln, saturate(m, rounded1, LN_Z_BITS, f"clz{j}"),
                                            Mux(pb.out16, saturate(m, rounded1, 16, f"cl16_{j}"),
                                                saturate(m, rounded1, 8, f"cl8_{j}"))))
            with m.If(adv & ((rb.op == VectorOp.REQUANT) | (rb.op == VectorOp.MUL) | rb.ln)):
                m.d.sync += stages[2][1][j].val.eq(clamped1)
            if not deep:
                with m.If(adv & (pb.op == VectorOp.LUT)):
                    m.d.sync += stages[2][1][j].val.eq(lut_r[j].data)
                with m.If(adv & (pb.op == VectorOp.GELU16) & pl[j].mid):
                    m.d.sync += [stages[2][1][j].val.eq(entry.delta * pl[j].val[0:8]),
                                 stages[2][1][j].base.eq(entry.base)]

        # Step 2: LayerNorm's ((z * gamma) >> gshift) + beta, clamped to int16, and
        # GELU16's base + ((delta * f) >> g) (int16 between two knots, or x itself: no clamp)
        # share one rounding shift and one adder.
        pb, pl = stages[2]
        for j in range(lanes):
            z = pl[j].val[0:LN_Z_BITS].as_signed()
            if deep:
                # z * gamma as two partial products in stage 2m, added on the way to the shift.
                zg = tree_sum([product(f"zg_pp{k}_{j}", pz, pg, en=adv, reg_inputs=False) << sh
                               for k, (pz, pg, sh) in enumerate(_pieces(z, pl[j].gamma))],
                              m=m, name=f"zg{j}")
                qb, ql = prods[2]
                src2 = Mux(qb.ln, zg[0:LN_Z_BITS + 16].as_signed(),
                           ql[j].val[0:LN_Z_BITS + 16].as_signed())
                with m.If(adv & (qb.ln | (qb.op == VectorOp.GELU16))):
                    m.d.sync += shifts[2][1][j].prod.eq(
                        shift_keep(src2, Mux(qb.ln, qb.gshift, ql[j].sh)))
                rb, rl = shifts[2]
                # round(w) + beta = (w + 2 beta + 1) >> 1: one adder. (GELU16's rounded
                # value always fits the 17 bits the short pipeline keeps of it.)
                y = Signal(signed(LN_Z_BITS + 17), name=f"y2_{j}")
                w = rl[j].prod[0:LN_Z_BITS + 18].as_signed()
                twice = Cat(Const(1, 1), Mux(rb.ln, rl[j].beta, rl[j].base)).as_signed()
                m.d.comb += y.eq((w + twice) >> 1)
            else:
                rb, rl = pb, pl
                src2 = Mux(pb.ln, z * pl[j].gamma, pl[j].val[0:LN_Z_BITS + 16].as_signed())
                rounded2 = Signal(signed(LN_Z_BITS + 16), name=f"rs2_{j}")
                m.d.comb += rounded2.eq(_round_shift(src2, Mux(pb.ln, pb.gshift, pl[j].sh)))
                y = Signal(signed(LN_Z_BITS + 17), name=f"y2_{j}")
                m.d.comb += y.eq(Mux(pb.ln, rounded2, rounded2[0:17].as_signed())
                                 + Mux(pb.ln, pl[j].beta, pl[j].base))
            y16 = _clamp(m, y, 16, f"y16_{j}")
            with m.If(adv & rb.ln):
                m.d.sync += stages[3][1][j].val.eq(y16)
            with m.If(adv & (rb.op == VectorOp.GELU16)):
                m.d.sync += stages[3][1][j].val.eq(y)

        # Step 3 -> output register.
        pb, pl = stages[3]
        if deep:
            qb = prods[3][0]
            for j in range(lanes):
                q_p = product(f"q_p{j}", pl[j].val[0:16].as_signed(), pb.mult, en=adv,
                              reg_inputs=False)
                with m.If(adv):
                    m.d.sync += shifts[3][1][j].prod.eq(shift_keep(q_p, qb.shift))
            rb, rl = shifts[3]
            q8s = [round_saturate(m, rl[j].prod, 8, f"q8_{j}") for j in range(lanes)]
        else:
            rb, rl = pb, pl
            q8s = [_requant(m, pl[j].val[0:16].as_signed(), pb.mult, pb.shift, 8, f"q8_{j}")
                   for j in range(lanes)]
        gelu = rb.op == VectorOp.GELU16
        with m.If(adv):
            m.d.sync += o.payload.last.eq(rb.last)
            for j, q8 in enumerate(q8s):
                y = rl[j].val[0:16].as_signed()
                m.d.sync += [
                    o.payload.data[j].eq(Mux(rb.mask[j],
                                             Mux(gelu & ~rb.out16, y[8:16].as_signed(),
                                                 rl[j].val), 0)),
                    o.payload.q[j].eq(Mux(rb.mask[j] & rb.ln, q8,
                                          Mux(rb.mask[j] & gelu, y[0:8], 0)))]

        # Statistics of the incoming beat (lanes past `length` count as 0).
        xa = [Signal(signed(16), name=f"xa{j}") for j in range(lanes)]
        m.d.comb += [xa[j].eq(Mux(lane_ok[j], a[j][0:16], 0)) for j in range(lanes)]
        is_argmax = op == VectorOp.ARGMAX
        if deep:
            # LN, LN_STATS and ARGMAX take a beat in four registered steps: its lanes (masked;
            # for ARGMAX, padding lanes at -32768) and its position; their squares (in the
            # DSPs' output registers, the lanes in their input registers every cycle: the
            # squares are read only a beat's two cycles later), sum and maximum; the squares'
            # sum, S1 and the running maximum; S2 (in the bits a sum of squares of
            # d_model_max int16 values needs).
            st_valid = [Signal(name=f"st_valid{k}") for k in range(3)]
            st_x = [Signal(signed(16), name=f"st_x{j}") for j in range(lanes)]
            st_pos = Signal(LENGTH_BITS + 1)
            st_sq = [product(f"st_sq{j}", xa[j], xa[j], en=1, reg_inputs=True)
                     for j in range(lanes)]
            st_s1 = Signal(signed(16 + lanes.bit_length()))
            st_s2 = Signal(signed(32 + lanes.bit_length()))
            am_v = Signal(signed(16))
            am_j = Signal(range(lanes))
            am_pos = Signal(LENGTH_BITS + 1)
            s2_bits = 31 + self._d_model_max.bit_length()
            m.d.sync += [v.eq(0) for v in st_valid]
            # Step 2: squares, sum and maximum of the registered lanes.
            amax_v, amax_j = _argmax_tree(m, st_x)
            with m.If(st_valid[0]):
                m.d.sync += [st_valid[1].eq(1), st_s1.eq(tree_sum(st_x, m=m, name="beat_s1")),
                             am_v.eq(amax_v), am_j.eq(amax_j), am_pos.eq(st_pos)]
            # Step 3: the squares' sum, S1, the running maximum.
            with m.If(st_valid[1]):
                m.d.sync += [st_valid[2].eq(1), s1.eq(Mux(rms, 0, s1 + st_s1)),
                             st_s2.eq(tree_sum(st_sq, m=m, name="beat_s2"))]
                with m.If(am_v > best_v):
                    m.d.sync += [best_v.eq(am_v), best_i.eq(am_pos + am_j)]
            # Step 4: S2.
            with m.If(st_valid[2]):
                m.d.sync += s2.eq(s2[:s2_bits] + st_s2)
        else:
            beat_s1 = tree_sum(xa, m=m, name="beat_s1")
            beat_s2 = tree_sum((x * x for x in xa), m=m, name="beat_s2")
            amax_v, amax_j = _argmax_tree(
                m, [Mux(lane_ok[j], a[j][0:16].as_signed(), -(1 << 15)) for j in range(lanes)])

        need_b = Signal()
        m.d.comb += need_b.eq((op == VectorOp.ADD) | (op == VectorOp.BIAS) | (op == VectorOp.MUL)
                              | ((op == VectorOp.REQUANT) & cmd.per_channel))
        m.d.comb += [buf_w.addr.eq(beat), buf_r.addr.eq(beat)]
        m.d.comb += [buf_w.data[j].eq(xa[j]) for j in range(lanes)]

        with m.FSM() as fsm:
            with m.State("IDLE"):
                m.d.comb += self.i_cmd.ready.eq(1)
                with m.If(self.i_cmd.valid):
                    p = self.i_cmd.payload
                    # RMSNorm's ops run as LayerNorm's (twin_of), with S1 held at 0.
                    like = Signal(4)
                    m.d.comb += like.eq(p.op)
                    for rms_op in RMS_OPS:
                        with m.If(p.op == rms_op):
                            m.d.comb += like.eq(twin_of(rms_op))
                    if deep:
                        m.d.sync += [
                            dec_ln.eq(like.matches(VectorOp.LN, VectorOp.LN_APPLY)),
                            dec_buf.eq(like == VectorOp.LN),
                            dec_pc.eq(p.per_channel & (like == VectorOp.REQUANT)),
                            dec_mul.eq(like == VectorOp.MUL)]
                    m.d.sync += [cmd.eq(p), cmd.op.eq(like), rms.eq(p.op.matches(*RMS_OPS)),
                                 beat.eq(0), s1.eq(0), s2.eq(0), n.eq(p.length),
                                 *set_rem(p.length), best_v.eq(-(1 << 15)), best_i.eq(0),
                                 pos.eq(0), pair_first.eq(1)]
                    with m.Switch(like):
                        with m.Case(VectorOp.LOAD_LUT):
                            m.d.sync += set_rem(LUT_ENTRIES)
                            m.next = "LOAD"
                        with m.Case(VectorOp.LOAD_LUT16):
                            m.d.sync += set_rem(GELU16_KNOTS)
                            m.next = "LOAD16"
                        with m.Case(VectorOp.ARGMAX):
                            with m.If(p.pairs):
                                m.next = "PAIRS"
                            with m.Else():
                                m.next = "ACC"
                        with m.Case(VectorOp.LN, VectorOp.LN_STATS):
                            m.next = "ACC"
                        with m.Case(VectorOp.LN_APPLY):
                            m.d.sync += n.eq(p.n)
                            m.next = "GET_STATS"
                        with m.Case(VectorOp.ONEHOT):
                            m.next = "GET_STATS"
                        with m.Default():
                            m.next = "ELEM"

            with m.State("ELEM"):
                m.d.comb += [
                    self.i_a.ready.eq(adv & (~need_b | self.i_b.valid)),
                    self.i_b.ready.eq(need_b & adv & self.i_a.valid),
                ]
                with m.If(self.i_a.valid & self.i_a.ready):
                    m.d.comb += fire.eq(1)
                    m.d.sync += set_rem(remaining - lanes)
                    with m.If(last_beat):
                        m.next = "IDLE"

            with m.State("LOAD"):
                m.d.comb += self.i_a.ready.eq(1)
                for j in range(lanes):
                    m.d.comb += [lut_w[j].addr.eq(beat + j), lut_w[j].data.eq(a[j][0:8]),
                                 lut_w[j].en.eq(self.i_a.valid & lane_ok[j])]
                with m.If(self.i_a.valid):
                    m.d.sync += [beat.eq(beat + lanes), *set_rem(remaining - lanes)]
                    with m.If(last_beat):
                        m.next = "IDLE"

            with m.State("LOAD16"):
                # Knot e (lane j of this beat) completes entry e - 1 with the knot before it:
                # the lane to its left, or for lane 0 the previous beat's last lane.
                m.d.comb += self.i_a.ready.eq(1)
                for j in range(lanes):
                    knot = a[j][0:16].as_signed()
                    prev = a[j - 1][0:16].as_signed() if j else knot_prev
                    first = (beat == 0) if j == 0 else Const(0)
                    m.d.comb += [lut16_w[j].addr.eq(beat + j - 1),
                                 lut16_w[j].data.base.eq(prev),
                                 lut16_w[j].data.delta.eq(knot - prev),
                                 lut16_w[j].en.eq(self.i_a.valid & lane_ok[j] & ~first)]
                with m.If(self.i_a.valid):
                    m.d.sync += [beat.eq(beat + lanes), *set_rem(remaining - lanes),
                                 knot_prev.eq(a[lanes - 1][0:16])]
                    with m.If(last_beat):
                        m.next = "IDLE"

            with m.State("ACC"):
                m.d.comb += self.i_a.ready.eq(1)
                with m.If(self.i_a.valid):
                    m.d.comb += buf_w.en.eq(op == VectorOp.LN)
                    m.d.sync += [beat.eq(beat + 1), *set_rem(remaining - lanes),
                                 pos.eq(pos + lanes)]
                    if deep:
                        # The beat's lanes into the statistics steps.
                        m.d.sync += [st_valid[0].eq(1), st_pos.eq(pos), *[
                            x.eq(Mux(lane_ok[j], a[j][0:16], Mux(is_argmax, -(1 << 15), 0)))
                            for j, x in enumerate(st_x)]]
                    else:
                        m.d.sync += [s1.eq(Mux(rms, 0, s1 + beat_s1)), s2.eq(s2 + beat_s2)]
                    if not deep:
                        with m.If(amax_v > best_v):
                            m.d.sync += [best_v.eq(amax_v), best_i.eq(pos + amax_j)]
                    with m.If(last_beat):
                        with m.If(op == VectorOp.LN):
                            m.d.sync += step.eq(0)
                            m.next = "RSQRT"
                        with m.Else():
                            # deep: the last beat's sums or maximum are taken in DRAIN.
                            m.d.sync += step.eq(0)
                            m.next = "DRAIN" if deep else "STATS"

            if deep:
                with m.State("DRAIN"):
                    m.d.sync += step.eq(step + 1)
                    # The statistics steps: the record stage is stats_cycles after the last beat.
                    with m.If(step == stats_cycles(self._pipeline) - 2):
                        m.next = "STATS"

            with m.State("PAIRS"):
                # ARGMAX combining records: the largest value, then the lowest index.
                m.d.comb += self.i_stats.ready.eq(1)
                with m.If(self.i_stats.valid):
                    rec = self.i_stats.payload.data[0]
                    r_i, r_v = rec[0:32].as_signed(), rec[32:48].as_signed()
                    better = (r_v > best_v) | ((r_v == best_v) & (r_i < best_i.as_signed()))
                    m.d.sync += set_rem(remaining - 1)
                    with m.If(pair_first | better):
                        m.d.sync += [best_v.eq(r_v), best_i.eq(r_i), pair_first.eq(0)]
                    with m.If(remaining == 1):
                        m.next = "STATS"

            with m.State("STATS"):
                # ARGMAX: the record's first 8 bytes (int32 index + n, int16 maximum, 0).
                index = Signal(32)
                m.d.comb += index.eq(best_i + cmd.n)
                record = Cat(index, best_v, Const(0, 16))
                m.d.comb += [self.o_stats.valid.eq(1),
                             self.o_stats.payload.data[0].eq(
                                 Mux(is_argmax, record.as_signed(), s1)),
                             self.o_stats.payload.data[1].eq(Mux(is_argmax, 0, s2)),
                             self.o_stats.payload.last.eq(1)]
                with m.If(self.o_stats.ready):
                    m.next = "IDLE"

            with m.State("GET_STATS"):
                m.d.comb += self.i_stats.ready.eq(1)
                with m.If(self.i_stats.valid):
                    m.d.sync += [s1.eq(Mux(rms, 0, self.i_stats.payload.data[0][0:32])),
                                 s2.eq(self.i_stats.payload.data[1]),
                                 step.eq(0),
                                 rel.eq(self.i_stats.payload.data[0][0:32].as_signed() - cmd.n)]
                    with m.If(op == VectorOp.ONEHOT):
                        m.next = "GEN"
                    with m.Else():
                        m.next = "RSQRT"

            with m.State("GEN"):
                # ONEHOT: a beat every cycle the pipeline advances, no input.
                with m.If(adv):
                    m.d.comb += fire.eq(1)
                    m.d.sync += [*set_rem(remaining - lanes), rel.eq(rel - lanes)]
                    with m.If(last_beat):
                        m.next = "IDLE"

            with m.State("RSQRT"):
                m.d.sync += [step.eq(step + 1), beat.eq(0), *set_rem(cmd.length)]
                if not deep:
                    self._rsqrt(m, step, n, s1, s2, d, m_norm, y_r, y2, my2, zs)
                with m.If(step == rsqrt_end):
                    m.next = "NORM"

            with m.State("NORM"):
                from_buf = op == VectorOp.LN
                m.d.comb += [
                    self.i_a.ready.eq(~from_buf & adv & self.i_b.valid),
                    self.i_b.ready.eq(adv & (from_buf | self.i_a.valid)),
                ]
                with m.If(self.i_b.valid & self.i_b.ready):
                    m.d.comb += fire.eq(1)
                    m.d.sync += [*set_rem(remaining - lanes), beat.eq(beat + 1)]
                    # The buffer's read port is synchronous: present the next address now.
                    with m.If(~last_beat):
                        m.d.comb += buf_r.addr.eq(beat + 1)
                    with m.If(last_beat):
                        m.next = "IDLE"
        if deep:
            # Outside the FSM's states: the DSPs' operands are their registers, not gated by
            # the state.
            self._rsqrt_deep(m, product, fsm.ongoing("RSQRT"), step, n, s1, s2, d, m_norm, y_r,
                             y2, zs)
        return m

    @staticmethod
    def _rsqrt(m, step, n, s1, s2, d, m_norm, y_r, y2, my2, zs):
        """Fixed-latency rsqrt of D = n*S2 - S1^2, as :func:`sim.golden.vector.rsqrt_fixed`."""
        q = RSQRT_FRAC_BITS
        with m.Switch(step):
            with m.Case(0):
                _clamp_d(m, d, n * s2 - s1 * s1)
            with m.Case(1):
                VectorUnit._normalise_seed(m, d, m_norm, y_r, zs)
            for k in range(RSQRT_NEWTON_STEPS):
                with m.Case(2 + 3 * k):
                    m.d.sync += y2.eq((y_r * y_r) >> q)
                with m.Case(3 + 3 * k):
                    m.d.sync += my2.eq((m_norm * y2) >> 30)
                with m.Case(4 + 3 * k):
                    m.d.sync += y_r.eq((y_r * (Const(3 << q) - my2)) >> (q + 1))

    @staticmethod
    def _rsqrt_deep(m, product, running, step, n, s1, s2, d, m_norm, y_r, y2, zs):
        """:meth:`_rsqrt` with every product's partial products (one DSP each, ``product``) in
        registers, added in the next cycle: steps 0 to 2 let the last beat's statistics in; 3,
        4 the products n * S2 and S1^2; 5 D; 6 D's bit length, 7 the normalised m, 8 the seed;
        then per Newton step each of its three multiplies in two cycles (the partial products,
        then their sum shifted, with the next multiply's subtraction). The same truncations,
        so the same Y bit for bit. ``running``: the FSM is in its rsqrt state, whose ``step``
        counts the cycles.

        The partial products' registers load every cycle (their operands straight from their
        registers, no multiplexer or gate before the DSPs): each sum is taken the cycle after
        the step whose operands it multiplies."""
        q = RSQRT_FRAC_BITS
        ns2 = Signal(signed(96))
        s1sq = Signal(signed(64))
        length = Signal(range(len(d) + 1))      # D's bit length
        three_my2 = Signal(signed(q + 4))

        def total(a, b, name):
            return tree_sum([product(f"{name}_pp{k}", pa, pb, en=1, reg_inputs=False) << sh
                             for k, (pa, pb, sh) in enumerate(_pieces(a, b))], m=m, name=name)

        newton = [(y_r, y_r), (m_norm, y2), (y_r, three_my2)]
        sums = [total(a, b, f"newton_sum{i}") for i, (a, b) in enumerate(newton)]
        ns2_sum, s1sq_sum = total(n, s2, "ns2_sum"), total(s1, s1, "s1sq_sum")
        d_length = _leading_one(m, d, "d_length")
        with m.If(running), m.Switch(step):
            with m.Case(4):
                m.d.sync += [ns2.eq(ns2_sum), s1sq.eq(s1sq_sum)]
            with m.Case(5):
                _clamp_d(m, d, ns2 - s1sq)
            with m.Case(6):
                m.d.sync += length.eq(d_length)
            with m.Case(7):
                VectorUnit._normalise(m, d, length, m_norm, zs)
            with m.Case(8):
                VectorUnit._seed(m, m_norm, y_r)
            for k in range(RSQRT_NEWTON_STEPS):
                base = 9 + 6 * k
                # Steps base, base + 2, base + 4: the partial products of y_r^2, m * y2 and
                # y_r * (3 - m y2) are taken.
                with m.Case(base + 1):
                    m.d.sync += y2.eq(sums[0] >> q)
                with m.Case(base + 3):
                    # my2 = (m * y2) >> 30 in RSQRT_FRAC_BITS + 3 bits, as the short rsqrt.
                    m.d.sync += three_my2.eq(Const(3 << q) - (sums[1] >> 30)[0:q + 3])
                with m.Case(base + 5):
                    m.d.sync += y_r.eq(sums[2] >> (q + 1))

    @staticmethod
    def _normalise(m, d, length, m_norm, zs):
        """m_norm = D normalised to [2**30, 2**32) by an even shift s = 2h (zs = 23 + h), from
        D's bit length (0: D = 0, m = 0)."""
        m.d.sync += [zs.eq(RSQRT_FRAC_BITS + 15 - LN_Z_FRAC_BITS), m_norm.eq(0)]
        with m.Switch(length):
            for e in range(62, 0, -1):
                s = e - 31 if (e - 31) % 2 == 0 else e - 32
                with m.Case(e):
                    m.d.sync += [m_norm.eq(d >> s if s >= 0 else d << -s),
                                 zs.eq(RSQRT_FRAC_BITS + 15 - LN_Z_FRAC_BITS + s // 2)]

    @staticmethod
    def _seed(m, norm, y_r):
        """Y's seed from m's top 7 bits (0 outside the table), as a multiplexer tree."""
        table = rsqrt_seed_table()
        index = norm[RSQRT_SEED_SHIFT:32]
        rom = Array(Const(table[i - RSQRT_SEED_BASE] if 0 <= i - RSQRT_SEED_BASE < len(table)
                          else 0, len(y_r)) for i in range(1 << len(index)))
        m.d.sync += y_r.eq(rom[index])

    @staticmethod
    def _normalise_seed(m, d, m_norm, y_r, zs):
        """Normalise D to m in [2**30, 2**32) by an even shift s = 2h (zs = 23 + h), one
        constant shift per bit length e of D; seed Y from m's top 7 bits."""
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
