"""The attention unit as the chip sees it (opcode ``ATTN``): scratchpad words in and out.

One launch computes one attention head over a block of queries: the K/V ring
(:class:`~hw.tile.attention.AttentionBuffer`), the softmax (:class:`~hw.tile.softmax.SoftmaxUnit`)
and an output requantiser (``sim.golden.matmul.requant`` to int8). Golden model of a launch:
``sim.iss.attention.exec_attention`` (the golden ring sequence with the golden softmax).

Memory formats (``size`` = N = bytes per scratchpad word): a token's head slice is ``d_head``
int8 (``d_head / N`` words, ``d_head`` a multiple of N, starting at a word boundary); K, V and Q
rows arrive as such word groups, the output row leaves as one.
"""

from amaranth.hdl import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect

from ..layouts import spad_word_layout
from ..spec.attention import FLAGS_WIDTH, HALO_BITS, HALO_SHIFT, POS_BITS, softmax_lanes
from ..spec.formats import ACC_BITS, MULT_BITS, OPERAND_BITS, SHIFT_BITS
from ..spec.isa import COUNT_BITS
from .attention import AttentionBuffer
from .softmax import SoftmaxUnit

__all__ = ["AttentionEngine", "cfg_layout"]


def cfg_layout(d_head):
    """The launch configuration, one field per ``AT_*`` register."""
    return data.StructLayout({
        "queries": unsigned(COUNT_BITS),        # AT_QUERIES
        "keys": unsigned(COUNT_BITS),           # AT_KEYS
        "q_pos": unsigned(POS_BITS),            # AT_Q_POS
        "k_pos": unsigned(POS_BITS),            # AT_K_POS
        "window": unsigned(POS_BITS),           # AT_WINDOW (0: the ring's own W)
        "flags": unsigned(FLAGS_WIDTH),         # AT_FLAGS
        "score_mult": unsigned(MULT_BITS),      # AT_SCORE_MULT
        "score_shift": unsigned(SHIFT_BITS),    # AT_SCORE_SHIFT
        "out_mult": unsigned(MULT_BITS),        # AT_OUT_MULT
        "out_shift": unsigned(SHIFT_BITS),      # AT_OUT_SHIFT
        "d_head": unsigned(d_head.bit_length()),   # AT_D_HEAD, lanes
    })


class AttentionEngine(wiring.Component):
    """One attention head per launch: K/V/Q words in, int8 output words out.

    Parameters (keyword-only)
    -------------------------
    window : int
        W, tokens the K/V ring holds (``attn_window``).
    d_head : int
        D, lanes of the attention datapath (``d_head_max``), a multiple of ``size``.
    length : int
        L, lanes of the score row and of the softmax (``softmax_len``), >= max(W, 2).
    size : int
        N, bytes per scratchpad word (``array_size``), >= 2.

    The softmax unit runs ``P = softmax_lanes(L)`` lanes per cycle (the largest divisor of L
    not above 4), so its latency ``5 L / P + 1`` stays comparable to the buffer's sweeps.

    Launch (``i_cfg``, one beat per ``ATTN``; fields as :func:`cfg_layout`)
    -------------------------------------------------------------------
    ``h = cfg.d_head`` lanes per token (a multiple of N, at most D), ``h / N`` words per row.
    The engine writes ``keys`` K/V tokens (positions ``k_pos, k_pos + 1, ...``; the first one
    restarts the ring) and issues ``queries`` queries (positions ``q_pos, q_pos + 1, ...``) in
    this order:

    - preload (``FLAG_INTERLEAVED`` clear): every key, then every query;
    - interleaved: ``halo`` keys, then, before query t, one more key while fewer than
      ``min(keys, halo + t + 1)`` have been written.

    Each query's score row is ``requant(q.k, score_mult, score_shift, 16)`` on the visible lanes,
    its probabilities come from the softmax, and its output row is
    ``requant(sum_j p_j v_j, out_mult, out_shift, 8)``. A held key at position ``k`` is visible
    to a query at ``i`` when ``0 <= i - k < W`` (causal; the buffer's mask) or always
    (``FLAG_BIDIR``), and, if ``window`` = w > 0, also ``i - k < w`` (causal) or
    ``|i - k| < w`` (bidirectional): the engine narrows the buffer's mask on the score row's way
    to the softmax, whose zero probabilities then drop those keys from P.V.

    Split-score mode (partial Q.K rows all-reduced across chips, hidden-dimension parallelism)
    is not supported yet: the buffer's ``o_partial`` and ``i_reduced`` stay idle.

    Members
    -------
    i_cfg : ``In(stream.Signature(cfg_layout(D)))``
        Taken while idle; ``busy`` rises the next cycle.
    i_k, i_v, i_q : ``In(stream.Signature(spad_word_layout(N)))``
        K, V and Q rows, ``h / N`` words each (read ports RD3, RD4, RD5); lanes beyond ``h`` of
        the buffer are zero. Exactly ``keys`` (``queries``) rows are taken per launch; ``last``
        is ignored.
    o : ``Out(stream.Signature(spad_word_layout(N)))``
        ``queries`` output rows of ``h / N`` int8 words (write port WR1); ``last`` on the
        launch's final word.
    busy : ``Out(1)``
        High from the cycle after ``i_cfg`` is taken until the final word of ``o`` is taken.

    Timing and cost
    ---------------
    Rows are gathered from the read ports while the buffer works (one row of K, V and Q each
    waits in the engine), a finished output row waits in an output register while the next query
    proceeds, and the requantiser emits one word per cycle (N 32 x 16-bit multipliers, a
    variable shift and a clamp, combinational from the row register to ``o``; ``h/N`` cycles
    per row). The window narrowing costs a copy of the W slot positions (16 bits each) and W
    17-bit subtract-and-compare lanes, combinational between the buffer's score row and the
    softmax input register. Cycles per launch: ``hw.spec.timing.attention.launch_cycles``
    (exact with every word available, a lower bound otherwise) and the closed forms in
    ``docs/isa.md`` (ATTN).
    """

    def __init__(self, *, window, d_head, length, size):
        for name, value in (("window", window), ("d_head", d_head), ("length", length),
                            ("size", size)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an integer, not {value!r}")
        if size < 2:
            raise ValueError(f"size must be at least 2, not {size}")
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        if length < max(window, 2):
            raise ValueError(f"length={length} must be at least max(window={window}, 2)")
        if d_head < size or d_head % size:
            raise ValueError(f"d_head={d_head} must be a positive multiple of size={size} "
                             f"(a head slice is whole scratchpad words)")
        if window > 1 << POS_BITS:
            raise ValueError(f"window={window} exceeds the {POS_BITS}-bit position range")
        self._window, self._d_head, self._length, self._size = window, d_head, length, size
        super().__init__({
            "i_cfg": In(stream.Signature(cfg_layout(d_head))),
            "i_k": In(stream.Signature(spad_word_layout(size))),
            "i_v": In(stream.Signature(spad_word_layout(size))),
            "i_q": In(stream.Signature(spad_word_layout(size))),
            "o": Out(stream.Signature(spad_word_layout(size))),
            "busy": Out(1),
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

    @property
    def size(self):
        return self._size

    @property
    def lanes_per_cycle(self):
        return softmax_lanes(self._length)

    def elaborate(self, platform):
        m = Module()
        W, D, L, N = self._window, self._d_head, self._length, self._size
        i8 = signed(OPERAND_BITS)
        m.submodules.buffer = buf = AttentionBuffer(window=W, d_head=D, length=L)
        m.submodules.softmax = sm = SoftmaxUnit(length=L, lanes_per_cycle=softmax_lanes(L))
        connect(m, sm.o, buf.i_probs)
        # Split-score mode (o_partial / i_reduced) is not used: its ports stay idle.

        cfg = Signal(cfg_layout(D))
        active = Signal()
        m.d.comb += [self.busy.eq(active), self.i_cfg.ready.eq(~active)]

        # --- row gathering: h/N words -> one row of D lanes, zero beyond h -----------------
        def gather(port, name, rows):
            row = Signal(data.ArrayLayout(i8, D), name=f"{name}_row")
            off = Signal(range(D + 1), name=f"{name}_off")
            full = Signal(name=f"{name}_full")
            take = Signal(name=f"{name}_take")
            count = Signal(COUNT_BITS, name=f"{name}_rows")    # rows complete this launch
            gathers.append(count)
            # A row's first word may arrive in the cycle the previous row is taken, so a
            # one-word row (h = N) streams at one row per cycle. No word beyond the launch's
            # rows is taken (they would belong to the next launch).
            m.d.comb += port.ready.eq(active & (~full | take) & (count < rows))
            with m.If(take):
                # Cleared after use, so lanes beyond h stay zero for the next row (the word
                # taken in the same cycle, below, overrides its own lanes).
                m.d.sync += [row.eq(0), full.eq(0)]
            with m.If(port.valid & port.ready):
                with m.Switch(off):
                    for w in range(D // N):
                        with m.Case(w * N):
                            m.d.sync += [row[w * N + i].eq(port.payload.data[i])
                                         for i in range(N)]
                with m.If(off + N >= cfg.d_head):
                    m.d.sync += [full.eq(1), off.eq(0), count.eq(count + 1)]
                with m.Else():
                    m.d.sync += off.eq(off + N)
            return row, full, take

        gathers = []
        k_row, k_full, k_take = gather(self.i_k, "k", cfg.keys)
        v_row, v_full, v_take = gather(self.i_v, "v", cfg.keys)
        q_row, q_full, q_take = gather(self.i_q, "q", cfg.queries)

        # --- command issue: K/V writes and queries in schedule order ------------------------
        written = Signal(COUNT_BITS)        # keys written this launch
        issued = Signal(COUNT_BITS)         # queries issued this launch
        interleaved = cfg.flags[1]
        halo = cfg.flags[HALO_SHIFT:HALO_SHIFT + HALO_BITS]
        ahead = Signal(COUNT_BITS + 2)
        m.d.comb += ahead.eq(halo + issued + 1)
        target = Mux(interleaved & (ahead < cfg.keys), ahead, cfg.keys)
        want_key = written < target

        kv = buf.i_kv.payload
        m.d.comb += [
            buf.i_kv.valid.eq(active & want_key & k_full & v_full),
            kv.pos.eq(cfg.k_pos + written),
            kv.first.eq(written == 0),
            kv.last.eq(0),
        ]
        m.d.comb += [kv.data[d].eq(k_row[d]) for d in range(D)]
        m.d.comb += [kv.data[D + d].eq(v_row[d]) for d in range(D)]
        with m.If(buf.i_kv.valid & buf.i_kv.ready):
            m.d.sync += written.eq(written + 1)
            m.d.comb += [k_take.eq(1), v_take.eq(1)]

        # --- window narrower than the ring: mask lanes by position on the way to the softmax --
        # A copy of the slots' positions, kept in the buffer's write order (the launch's first
        # key goes to slot 0); the ring does not change while a query is in flight, so the
        # copy matches the score row of the query being scored (`scored`, in issue order).
        slot_pos = Signal(data.ArrayLayout(unsigned(POS_BITS), W))
        wslot = Signal(range(W))
        with m.If(buf.i_kv.valid & buf.i_kv.ready):
            slot = Mux(kv.first, 0, wslot)
            m.d.sync += [slot_pos[slot].eq(kv.pos), wslot.eq(Mux(slot == W - 1, 0, slot + 1))]
        scored = Signal(COUNT_BITS)
        s_pos = Signal(POS_BITS)
        m.d.comb += s_pos.eq(cfg.q_pos + scored)
        scores = buf.o_scores.payload
        m.d.comb += [sm.i.valid.eq(buf.o_scores.valid), buf.o_scores.ready.eq(sm.i.ready),
                     sm.i.payload.last.eq(scores.last)]
        for j in range(L):
            visible = Signal(name=f"visible{j}")
            if j < W:
                diff = Signal(signed(POS_BITS + 1), name=f"diff{j}")
                m.d.comb += diff.eq(s_pos - slot_pos[j])
                in_window = (cfg.window == 0) | ((diff < cfg.window) &
                                                 (~cfg.flags[0] | (diff > -cfg.window)))
                m.d.comb += visible.eq(scores.mask[j] & in_window)
            m.d.comb += [sm.i.payload.mask[j].eq(visible),
                         sm.i.payload.data[j].eq(Mux(visible, scores.data[j], 0))]
        with m.If(buf.o_scores.valid & buf.o_scores.ready):
            m.d.sync += scored.eq(scored + 1)

        q = buf.i_q.payload
        m.d.comb += [
            buf.i_q.valid.eq(active & ~want_key & (issued < cfg.queries) & q_full),
            q.data.eq(q_row),
            q.pos.eq(cfg.q_pos + issued),
            q.mult.eq(cfg.score_mult),
            q.shift.eq(cfg.score_shift),
            q.bidir.eq(cfg.flags[0]),
            q.split.eq(0),
            q.last.eq(issued == cfg.queries - 1),
        ]
        with m.If(buf.i_q.valid & buf.i_q.ready):
            m.d.sync += issued.eq(issued + 1)
            m.d.comb += q_take.eq(1)

        # --- output: hold the raw row, requantise N lanes per word --------------------------
        o_row = Signal(data.ArrayLayout(signed(ACC_BITS), D))
        o_full = Signal()
        o_off = Signal(range(D + 1))
        rows_out = Signal(COUNT_BITS)
        m.d.comb += buf.o_out.ready.eq(active & ~o_full)
        with m.If(buf.o_out.valid & buf.o_out.ready):
            m.d.sync += [o_row.eq(buf.o_out.payload.data), o_full.eq(1), o_off.eq(0)]

        sel = [Signal(signed(ACC_BITS), name=f"sel{i}") for i in range(N)]
        with m.Switch(o_off):
            for w in range(D // N):
                with m.Case(w * N):
                    m.d.comb += [sel[i].eq(o_row[w * N + i]) for i in range(N)]
        rounding = (Const(1, 1) << cfg.out_shift) >> 1
        lo, hi = -(1 << (OPERAND_BITS - 1)), (1 << (OPERAND_BITS - 1)) - 1
        for i in range(N):
            prod = Signal(signed(ACC_BITS + MULT_BITS + 2), name=f"rq{i}")
            m.d.comb += prod.eq(sel[i] * cfg.out_mult + rounding)
            shifted = prod >> cfg.out_shift
            m.d.comb += self.o.payload.data[i].eq(
                Mux(shifted < lo, lo, Mux(shifted > hi, hi, shifted[:OPERAND_BITS])))
        row_done = o_off + N >= cfg.d_head
        final = row_done & (rows_out == cfg.queries - 1)
        m.d.comb += [self.o.valid.eq(o_full), self.o.payload.last.eq(final)]
        with m.If(self.o.valid & self.o.ready):
            with m.If(row_done):
                m.d.sync += [o_full.eq(0), o_off.eq(0), rows_out.eq(rows_out + 1)]
            with m.Else():
                m.d.sync += o_off.eq(o_off + N)

        # --- launch start and end -----------------------------------------------------------
        with m.If(self.i_cfg.valid & self.i_cfg.ready):
            m.d.sync += [cfg.eq(self.i_cfg.payload), active.eq(1), written.eq(0),
                         issued.eq(0), scored.eq(0), rows_out.eq(0)]
            m.d.sync += [count.eq(0) for count in gathers]
        with m.If(self.o.valid & self.o.ready & final):
            m.d.sync += active.eq(0)
        return m
