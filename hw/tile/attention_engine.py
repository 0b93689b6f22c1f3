"""The attention unit as the chip sees it (opcode ``ATTN``): scratchpad words in and out.

One launch computes one attention head over a block of queries: the K/V ring
(:class:`~hw.tile.attention.AttentionBuffer`), the softmax (:class:`~hw.tile.softmax.SoftmaxUnit`)
and an output requantiser (``sim.golden.matmul.requant`` to int8). Golden model of a launch:
``sim.iss.attention.exec_attention`` (the golden ring sequence with the golden softmax).

Memory formats (``size`` = N = bytes per scratchpad word): a token's head slice is ``d_head``
int8 lanes from lane ``lane`` (0..N-1, one per stream: ``AT_Q_LANE``, ``AT_K_LANE``,
``AT_V_LANE``, ``AT_O_LANE``) of its first word, so
``hw.spec.attention.head_words(d_head, lane, N)`` words; heads narrower than a word share words
(packed heads). K, V and Q rows arrive as such word groups; the output row leaves as one, with
byte write enables on the head's lanes only. A partial or reduced score row
(split-score mode) is the W ring lanes as int32, little-endian, in
``hw.spec.attention.partial_row_words(W, N)`` words.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..layouts import spad_word_layout, spad_write_layout
from ..spec.attention import (
    FLAG_PARTIAL,
    FLAG_REDUCED,
    FLAGS_WIDTH,
    HALO_BITS,
    HALO_SHIFT,
    POS_BITS,
    partial_row_words,
    softmax_lanes,
)
from ..spec.formats import ACC_BITS, MULT_BITS, OPERAND_BITS, SHIFT_BITS
from ..spec.isa import COUNT_BITS
from .attention import AttentionBuffer
from .softmax import SoftmaxUnit

__all__ = ["AttentionEngine", "cfg_layout", "uses_layout"]


def cfg_layout(d_head, size):
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
        # AT_Q_LANE .. AT_O_LANE: the head's first lane in a row's first word, per stream
        **{f"{s}_lane": unsigned(max(1, (size - 1).bit_length())) for s in "qkvo"},
    })


def uses_layout():
    """``uses``: which of the optional read streams a launch takes (RD5 and WR1 always)."""
    return data.StructLayout({"k": 1, "v": 1})


class AttentionEngine(wiring.Component):
    """One attention head per launch: K/V/Q words in, int8 output words out.

    Parameters (keyword-only)
    -------------------------
    window : int
        W, tokens the K/V ring holds (``attn_window``).
    d_head : int
        D, lanes of the attention datapath (``d_head_max``), >= 1.
    length : int
        L, lanes of the score row and of the softmax (``softmax_len``), >= max(W, 2).
    size : int
        N, bytes per scratchpad word (``array_size``), >= 2.

    The softmax unit runs ``P = softmax_lanes(L)`` lanes per cycle (the largest divisor of L
    not above 4), so its latency ``5 L / P + 1`` stays comparable to the buffer's sweeps.

    Launch (``i_cfg``, one beat per ``ATTN``; fields as :func:`cfg_layout`)
    -------------------------------------------------------------------
    ``h = cfg.d_head`` lanes per token (1..D) from lane ``o`` (0..N-1) of the row's first word,
    ``o`` per stream (``q_lane``, ``k_lane``, ``v_lane``, ``o_lane``): ``w = ceil((o + h) / N)``
    words per row of that stream (``hw.spec.attention.head_words``). The engine keeps lanes
    ``o .. o + h - 1`` of the words it reads (the buffer's lanes beyond h are zero), and its
    output rows write only those lanes (``o.mask``): heads narrower than a word are packed,
    several to a word, each launch reading and writing its own lanes.
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

    Split-score mode (a head whose lanes lie on several chips, hidden-dimension parallelism)
    runs as two launches over the same keys, queries, positions and schedule, using the
    buffer's ``o_partial`` and ``i_reduced`` (``R = partial_row_words(W, N)`` words per row):

    - ``FLAG_PARTIAL`` (pass 1): K words (``i_k``) and Q words (``i_q``), no V. Each query
      goes to the buffer in split mode; its raw int32 row ``q . k_j`` is taken from
      ``o_partial`` with the lanes not written since the launch's first key set to 0 (they hold
      keys of an earlier launch), and leaves on ``o`` as R words. The buffer's reduced row is
      fed zeros and its score row and P.V output are dropped (no softmax runs); the launch ends
      when both the last word and the last dropped output row have been taken.
    - ``FLAG_REDUCED`` (pass 2): V words (``i_v``) and one reduced row per query on ``i_q``
      (R words: the partial rows of the head's chips summed, wrapping), no K. Each query (zero
      lanes) goes to the buffer in split mode, its ``o_partial`` is dropped and the reduced row
      is its ``i_reduced``; then the window narrowing, softmax, P.V and int8 output as above.

    Members
    -------
    i_cfg : ``In(stream.Signature(cfg_layout(D, N)))``
        Taken while idle; ``busy`` rises the next cycle.
    i_k, i_v, i_q : ``In(stream.Signature(spad_word_layout(N)))``
        K, V and Q rows, ``w`` words each (read ports RD3, RD4, RD5); lanes beyond ``h`` of
        the buffer are zero. Exactly ``keys`` (``queries``) rows are taken per launch; ``last``
        is ignored. The partial pass takes no V, the reduced pass no K and R-word reduced rows
        on ``i_q``.
    o : ``Out(stream.Signature(spad_write_layout(N)))``
        ``queries`` output rows of ``w`` int8 words (write port WR1), ``mask`` set on the
        head's lanes, or R-word partial rows (partial pass, every byte); ``last`` on the
        launch's final word.
    uses : ``Out(uses_layout())``
        From the ``i_cfg`` payload offered (combinationally, before the transfer): ``k`` unless
        the launch is a reduced pass, ``v`` unless it is a partial pass. The chip starts only
        those read generators (and always RD5 and WR1).
    busy : ``Out(1)``
        High from the cycle after ``i_cfg`` is taken until the final word of ``o`` is taken
        (partial pass: and the buffer's last dropped output row).

    Timing and cost
    ---------------
    Rows are gathered from the read ports while the buffer works (one row of K, V and Q each
    waits in the engine), a finished output row waits in an output register while the next query
    proceeds, and the requantiser emits one word per cycle (N 32 x 16-bit multipliers, a
    variable shift and a clamp, combinational from the row register to ``o``; ``w`` cycles
    per row). The lane offset costs a shifter of the gathered words into the buffer's D lanes
    (per read stream) and one of the output row into its words, combinational, and nothing in
    cycles. The window narrowing costs a copy of the W slot positions (16 bits each) and W
    17-bit subtract-and-compare lanes, combinational between the buffer's score row and the
    softmax input register. Cycles per launch: ``hw.spec.timing.attention.launch_cycles``
    (exact with every word available, a lower bound otherwise) and the closed forms in
    ``docs/isa.md`` (ATTN).
    """

    @classmethod
    def for_npu(cls, npu):
        """The engine of a chip built to ``npu`` (:class:`hw.spec.config.NpuConfig`): W
        ``attn_window``, D ``d_head_max``, L ``softmax_len`` and the array's lanes."""
        return cls(window=npu.attn_window, d_head=npu.d_head_max, length=npu.softmax_len,
                   size=npu.array_size)

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
        if d_head < 1:
            raise ValueError(f"d_head must be at least 1, not {d_head}")
        if window > 1 << POS_BITS:
            raise ValueError(f"window={window} exceeds the {POS_BITS}-bit position range")
        self._window, self._d_head, self._length, self._size = window, d_head, length, size
        super().__init__({
            "i_cfg": In(stream.Signature(cfg_layout(d_head, size))),
            "i_k": In(stream.Signature(spad_word_layout(size))),
            "i_v": In(stream.Signature(spad_word_layout(size))),
            "i_q": In(stream.Signature(spad_word_layout(size))),
            "o": Out(stream.Signature(spad_write_layout(size))),
            "uses": Out(uses_layout()),
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
        R = partial_row_words(W, N)
        i8 = signed(OPERAND_BITS)
        m.submodules.buffer = buf = AttentionBuffer(window=W, d_head=D, length=L)
        m.submodules.softmax = sm = SoftmaxUnit(length=L, lanes_per_cycle=softmax_lanes(L))

        cfg = Signal(cfg_layout(D, N))
        active = Signal()
        m.d.comb += [self.busy.eq(active), self.i_cfg.ready.eq(~active)]
        # Split-score passes (bit 3 wins if both are set: the ISS refuses that).
        reduced = cfg.flags[FLAG_REDUCED.bit_length() - 1]
        partial = cfg.flags[FLAG_PARTIAL.bit_length() - 1] & ~reduced
        offered = self.i_cfg.payload.flags
        m.d.comb += [self.uses.k.eq(~offered[FLAG_REDUCED.bit_length() - 1]),
                     self.uses.v.eq(~offered[FLAG_PARTIAL.bit_length() - 1]
                                    | offered[FLAG_REDUCED.bit_length() - 1])]

        # The softmax sees the score rows of normal and reduced-pass queries; the partial pass
        # drops them and answers each with an all-zero probability row.
        m.d.comb += [buf.i_probs.payload.last.eq(sm.o.payload.last),
                     buf.i_probs.valid.eq(Mux(partial, 1, sm.o.valid)),
                     sm.o.ready.eq(~partial & buf.i_probs.ready)]
        for lane in range(L):
            m.d.comb += buf.i_probs.payload.data[lane].eq(Mux(partial, 0, sm.o.payload.data[lane]))

        # --- row gathering: w words -> the head's lanes o .. o + h - 1 of them, zero beyond h -
        G = -(-(N - 1 + D) // N)        # the most words a row spans (lane offset N - 1)
        def gather(port, name, rows, ready):
            lane = getattr(cfg, f"{name}_lane")
            span = Signal(range(N + D), name=f"{name}_span")   # lanes up to the head's last
            m.d.comb += span.eq(lane + cfg.d_head)
            stage = Signal(8 * N * G, name=f"{name}_stage")
            off = Signal(range(G * N + 1), name=f"{name}_off")
            full = Signal(name=f"{name}_full")
            take = Signal(name=f"{name}_take")
            mine = Signal(name=f"{name}_ready")
            count = Signal(COUNT_BITS, name=f"{name}_rows")    # rows complete this launch
            gathers.append(count)
            # A row's first word may arrive in the cycle the previous row is taken, so a
            # one-word row (w = 1) streams at one row per cycle. No word beyond the launch's
            # rows is taken (they would belong to the next launch).
            m.d.comb += mine.eq(active & (~full | take) & (count < rows))
            ready.append(mine)
            with m.If(take):
                m.d.sync += full.eq(0)
            with m.If(port.valid & mine):
                with m.Switch(off):
                    for w in range(G):
                        with m.Case(w * N):
                            m.d.sync += stage[8 * N * w:8 * N * (w + 1)].eq(
                                port.payload.data.as_value())
                with m.If(off + N >= span):
                    m.d.sync += [full.eq(1), off.eq(0), count.eq(count + 1)]
                with m.Else():
                    m.d.sync += off.eq(off + N)
            # The head's lanes, shifted down by the lane offset; lanes beyond h are zero.
            row = Signal(data.ArrayLayout(i8, D), name=f"{name}_row")
            shifted = Signal(8 * N * G, name=f"{name}_shifted")
            m.d.comb += shifted.eq(stage >> (lane * 8))
            for d in range(D):
                m.d.comb += row[d].eq(Mux(d < cfg.d_head, shifted[8 * d:8 * d + 8], 0))
            return row, full, take

        gathers = []
        k_ready, v_ready, q_ready = [], [], []
        k_row, k_full, k_take = gather(self.i_k, "k", Mux(reduced, 0, cfg.keys), k_ready)
        v_row, v_full, v_take = gather(self.i_v, "v", Mux(partial, 0, cfg.keys), v_ready)
        q_row, q_full, q_take = gather(self.i_q, "q", Mux(reduced, 0, cfg.queries), q_ready)

        # Reduced pass: RD5 carries one reduced score row of R words per query instead.
        red_flat = Signal(8 * N * R)
        red_off = Signal(range(R))
        red_full, red_take = Signal(), Signal()
        red_count = Signal(COUNT_BITS)
        gathers.append(red_count)
        red_mine = Signal()
        m.d.comb += red_mine.eq(active & reduced & (~red_full | red_take)
                                & (red_count < cfg.queries))
        q_ready.append(red_mine)
        with m.If(red_take):
            m.d.sync += red_full.eq(0)
        with m.If(self.i_q.valid & red_mine):
            with m.Switch(red_off):
                for w in range(R):
                    with m.Case(w):
                        m.d.sync += red_flat[8 * N * w:8 * N * (w + 1)].eq(
                            self.i_q.payload.data.as_value())
            with m.If(red_off == R - 1):
                m.d.sync += [red_full.eq(1), red_off.eq(0), red_count.eq(red_count + 1)]
            with m.Else():
                m.d.sync += red_off.eq(red_off + 1)
        for port, readies in ((self.i_k, k_ready), (self.i_v, v_ready), (self.i_q, q_ready)):
            m.d.comb += port.ready.eq(Cat(*readies).any())

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
            buf.i_kv.valid.eq(active & want_key & (k_full | reduced) & (v_full | partial)),
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
        m.d.comb += [sm.i.valid.eq(buf.o_scores.valid & ~partial),
                     buf.o_scores.ready.eq(partial | sm.i.ready),
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
            buf.i_q.valid.eq(active & ~want_key & (issued < cfg.queries) & (q_full | reduced)),
            q.data.eq(q_row),
            q.pos.eq(cfg.q_pos + issued),
            q.mult.eq(cfg.score_mult),
            q.shift.eq(cfg.score_shift),
            q.bidir.eq(cfg.flags[0]),
            q.split.eq(partial | reduced),
            q.last.eq(issued == cfg.queries - 1),
        ]
        with m.If(buf.i_q.valid & buf.i_q.ready):
            m.d.sync += issued.eq(issued + 1)
            m.d.comb += q_take.eq(1)

        # --- split-score rows: partial rows out (pass 1), reduced rows in (pass 2) ------------
        # A lane holds a key of this launch once that many keys were written since its first
        # (which restarted the ring at slot 0); the others hold stale keys: zeroed.
        p_flat = Signal(8 * N * R)
        p_full = Signal()
        p_off = Signal(range(R))
        dropped = Signal(COUNT_BITS)        # partial pass: the buffer's output rows dropped
        m.d.comb += buf.o_partial.ready.eq(reduced | (partial & ~p_full))
        with m.If(buf.o_partial.valid & buf.o_partial.ready & partial):
            m.d.sync += [p_full.eq(1), p_off.eq(0)]
            for lane in range(W):
                m.d.sync += p_flat[32 * lane:32 * (lane + 1)].eq(
                    Mux(written > lane, buf.o_partial.payload.data[lane], 0))
        m.d.comb += buf.i_reduced.valid.eq(partial | (reduced & red_full))
        with m.If(reduced):
            for lane in range(W):
                m.d.comb += buf.i_reduced.payload.data[lane].eq(
                    red_flat[32 * lane:32 * (lane + 1)])
        with m.If(buf.i_reduced.valid & buf.i_reduced.ready & reduced):
            m.d.comb += red_take.eq(1)

        # --- output: hold the raw row at its lanes of the words, requantise N lanes per word
        span = Signal(range(N + D))     # lanes of an output row's words up to the head's last
        m.d.comb += span.eq(cfg.o_lane + cfg.d_head)
        o_row = Signal(data.ArrayLayout(signed(ACC_BITS), G * N))
        o_full = Signal()
        o_off = Signal(range(G * N + 1))
        rows_out = Signal(COUNT_BITS)
        m.d.comb += buf.o_out.ready.eq(active & (partial | ~o_full))
        with m.If(buf.o_out.valid & buf.o_out.ready & ~partial):
            m.d.sync += [o_row.eq(buf.o_out.payload.data.as_value() << (cfg.o_lane * ACC_BITS)),
                         o_full.eq(1), o_off.eq(0)]
        with m.If(buf.o_out.valid & buf.o_out.ready & partial):
            m.d.sync += dropped.eq(dropped + 1)

        sel = [Signal(signed(ACC_BITS), name=f"sel{i}") for i in range(N)]
        with m.Switch(o_off):
            for w in range(G):
                with m.Case(w * N):
                    m.d.comb += [sel[i].eq(o_row[w * N + i]) for i in range(N)]
        # Byte write enables: the head's lanes of the word (every byte of a partial row).
        for i in range(N):
            at = o_off + i
            m.d.comb += self.o.payload.mask[i].eq(partial | ((at >= cfg.o_lane) & (at < span)))
        rounding = (Const(1, 1) << cfg.out_shift) >> 1
        lo, hi = -(1 << (OPERAND_BITS - 1)), (1 << (OPERAND_BITS - 1)) - 1
        for i in range(N):
            prod = Signal(signed(ACC_BITS + MULT_BITS + 2), name=f"rq{i}")
            m.d.comb += prod.eq(sel[i] * cfg.out_mult + rounding)
            shifted = prod >> cfg.out_shift
            m.d.comb += self.o.payload.data[i].eq(
                Mux(shifted < lo, lo, Mux(shifted > hi, hi, shifted[:OPERAND_BITS])))
        row_done = Mux(partial, p_off == R - 1, o_off + N >= span)
        final = row_done & (rows_out == cfg.queries - 1)
        m.d.comb += [self.o.valid.eq(Mux(partial, p_full, o_full)),
                     self.o.payload.last.eq(final)]
        with m.If(partial):
            with m.Switch(p_off):
                for w in range(R):
                    with m.Case(w):
                        m.d.comb += self.o.payload.data.eq(p_flat[8 * N * w:8 * N * (w + 1)])
        with m.If(self.o.valid & self.o.ready):
            with m.If(partial):
                with m.If(row_done):
                    m.d.sync += [p_full.eq(0), p_off.eq(0), rows_out.eq(rows_out + 1)]
                with m.Else():
                    m.d.sync += p_off.eq(p_off + 1)
            with m.Elif(row_done):
                m.d.sync += [o_full.eq(0), o_off.eq(0), rows_out.eq(rows_out + 1)]
            with m.Else():
                m.d.sync += o_off.eq(o_off + N)

        # --- launch start and end -----------------------------------------------------------
        # The partial pass also waits for the buffer's last dropped row, so that no row of this
        # launch can reach the next one.
        out_done = Signal()
        tail_done = ~partial | (dropped == cfg.queries) | \
            (buf.o_out.valid & buf.o_out.ready & (dropped == cfg.queries - 1))
        with m.If(self.o.valid & self.o.ready & final):
            m.d.sync += out_done.eq(1)
        with m.If(active & (out_done | (self.o.valid & self.o.ready & final)) & tail_done):
            m.d.sync += [active.eq(0), out_done.eq(0)]
        with m.If(self.i_cfg.valid & self.i_cfg.ready):
            m.d.sync += [cfg.eq(self.i_cfg.payload), active.eq(1), written.eq(0),
                         issued.eq(0), scored.eq(0), rows_out.eq(0), dropped.eq(0),
                         out_done.eq(0)]
            m.d.sync += [count.eq(0) for count in gathers]
        return m
