"""The vector unit as the chip sees it: scratchpad words in, scratchpad words out.

A ``VEC`` launch runs ``rows`` commands of :class:`~hw.tile.vector.VectorUnit`, one per row of
``length`` elements, back to back. Memory formats (N = ``lanes`` = bytes per scratchpad word):
a row of ``length`` elements of ``eb`` bytes is ``ceil(length * eb / N)`` words, element c at
byte ``c * eb`` little-endian (``hw.spec.memory.pack_rows``). The element widths come from the
launch's flags (:class:`hw.spec.vector_engine.VecFlags`).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..layouts import spad_word_layout, spad_write_layout
from ..spec.isa import COUNT_BITS
from ..spec.timing.chip import VEC_OUT_FIFO_DEPTH
from ..spec.timing.vector import check_pipeline
from ..spec.vector import GSHIFT_BITS, LENGTH_BITS, N_BITS, VectorOp, argmax_words
from ..spec.vector_engine import (
    B_OPS,
    ELEM_BYTES,
    RECORD_IN_OPS,
    RECORD_OUT_OPS,
    stats_words,
)
from .vector import VectorUnit, check_sizes

__all__ = ["VectorEngine", "cfg_layout", "flags_layout", "uses_layout", "CFG_REGS", "GENS"]

#: Which ISA register feeds each ``i_cfg`` field at launch.
CFG_REGS = {"op": "VU_OP", "rows": "VU_ROWS", "length": "VU_LEN", "n": "VU_N",
            "mult": "VU_MULT", "shift": "VU_SHIFT", "gshift": "VU_GSHIFT", "flags": "VU_FLAGS"}

#: Which address generator serves each word stream.
GENS = {"i_a": "RD3", "i_b": "RD4", "i_stats": "RD5", "o_data": "WR1", "o_q": "WR2"}


def flags_layout() -> data.StructLayout:
    """``VU_FLAGS``, bit 0 first (:mod:`hw.spec.vector_engine`)."""
    return data.StructLayout({"out16": 1, "per_channel": 1, "a_bytes": 2, "b_bytes": 2,
                              "d_bytes": 2, "wr_data": 1, "wr_q": 1, "pairs": 1, "keep": 1})


def cfg_layout() -> data.StructLayout:
    """Payload of ``i_cfg``: one field per register of :data:`CFG_REGS`."""
    return data.StructLayout({
        "op": unsigned(4),
        "rows": unsigned(COUNT_BITS),
        "length": unsigned(LENGTH_BITS),
        "n": unsigned(N_BITS),
        "mult": unsigned(16),
        "shift": unsigned(6),
        "gshift": unsigned(GSHIFT_BITS),
        "flags": flags_layout(),
    })


def uses_layout() -> data.StructLayout:
    """``uses``: which word streams (and so which generators) a launch runs."""
    return data.StructLayout({"a": 1, "b": 1, "stats": 1, "data": 1, "q": 1})


def _gather(m, name, src, code, row_bytes, lanes, active, start, start_bytes):
    """Words -> beats of ``1 << code`` words (fewer at a row's end) in a register.

    Returns ``(valid, ready, flat)``: the beat register's handshake (``ready`` is driven by the
    caller) and its ``4 * 8 * lanes`` bits; a word enters while the register is free or being
    emptied.
    """
    n = lanes
    words = [Signal(8 * n, name=f"{name}_w{k}") for k in range(4)]
    cnt = Signal(2, name=f"{name}_cnt")
    full = Signal(name=f"{name}_full")
    ready = Signal(name=f"{name}_ready")
    left = Signal(LENGTH_BITS + 3, name=f"{name}_left")   # row bytes not yet received
    need_m1 = Signal(2, name=f"{name}_need_m1")
    m.d.comb += need_m1.eq((Const(1, 3) << code) - 1)
    m.d.comb += src.ready.eq(active & (~full | ready))
    with m.If(full & ready):
        m.d.sync += full.eq(0)
    with m.If(src.valid & src.ready):
        row_end = left <= n
        for k in range(4):
            with m.If(cnt == k):
                m.d.sync += words[k].eq(src.payload.data.as_value())
        with m.If(row_end | (cnt == need_m1)):
            m.d.sync += [full.eq(1), cnt.eq(0)]
        with m.Else():
            m.d.sync += cnt.eq(cnt + 1)
        with m.If(row_end):
            m.d.sync += left.eq(row_bytes)
        with m.Else():
            m.d.sync += left.eq(left - n)
    with m.If(start):
        m.d.sync += [full.eq(0), cnt.eq(0), left.eq(start_bytes)]
    return full, ready, Cat(*words)


def _fifo(m, name, valid, ready, payload, depth):
    """A SyncFIFO between a (valid, ready, payload) source and the returned read side."""
    fifo = SyncFIFO(width=len(payload), depth=depth)
    m.submodules[name] = fifo
    m.d.comb += [fifo.w_en.eq(valid), fifo.w_data.eq(payload), ready.eq(fifo.w_rdy)]
    return fifo.r_rdy, fifo.r_en, fifo.r_data


def _unpack(m, flat, dst, code, lanes):
    """Lane j is bytes [j*eb, (j+1)*eb) of the beat, sign-extended to 32 bits."""
    for j in range(lanes):
        with m.Switch(code):
            for c, eb in enumerate(ELEM_BYTES):
                with m.Case(c):
                    m.d.comb += dst.payload.data[j].eq(
                        flat[8 * eb * j:8 * eb * (j + 1)].as_signed())



class VectorEngine(wiring.Component):
    """Launch-configured wrapper of :class:`~hw.tile.vector.VectorUnit` for the chip.

    ``i_cfg`` starts one launch of ``rows`` commands (``op``, ``length``, ``n``, ``mult``,
    ``shift``, ``gshift``, ``out16``, ``per_channel`` from the configuration; ``rows`` >= 1).
    Operand words are unpacked into the unit's 32-bit lanes (sign-extended from ``a_bytes`` /
    ``b_bytes``); the unit's ``data`` lanes are packed into words with ``d_bytes`` per element
    (the low bytes: two's complement truncation), its ``q`` lanes one byte each.
    Per row the engine reads exactly ``ceil(length * eb / N)`` words of A (and of B when the op
    uses it) and writes exactly ``ceil(length * d_bytes / N)`` words of ``data`` (when
    ``wr_data``) and ``ceil(length / N)`` words of ``q`` (when ``wr_q``); padding bytes of a
    row's last word are 0, or, with ``keep``, not written in ``data`` (``o_data``'s ``mask``).
    LOAD_LUT reads one row of 256 entries (``length`` must be 256) per command and writes
    nothing; so does LOAD_LUT16 with the 257 int16 knots of the GELU16 table (``length`` 257,
    usually ``a_bytes`` 2). GELU16 writes its two planes at once: ``data`` (WR1) is the high byte
    ``y >> 8`` with ``d_bytes`` 1 (or y with ``out16`` and ``d_bytes`` 2), ``q`` (WR2) the low byte
    ``y & 0xFF``. ``last`` on input words is ignored (the engine counts); ``last`` is set on each
    output stream's final word of the launch.

    ``busy`` is high from the configuration beat until the last output word has been taken
    (LOAD_LUT, LOAD_LUT16: until the unit has consumed its last word). ``uses`` tells the chip, from
    the ``i_cfg`` payload (combinationally, before the transfer), which generators to start with the
    launch: RD3 for every op but ONEHOT and pair-mode ARGMAX, RD4 iff the op reads B
    (:func:`hw.spec.vector_engine.uses_b`), WR1 iff ``wr_data`` (not for LN_STATS and ARGMAX),
    WR2 iff ``wr_q`` (neither for LOAD_LUT and LOAD_LUT16), RD5 iff LN_APPLY, RMS_APPLY, ONEHOT
    or pair-mode ARGMAX (:func:`hw.spec.vector_engine.uses_records`).

    LayerNorm statistics travel through the scratchpad as records of
    :data:`hw.spec.vector_engine.STATS_BYTES` bytes (int64 ``sum x``, int64 ``sum x^2``,
    little-endian, ``stats_words(N)`` words): LN_STATS writes one per row on ``o_q`` (WR2;
    ``wr_q`` must be set), LN_APPLY and RMS_APPLY read one per row on ``i_stats`` (RD5).
    Argmax records (:data:`hw.spec.vector.ARGMAX_BYTES`, ``argmax_words(N)`` words) take the same
    two paths: ARGMAX writes one per row on ``o_q``, ONEHOT reads one per row on ``i_stats``
    (pair-mode ARGMAX ``length`` per row).

    ``pipeline`` is the unit's (:class:`~hw.tile.vector.VectorUnit`): ``"short"`` or
    ``"deep"``, the NPU file's ``vector_pipeline``; so is ``ecp5_dsp`` (an ECP5 build: the
    deep pipeline's products in instantiated MULT18X18Ds with their registers).

    Timing (:func:`hw.spec.timing.vector.launch_cycles`): at most one word per cycle on each stream;
    a word becomes a beat in a one-beat register per operand (the next row's first beat is fetched
    while the unit finishes the previous row); results pass a FIFO of
    :data:`hw.spec.timing.chip.VEC_OUT_FIFO_DEPTH` (4) beats to the packer: the unit's pipeline
    stalls as a whole when its output is full, so without it a slow packer (4 words per beat for
    int32 data) would also stall the input side and the row period would exceed the slowest stream's
    words per row. With it, :func:`hw.spec.timing.vector.launch_cycles` holds exactly. From the
    configuration beat the first command is offered the next cycle; the first result word leaves
    about 7 cycles after the first input word arrives (16 with the deep pipeline).

    Members
    -------
    i_cfg : ``In(stream.Signature(cfg_layout()))``
    i_a, i_b, i_stats : ``In(stream.Signature(spad_word_layout(lanes)))``: words from RD3, RD4, RD5
    o_data : ``Out(stream.Signature(spad_write_layout(lanes)))``: words to WR1, with their
        byte write enables
    o_q : ``Out(stream.Signature(spad_word_layout(lanes)))``: words to WR2
    uses : ``Out(uses_layout())``
    busy : ``Out(1)``
    """

    def __init__(self, *, lanes: int, d_model_max: int, pipeline: str = "short",
                 ecp5_dsp: bool = False):
        check_sizes(lanes, d_model_max, min_lanes=2)
        if not isinstance(ecp5_dsp, bool):
            raise TypeError(f"ecp5_dsp must be a bool, not {ecp5_dsp!r}")
        self._lanes = lanes
        self._d_model_max = d_model_max
        self._pipeline = check_pipeline(pipeline)
        self._ecp5_dsp = ecp5_dsp
        self._out_fifo_depth = VEC_OUT_FIFO_DEPTH
        super().__init__({
            "i_cfg": In(stream.Signature(cfg_layout())),
            "i_a": In(stream.Signature(spad_word_layout(lanes))),
            "i_b": In(stream.Signature(spad_word_layout(lanes))),
            "i_stats": In(stream.Signature(spad_word_layout(lanes))),
            "o_data": Out(stream.Signature(spad_write_layout(lanes))),
            "o_q": Out(stream.Signature(spad_word_layout(lanes))),
            "uses": Out(uses_layout()),
            "busy": Out(1),
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

    def elaborate(self, platform):
        m = Module()
        n = self._lanes
        m.submodules.unit = unit = VectorUnit(lanes=n, d_model_max=self._d_model_max,
                                                  pipeline=self._pipeline,
                                                  room_next=self._pipeline == "deep",
                                                  ecp5_dsp=self._ecp5_dsp)
        cfg = Signal(cfg_layout())
        flags = cfg.flags
        active = Signal()
        m.d.comb += self.busy.eq(active)

        # Which streams a launch uses, from the payload the chip is offering.
        p = self.i_cfg.payload
        b_ops = p.op.matches(*B_OPS) | ((p.op == VectorOp.REQUANT) & p.flags.per_channel)
        writes = (p.op != VectorOp.LOAD_LUT) & (p.op != VectorOp.LOAD_LUT16)
        pairs = (p.op == VectorOp.ARGMAX) & p.flags.pairs
        m.d.comb += [self.uses.a.eq((p.op != VectorOp.ONEHOT) & ~pairs), self.uses.b.eq(b_ops),
                     self.uses.stats.eq(p.op.matches(*RECORD_IN_OPS) | pairs),
                     self.uses.data.eq(p.flags.wr_data & writes
                                       & ~p.op.matches(*RECORD_OUT_OPS)),
                     self.uses.q.eq(p.flags.wr_q & writes)]

        start = Signal()
        m.d.comb += [self.i_cfg.ready.eq(~active), start.eq(self.i_cfg.valid & ~active)]
        with m.If(start):
            m.d.sync += [cfg.eq(p), active.eq(1)]

        # ---- commands: one per row, offered back to back --------------------------------
        issued = Signal(COUNT_BITS)
        c = unit.i_cmd
        # deep: whether commands remain, in a register (issued != rows, ahead of time).
        more = Signal()
        if self._pipeline == "deep":
            with m.If(start):
                m.d.sync += more.eq(p.rows != 0)
            with m.Elif(c.valid & c.ready):
                m.d.sync += more.eq(issued + 1 != cfg.rows)
        else:
            m.d.comb += more.eq(issued != cfg.rows)
        m.d.comb += [
            c.valid.eq(active & more),
            c.payload.op.eq(cfg.op), c.payload.length.eq(cfg.length), c.payload.n.eq(cfg.n),
            c.payload.mult.eq(cfg.mult), c.payload.shift.eq(cfg.shift),
            c.payload.gshift.eq(cfg.gshift), c.payload.out16.eq(flags.out16),
            c.payload.per_channel.eq(flags.per_channel), c.payload.pairs.eq(flags.pairs),
        ]
        with m.If(c.valid & c.ready):
            m.d.sync += issued.eq(issued + 1)
        with m.If(start):
            m.d.sync += issued.eq(0)

        # ---- records: RD5 words -> i_stats (LN_APPLY, RMS_APPLY, ONEHOT) --------------------
        # A record is stats_words(N) words, or argmax_words(N) for ARGMAX and ONEHOT.
        rec = stats_words(n)
        rec_end = Signal(range(rec))
        m.d.comb += rec_end.eq(Mux(cfg.op.matches(VectorOp.ARGMAX, VectorOp.ONEHOT),
                                   argmax_words(n) - 1, rec - 1))
        rec_bits = 8 * n * rec
        s_words = [Signal(8 * n, name=f"gs_w{k}") for k in range(rec)]
        s_cnt = Signal(range(rec))
        s_full = Signal()
        s_flat = Cat(*s_words)
        m.d.comb += [
            self.i_stats.ready.eq(active & ~s_full),
            unit.i_stats.valid.eq(s_full),
            unit.i_stats.payload.data[0].eq(s_flat[0:64].as_signed()),
            unit.i_stats.payload.data[1].eq(s_flat[64:128].as_signed()),
            unit.i_stats.payload.last.eq(1),
        ]
        with m.If(unit.i_stats.valid & unit.i_stats.ready):
            m.d.sync += s_full.eq(0)
        with m.If(self.i_stats.valid & self.i_stats.ready):
            for k in range(rec):
                with m.If(s_cnt == k):
                    m.d.sync += s_words[k].eq(self.i_stats.payload.data.as_value())
            with m.If(s_cnt == rec_end):
                m.d.sync += [s_cnt.eq(0), s_full.eq(1)]
            with m.Else():
                m.d.sync += s_cnt.eq(s_cnt + 1)
        with m.If(start):
            m.d.sync += [s_cnt.eq(0), s_full.eq(0)]

        # ---- records: o_stats -> WR2 words (LN_STATS, ARGMAX) ------------------------------
        is_stats = cfg.op.matches(*RECORD_OUT_OPS)
        so = Signal(rec_bits)
        so_full = Signal()
        so_part = Signal(range(rec))
        so_row = Signal(COUNT_BITS)
        so_last = (so_part == rec_end) & (so_row == cfg.rows - 1)
        so_word = Signal(8 * n)
        with m.Switch(so_part):
            for k in range(rec):
                with m.Case(k):
                    m.d.comb += so_word.eq(so[8 * n * k:8 * n * (k + 1)])
        m.d.comb += unit.o_stats.ready.eq(~so_full)
        with m.If(unit.o_stats.valid & unit.o_stats.ready):
            m.d.sync += [so.eq(Cat(unit.o_stats.payload.data[0], unit.o_stats.payload.data[1])),
                         so_full.eq(1), so_part.eq(0)]
        so_fire = is_stats & so_full & self.o_q.ready
        with m.If(so_fire):
            m.d.sync += so_part.eq(so_part + 1)
            with m.If(so_part == rec_end):
                m.d.sync += [so_full.eq(0), so_row.eq(so_row + 1)]
                with m.If(so_row == cfg.rows - 1):
                    m.d.sync += active.eq(0)
        with m.If(start):
            m.d.sync += [so_full.eq(0), so_row.eq(0)]

        # ---- operands: words -> beats -----------------------------------------------------
        for x, src, dst in (("a", self.i_a, unit.i_a), ("b", self.i_b, unit.i_b)):
            code = getattr(flags, f"{x}_bytes")
            valid, ready, flat = _gather(m, f"g{x}", src, code, cfg.length << code, n, active,
                                         start, p.length << getattr(p.flags, f"{x}_bytes"))
            m.d.comb += [dst.valid.eq(valid), ready.eq(dst.ready)]
            _unpack(m, flat, dst, code, n)

        # ---- results: one unit beat -> d_bytes data words and one q word ------------------
        uo = unit.o_data
        u_valid, u_ready, raw = _fifo(m, "fifo_o", uo.valid, uo.ready, uo.payload.as_value(),
                                      self._out_fifo_depth)
        if self._pipeline == "deep":
            # The FIFO's level, mirrored, a cycle ahead: whether it takes a beat next cycle.
            depth = self._out_fifo_depth
            level = Signal(range(depth + 1))
            level_next = Signal(range(depth + 1))
            m.d.comb += [level_next.eq(level + (uo.valid & (level != depth))
                                       - (u_ready & (level != 0))),
                         unit.o_room_next.eq(level_next != depth)]
            m.d.sync += level.eq(level_next)
        u_payload = Signal(uo.payload.shape())
        m.d.comb += u_payload.eq(raw)
        beat = Signal(data.ArrayLayout(unsigned(32), n))
        qbeat = Signal(8 * n)
        full = Signal()
        beat_last = Signal()
        d_done = Signal()
        q_done = Signal()
        part = Signal(2)
        d_left = Signal(LENGTH_BITS + 3)     # bytes of the data row not yet written
        out_row = Signal(COUNT_BITS)
        deep = self._pipeline == "deep"
        part_end = (Const(1, 3) << flags.d_bytes) - 1
        if deep:
            # The packer's compares in registers, set with the counters they compare (the
            # deep pipeline's clock): the row's last data word, the beat's, the last row.
            d_row_end, part_last, final_row = Signal(), Signal(), Signal()
            row_short = Signal()                # a whole data row is one word
        else:
            final_row = out_row == cfg.rows - 1
            d_row_end = d_left <= n
            part_last = part == part_end
        d_beat_end = d_row_end | part_last
        packed = [Cat(*[beat[j][:8 * eb] for j in range(n)]) for eb in ELEM_BYTES]
        with m.Switch(flags.d_bytes):
            for code, bits in enumerate(packed):
                with m.Case(code):
                    with m.Switch(part):
                        for w in range(ELEM_BYTES[code]):
                            with m.Case(w):
                                m.d.comb += self.o_data.payload.data.eq(
                                    bits[8 * n * w:8 * n * (w + 1)])
        m.d.comb += [
            self.o_data.valid.eq(full & ~d_done),
            self.o_data.payload.last.eq(d_row_end & final_row),
        ]
        # ``keep``: the bytes of a row's last word past the row are not written.
        for i in range(n):
            m.d.comb += self.o_data.payload.mask[i].eq(~flags.keep | ~d_row_end | (d_left > i))
        q_valid = full & ~q_done
        with m.If(is_stats):
            m.d.comb += [self.o_q.valid.eq(so_full), self.o_q.payload.data.eq(so_word),
                         self.o_q.payload.last.eq(so_last)]
        with m.Else():
            m.d.comb += [self.o_q.valid.eq(q_valid), self.o_q.payload.data.eq(qbeat),
                         self.o_q.payload.last.eq(beat_last & final_row)]
        d_fire = self.o_data.valid & self.o_data.ready
        q_fire = q_valid & self.o_q.ready & ~is_stats
        finish = Signal()
        m.d.comb += [
            finish.eq(full & (d_done | (d_fire & d_beat_end)) & (q_done | q_fire)),
            u_ready.eq(~full | finish),
        ]
        def set_part(value):
            stmts = [part.eq(value)]
            if deep:
                stmts.append(part_last.eq(Value.cast(value)[:len(part)] == part_end))
            return stmts

        with m.If(d_fire):
            m.d.sync += set_part(part + 1)
            with m.If(d_beat_end):
                m.d.sync += [d_done.eq(1), *set_part(0)]
            with m.If(d_row_end):
                m.d.sync += d_left.eq(cfg.length << flags.d_bytes)
                if deep:
                    m.d.sync += d_row_end.eq(row_short)
            with m.Else():
                m.d.sync += d_left.eq(d_left - n)
                if deep:
                    m.d.sync += d_row_end.eq((d_left - n)[:len(d_left)] <= n)
        with m.If(q_fire):
            m.d.sync += q_done.eq(1)
        with m.If(finish):
            m.d.sync += full.eq(0)
            with m.If(beat_last):
                m.d.sync += out_row.eq(out_row + 1)
                if deep:
                    m.d.sync += final_row.eq(out_row + 2 == cfg.rows)
                with m.If(final_row):
                    m.d.sync += active.eq(0)
        with m.If(u_valid & u_ready):
            m.d.sync += [full.eq(1), beat_last.eq(u_payload.last), *set_part(0),
                         d_done.eq(~flags.wr_data), q_done.eq(~flags.wr_q),
                         qbeat.eq(u_payload.q.as_value())]
            m.d.sync += [beat[j].eq(u_payload.data[j]) for j in range(n)]

        # LOAD_LUT(16) emits nothing: the launch ends when the unit is back for a command.
        loads = (cfg.op == VectorOp.LOAD_LUT) | (cfg.op == VectorOp.LOAD_LUT16)
        with m.If(active & loads & (issued == cfg.rows) & c.ready):
            m.d.sync += active.eq(0)

        with m.If(start):
            m.d.sync += [out_row.eq(0), full.eq(0), part.eq(0),
                         d_left.eq(p.length << p.flags.d_bytes)]
            if deep:
                row_bytes = p.length << p.flags.d_bytes
                m.d.sync += [part_last.eq(p.flags.d_bytes == 0), final_row.eq(p.rows == 1),
                             d_row_end.eq(row_bytes <= n), row_short.eq(row_bytes <= n)]
        return m
