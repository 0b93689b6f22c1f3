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

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..arith import round_saturate
from ..layouts import spad_word_layout, spad_write_layout
from ..spec.attention import (
    FLAG_PARTIAL,
    FLAG_REDUCED,
    FLAG_STATE_IN,
    FLAG_STATE_OUT,
    FLAGS_WIDTH,
    HALO_BITS,
    HALO_SHIFT,
    POS_BITS,
    STATE_LANE_BYTES,
    partial_row_words,
    softmax_lanes,
)
from ..spec.formats import ACC_BITS, MULT_BITS, OPERAND_BITS, PROB_BITS, SCORE_BITS, SHIFT_BITS
from ..spec.isa import COUNT_BITS
from ..spec.softmax import (
    D_MAX,
    EMPTY_MAX,
    EXP_FRAC_BITS,
    EXP_LUT,
    LOG2E_MULT,
    LOG2E_SHIFT,
    MERGE_BITS,
    NORM_BITS,
    NORM_QUOTIENT_BITS,
)
from ..spec.timing.chip import (
    ATTN_MERGE_CYCLES,
    ATTN_NORM_CYCLES,
    ATTN_STATE_ROWS,
    attn_merge_pipe,
    attn_out_pipe,
    check_attn_pipeline,
    check_built,
    merge_divide_bits,
    merge_divide_cycles,
    merge_rotate_cycles,
)
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


def _merge_sum(pa, pf):
    """``scale(a, fa) + scale(b, fb)`` of the merge (``hw.spec.softmax``) from the products
    ``pa = a fa`` and ``pf = b fb``: each rounded, ``(p + 2**(MERGE_BITS-1)) >> MERGE_BITS``,
    their sum wrapped to int32."""
    half = 1 << (MERGE_BITS - 1)
    return (((pa + half) >> MERGE_BITS) + ((pf + half) >> MERGE_BITS))[:ACC_BITS]


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
    pipeline : str
        ``"short"`` (default) or ``"deep"`` (``attention_pipeline``): the output requantiser and
        the state words' merge in the cycle a word leaves its source, or in 3 registers before
        ``o`` and the last chunk's merge in 4 instead of 2 (``hw.spec.timing.chip``:
        ``attn_out_pipe``, ``attn_merge_pipe``), for a faster clock; ``"deep"`` also gives the
        softmax six row stages instead of five (``softmax_stages``), the buffer its
        registered requantiser operand (``AttentionBuffer``'s ``pipeline``) and the command
        issue's ``want_key`` a register loaded from the next cycle's counts (0 cycles).

    The softmax unit runs ``P = softmax_lanes(L)`` lanes per cycle (the largest divisor of L
    not above 4), so its latency ``E L / P + 1`` (``E`` = 5 row stages, 6 deep) stays
    comparable to the buffer's sweeps.

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
    proceeds, and the requantiser emits one word per cycle (``w`` cycles per row): N lanes' two
    16 x 16-bit partial products (a multiplier each), their sum shifted by ``out_shift``, then
    rounded and saturated, combinational from the row register to ``o`` (``pipeline`` =
    ``"short"``) or through ``attn_out_pipe("deep")`` = 3 registers that all move while ``o``
    is empty or taken (``"deep"``: partial rows and state words pass through them too, the
    state words' merge multiplies in them, and every launch ends 3 cycles after its last word
    leaves the row register; the last chunk's merge has 2 more registers,
    ``hw.spec.timing.chip.attn_merge_pipe``). The lane offset
    costs a shifter of the gathered words into the buffer's D lanes (per read stream) and one
    of the output row into its words, combinational, and nothing in cycles. The window
    narrowing costs a copy of the W slot positions (16 bits each) and W 17-bit
    subtract-and-compare lanes, combinational between the buffer's score row and the softmax
    input register. Cycles per launch: ``hw.spec.timing.attention.launch_cycles``
    (exact with every word available, a lower bound otherwise) and the closed forms in
    ``docs/isa.md`` (ATTN).
    """

    @classmethod
    def for_npu(cls, npu):
        """The engine of a chip built to ``npu`` (:class:`hw.spec.config.NpuConfig`): W
        ``attn_window``, D ``d_head_max``, L ``softmax_len`` and the array's lanes."""
        return cls(window=npu.attn_window, d_head=npu.d_head_max, length=npu.softmax_len,
                   size=npu.array_size, pipeline=npu.attention_pipeline)

    def __init__(self, *, window, d_head, length, size, pipeline="short"):
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
        self._pipeline = check_attn_pipeline(pipeline)
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
    def pipeline(self):
        return self._pipeline

    def _stage(self, m, enable):
        """``put(dst, value)``: a pipeline register loaded with ``value`` while ``enable``
        (``"deep"``), or ``dst`` equal to ``value`` in the same cycle (``"short"``)."""
        def put(dst, value):
            if self._pipeline == "deep":
                with m.If(enable):
                    m.d.sync += dst.eq(value)
            else:
                m.d.comb += dst.eq(value)
        return put

    @property
    def lanes_per_cycle(self):
        return softmax_lanes(self._length)

    @property
    def state_rows(self) -> bool:
        """Whether the long-context state rows (``AT_FLAGS`` bits 4, 5) are built: N a
        multiple of 4 (int32 lanes in whole words)."""
        return self._size % STATE_LANE_BYTES == 0

    def elaborate(self, platform):
        m = Module()
        W, D, L, N = self._window, self._d_head, self._length, self._size
        R = partial_row_words(W, N)
        i8 = signed(OPERAND_BITS)
        m.submodules.buffer = buf = AttentionBuffer(window=W, d_head=D, length=L,
                                                    pipeline=self._pipeline)
        m.submodules.softmax = sm = SoftmaxUnit(length=L, lanes_per_cycle=softmax_lanes(L),
                                                pipeline=self._pipeline)

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
        # Long context: state rows in (RD5) and out (WR1); the split-score bits exclude them.
        if self.state_rows:
            st_in = Signal()
            st_out = Signal()
            m.d.comb += [st_in.eq(cfg.flags[FLAG_STATE_IN.bit_length() - 1]
                                  & ~partial & ~reduced),
                         st_out.eq(cfg.flags[FLAG_STATE_OUT.bit_length() - 1]
                                   & ~partial & ~reduced)]
        else:
            st_in = st_out = Const(0)
        st = st_in | st_out
        last_chunk = st_in & ~st_out
        m.d.comb += sm.i.payload.partial.eq(st)

        # The softmax sees the score rows of normal and reduced-pass queries; the partial pass
        # drops them and answers each with an all-zero probability row.
        m.d.comb += [buf.i_probs.payload.last.eq(sm.o.payload.last),
                     buf.i_probs.valid.eq(Mux(partial, 1, sm.o.valid)),
                     sm.o.ready.eq(~partial & buf.i_probs.ready)]
        for lane in range(L):
            m.d.comb += buf.i_probs.payload.data[lane].eq(Mux(partial, 0, sm.o.payload.data[lane]))

        # --- the state FIFO: every RD5 word of a query's row while state rows run ------------
        if self.state_rows:
            M = N // STATE_LANE_BYTES           # int32 lanes of a state row per word
            SL = -(-(D + 2) // M) * M           # lanes of the engine's state register
            K = SL // M                         # words of a query's state row
            G0 = -(-(N - 1 + D) // N)
            depth = ATTN_STATE_ROWS * (G0 + K)
            m.submodules.state_fifo = fifo = Memory(shape=8 * N, depth=depth, init=[])
            f_wr, f_rd = fifo.write_port(), fifo.read_port()
            wptr = Signal(range(depth))
            rptr = Signal(range(depth))
            rptr_nxt = Signal(range(depth))
            rows_held = Signal(range(ATTN_STATE_ROWS + 1))
            row_in = Signal()                   # a row's first word is written this cycle
            row_out = Signal()                  # a row is released this cycle
            m.d.comb += [f_rd.addr.eq(rptr_nxt), f_rd.en.eq(1), rptr_nxt.eq(rptr)]
            m.d.sync += [rptr.eq(rptr_nxt),
                         rows_held.eq(rows_held + row_in - row_out)]
            # (m_a, l_a) of the rows gathered and not yet merged (their input states' first
            # two lanes).
            hdr_m = Array(Signal(signed(SCORE_BITS), name=f"hdr_m{i}")
                          for i in range(ATTN_STATE_ROWS))
            hdr_l = Array(Signal(signed(ACC_BITS), name=f"hdr_l{i}")
                          for i in range(ATTN_STATE_ROWS))
            hdr_w = Signal(range(ATTN_STATE_ROWS))
            hdr_r = Signal(range(ATTN_STATE_ROWS))

            def advance(ptr, by=1):
                return Mux(ptr + by >= depth, ptr + by - depth, ptr + by)

        # --- row gathering: w words -> the head's lanes o .. o + h - 1 of them, zero beyond h -
        G = -(-(N - 1 + D) // N)        # the most words a row spans (lane offset N - 1)
        def gather(port, name, rows, ready, state=False):
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
            if state:
                # State rows: the row's words also go into the state FIFO, whose room a row's
                # first word waits for; with a state in, its words follow the Q words and the
                # row is complete after them.
                aph = Signal(name=f"{name}_aph")
                alanes = Signal(range(SL + M + 1), name=f"{name}_alanes")
                first = Signal(name=f"{name}_first")
                cap_m = Signal(signed(SCORE_BITS), name="cap_m")
                cap_l = Signal(signed(ACC_BITS), name="cap_l")
                m.d.comb += [
                    first.eq((off == 0) & ~aph),
                    mine.eq(active & (~full | take) & (count < rows)
                            & (~st | ~first | (rows_held < ATTN_STATE_ROWS))),
                    f_wr.addr.eq(wptr), f_wr.data.eq(port.payload.data.as_value()),
                    f_wr.en.eq(port.valid & mine & st),
                    row_in.eq(port.valid & mine & st & first),
                ]
                with m.If(port.valid & mine & st):
                    m.d.sync += wptr.eq(advance(wptr))
            else:
                m.d.comb += mine.eq(active & (~full | take) & (count < rows))
            ready.append(mine)
            with m.If(take):
                m.d.sync += full.eq(0)
            with m.If(port.valid & mine & (~aph if state else 1)):
                with m.Switch(off):
                    for w in range(G):
                        with m.Case(w * N):
                            m.d.sync += stage[8 * N * w:8 * N * (w + 1)].eq(
                                port.payload.data.as_value())
                with m.If(off + N >= span):
                    if state:
                        with m.If(st_in):
                            m.d.sync += [aph.eq(1), alanes.eq(0), off.eq(0)]
                        with m.Else():
                            m.d.sync += [full.eq(1), off.eq(0), count.eq(count + 1)]
                    else:
                        m.d.sync += [full.eq(1), off.eq(0), count.eq(count + 1)]
                with m.Else():
                    m.d.sync += off.eq(off + N)
            if state:
                # The state's words: capture m (lane 0) and l (lane 1); the last one completes
                # the row and queues its (m, l) for the merge.
                word = port.payload.data.as_value()
                m_new = Mux(alanes == 0, word[:SCORE_BITS].as_signed(), cap_m)
                if M >= 2:
                    l_new = Mux(alanes == 0, word[ACC_BITS:2 * ACC_BITS].as_signed(), cap_l)
                else:
                    l_new = Mux(alanes == 1, word[:ACC_BITS].as_signed(), cap_l)
                with m.If(port.valid & mine & aph):
                    m.d.sync += [cap_m.eq(m_new), cap_l.eq(l_new)]
                    with m.If(alanes + M >= cfg.d_head + 2):
                        m.d.sync += [aph.eq(0), full.eq(1), count.eq(count + 1),
                                     hdr_m[hdr_w].eq(m_new), hdr_l[hdr_w].eq(l_new),
                                     hdr_w.eq(Mux(hdr_w == ATTN_STATE_ROWS - 1, 0, hdr_w + 1))]
                    with m.Else():
                        m.d.sync += alanes.eq(alanes + M)
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
        q_row, q_full, q_take = gather(self.i_q, "q", Mux(reduced, 0, cfg.queries), q_ready,
                                       state=self.state_rows)

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
        if self._pipeline == "deep":
            # want_key as a register computed from the next cycle's counts, and the target as
            # a register: min(halo + issued + 1, keys) interleaved, else keys, grows by one
            # with each query while below keys. No carry chain between the counters and the
            # handshakes that use want_key.
            kv_fire, q_fire = Signal(), Signal()
            cfg_fire = self.i_cfg.valid & self.i_cfg.ready
            p_cfg = self.i_cfg.payload
            p_ahead = Signal(COUNT_BITS + 2)
            m.d.comb += p_ahead.eq(p_cfg.flags[HALO_SHIFT:HALO_SHIFT + HALO_BITS] + 1)
            target = Signal(COUNT_BITS + 2, name="kv_target")
            target_nxt = Signal(COUNT_BITS + 2, name="kv_target_next")
            written_nxt = Signal(COUNT_BITS, name="written_next")
            want_key = Signal(name="want_key")
            m.d.comb += [
                target_nxt.eq(Mux(cfg_fire,
                                  Mux(p_cfg.flags[1] & (p_ahead < p_cfg.keys), p_ahead,
                                      p_cfg.keys),
                                  Mux(q_fire & (target != cfg.keys), target + 1, target))),
                written_nxt.eq(Mux(cfg_fire, 0, Mux(kv_fire, written + 1, written))),
            ]
            m.d.sync += [target.eq(target_nxt), want_key.eq(written_nxt < target_nxt)]
        else:
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
        if self._pipeline == "deep":
            m.d.comb += [kv_fire.eq(buf.i_kv.valid & buf.i_kv.ready),
                         q_fire.eq(buf.i_q.valid & buf.i_q.ready)]

        # --- window narrower than the ring: mask lanes by position on the way to the softmax --
        # A copy of the slots' positions, kept in the buffer's write order (the launch's first
        # key goes to slot 0); the ring does not change while a query is in flight, so the
        # copy matches the score row of the query being scored (`scored`, in issue order).
        slot_pos = Signal(data.ArrayLayout(unsigned(POS_BITS), W))
        wslot = Signal(range(W))
        with m.If(buf.i_kv.valid & buf.i_kv.ready):
            slot = Mux(kv.first, 0, wslot)
            m.d.sync += [slot_pos[slot].eq(kv.pos), wslot.eq(Mux(slot == W - 1, 0, slot + 1))]
        # The window's test is registered twice (the scored query's position, then each lane's
        # `in_window`), from registers that change only long before a score row is taken:
        # `scored` and the launch's configuration at least ET + 2 cycles before it (one row in
        # the softmax at a time), the slots' positions before its query was issued (at least
        # W + 5). So no adder or compare lies between the buffer's row and the softmax.
        scored = Signal(COUNT_BITS)
        s_pos = Signal(POS_BITS)
        m.d.sync += s_pos.eq(cfg.q_pos + scored)
        scores = buf.o_scores.payload
        m.d.comb += [sm.i.valid.eq(buf.o_scores.valid & ~partial),
                     buf.o_scores.ready.eq(partial | sm.i.ready),
                     sm.i.payload.last.eq(scores.last)]
        for j in range(L):
            visible = Signal(name=f"visible{j}")
            if j < W:
                diff = Signal(signed(POS_BITS + 1), name=f"diff{j}")
                in_window = Signal(name=f"in_window{j}")
                m.d.comb += diff.eq(s_pos - slot_pos[j])
                m.d.sync += in_window.eq((cfg.window == 0) | (
                    (diff < cfg.window) & (~cfg.flags[0] | (diff > -cfg.window))))
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

        # --- long context: merge factors, from a query's probabilities to its output --------
        if self.state_rows:
            pend_ready, emit_busy, emit = self._merge_path(
                m, cfg, buf, sm, st_in, st_out, last_chunk, hdr_m, hdr_l, hdr_r, f_rd, rptr,
                rptr_nxt, row_out, advance, M, SL,
                merge_rotate_cycles(D, N, self._pipeline))
        else:
            pend_ready, emit_busy, emit = Const(1), Const(0), None

        # --- output: the raw row at its lanes of the words, then attn_out_pipe registers to o
        span = Signal(range(N + D))     # lanes of an output row's words up to the head's last
        m.d.comb += span.eq(cfg.o_lane + cfg.d_head)
        # The row's words; the word leaving next is lanes 0 .. N-1 (the row shifts down N lanes
        # as each word leaves: no multiplexer over the words before the multipliers).
        o_row = Signal(data.ArrayLayout(signed(ACC_BITS), G * N))
        o_full = Signal()
        o_off = Signal(range(G * N + 1))
        rows_out = Signal(COUNT_BITS)
        m.d.comb += buf.o_out.ready.eq(active & (partial | (~o_full & ~emit_busy
                                                            & (~st | pend_ready))))
        o_take = buf.o_out.valid & buf.o_out.ready
        with m.If(buf.o_out.valid & buf.o_out.ready & partial):
            m.d.sync += dropped.eq(dropped + 1)

        # The source of o's words: the output row's word at o_off (requantised), a partial
        # row's word, a state word. It moves (s_fire) when the stages do.
        adv = Signal()                  # the stages move: o's register is empty or taken
        deep = self._pipeline == "deep"
        s_valid, s_last, s_fire = Signal(), Signal(), Signal()
        s_mask = Signal(N)
        s_raw = Signal(8 * N)           # a word that bypasses the requantiser
        requantise = ~partial & ~st_out     # the launch's words are the requantiser's
        m.d.comb += [adv.eq(~self.o.valid | self.o.ready if deep else self.o.ready),
                     s_fire.eq(s_valid & adv)]
        # The output row's last word is next: `o_off + N >= span`, a register loaded with the
        # row and with each word (the shift's enable is wide: no compare before it).
        o_done = Signal()
        row_done = Mux(partial, p_off == R - 1, o_done)
        m.d.comb += [s_valid.eq(Mux(partial, p_full, o_full)),
                     s_last.eq(row_done & (rows_out == cfg.queries - 1))]
        # Byte write enables: the head's lanes of the word (every byte of a partial row).
        for i in range(N):
            at = o_off + i
            m.d.comb += s_mask[i].eq(partial | ((at >= cfg.o_lane) & (at < span)))
        with m.If(partial):
            with m.Switch(p_off):
                for w in range(R):
                    with m.Case(w):
                        m.d.comb += s_raw.eq(p_flat[8 * N * w:8 * N * (w + 1)])
        with m.If(s_fire & ~st_out):
            with m.If(partial):
                with m.If(row_done):
                    m.d.sync += [p_full.eq(0), p_off.eq(0), rows_out.eq(rows_out + 1)]
                with m.Else():
                    m.d.sync += p_off.eq(p_off + 1)
            with m.Elif(row_done):
                m.d.sync += [o_full.eq(0), o_off.eq(0), rows_out.eq(rows_out + 1)]
            with m.Else():
                m.d.sync += [o_off.eq(o_off + N), o_done.eq(o_off + 2 * N >= span),
                             *(o_row[j].eq(o_row[j + N]) for j in range(G * N - N))]
        # A row enters the register only while it is empty (buf.o_out.ready, emit.load).
        with m.If(o_take & ~partial & ~st):
            m.d.sync += [o_row.eq(buf.o_out.payload.data.as_value() << (cfg.o_lane * ACC_BITS)),
                         o_full.eq(1), o_off.eq(0), o_done.eq(span <= N)]
        if emit is not None:
            # State rows out: the merge path's words; the last chunk: its normalised row
            # enters the output register as a P.V row would.
            with m.If(emit.load):
                m.d.sync += [o_row.eq(emit.acc.as_value() << (cfg.o_lane * ACC_BITS)),
                             o_full.eq(1), o_off.eq(0), o_done.eq(span <= N)]
            with m.If(st_out):
                m.d.comb += [s_valid.eq(emit.valid), s_raw.eq(emit.word),
                             s_mask.eq((1 << N) - 1),
                             s_last.eq(emit.done & (rows_out == cfg.queries - 1)),
                             emit.ready.eq(adv)]
                with m.If(s_fire & emit.done):
                    m.d.sync += rows_out.eq(rows_out + 1)

        # The stages ("deep": registers, all moving with adv, o's register empty or taken;
        # "short": the same values in the cycle the word leaves its source): (1) the
        # requantiser's partial products, the lane's high 16 bits (signed) and low 16 bits
        # (unsigned) times out_mult, an 18 x 18 multiplier each; (2) their sum, shifted by
        # out_shift keeping the bit below the result (w = (v << 1) >> s); (3) o: the rounding
        # and saturation (hw.arith.round_saturate: (w + 1) >> 1 = (v + 2**(s-1)) >> s, clamped
        # to int8 by bit tests), or the bypassed word. No path chains the multiply, the shift
        # and the saturation.
        put = self._stage(m, adv)
        hb = ACC_BITS // 2
        v1, v2, last1, last2 = Signal(), Signal(), Signal(), Signal()
        mask1, mask2 = Signal(N), Signal(N)
        raw1, raw2 = Signal(8 * N), Signal(8 * N)
        pipe_regs = [v1, v2, self.o.valid] if deep else []
        check_built("attn_out_pipe", attn_out_pipe(self._pipeline), len(pipe_regs),
                    "registers from the output row to o (partial products, shifted sum, o)",
                    "hw/tile/attention_engine.py")
        q_lanes = []
        for i in range(N):
            lo = Signal(unsigned(hb + MULT_BITS), name=f"rq_lo{i}")
            hi = Signal(signed(hb + MULT_BITS + 1), name=f"rq_hi{i}")
            w = Signal(signed(ACC_BITS + MULT_BITS + 2), name=f"rq_w{i}")
            put(lo, o_row[i][:hb] * cfg.out_mult)
            put(hi, o_row[i][hb:].as_signed() * cfg.out_mult)
            put(w, (((hi << hb) + lo) << 1) >> cfg.out_shift)
            q_lanes.append(round_saturate(m, w, OPERAND_BITS, f"rq_sat{i}"))
        word3 = raw2
        if emit is not None:
            # State words: their lanes' operands (emit) in stage 1, the products with the
            # factors in stage 2, the merged lanes (or m, l) into o: no path from the state
            # FIFO's block RAM through a multiplier.
            merge1, merge2 = Signal(), Signal()
            use1, use2 = Signal(len(emit.use)), Signal(len(emit.use))
            fa1, fb1 = Signal.like(emit.fa, name="emit_fa1"), Signal.like(emit.fb, name="emit_fb1")
            lanes = []
            for i in range(len(emit.a)):
                a1 = Signal.like(emit.a[i], name=f"emit_a1_{i}")
                x1 = Signal.like(emit.x[i], name=f"emit_x1_{i}")
                ovr1 = Signal.like(emit.ovr[i], name=f"emit_ovr1_{i}")
                ovr2 = Signal.like(emit.ovr[i], name=f"emit_ovr2_{i}")
                pa2 = Signal((a1 * fa1).shape(), name=f"emit_pa2_{i}")
                px2 = Signal((x1 * fb1).shape(), name=f"emit_px2_{i}")
                for dst, value in ((a1, emit.a[i]), (x1, emit.x[i]), (ovr1, emit.ovr[i]),
                                   (pa2, a1 * fa1), (px2, x1 * fb1), (ovr2, ovr1)):
                    put(dst, value)
                lanes.append(Mux(use2[i], ovr2, _merge_sum(pa2, px2))[:ACC_BITS])
            for dst, value in ((merge1, st_out & emit.merge), (use1, emit.use), (fa1, emit.fa),
                               (fb1, emit.fb), (merge2, merge1), (use2, use1)):
                put(dst, value)
            word3 = Mux(merge2, Cat(*lanes), raw2)
        for dst, value in ((v1, s_valid), (last1, s_last), (mask1, s_mask), (raw1, s_raw),
                           (v2, v1), (last2, last1), (mask2, mask1), (raw2, raw1),
                           (self.o.valid, v2), (self.o.payload.last, last2),
                           (self.o.payload.mask, mask2),
                           (self.o.payload.data, Mux(requantise, Cat(*q_lanes), word3))):
            put(dst, value)
        o_fire = self.o.valid & self.o.ready

        # --- launch start and end -----------------------------------------------------------
        # The partial pass also waits for the buffer's last dropped row, so that no row of this
        # launch can reach the next one.
        out_done = Signal()
        tail_done = ~partial | (dropped == cfg.queries) | \
            (buf.o_out.valid & buf.o_out.ready & (dropped == cfg.queries - 1))
        ends = o_fire & self.o.payload.last
        with m.If(ends):
            m.d.sync += out_done.eq(1)
        with m.If(active & (out_done | ends) & tail_done):
            m.d.sync += [active.eq(0), out_done.eq(0)]
        with m.If(self.i_cfg.valid & self.i_cfg.ready):
            m.d.sync += [cfg.eq(self.i_cfg.payload), active.eq(1), written.eq(0),
                         issued.eq(0), scored.eq(0), rows_out.eq(0), dropped.eq(0),
                         out_done.eq(0)]
            m.d.sync += [count.eq(0) for count in gathers]
        return m

    def _merge_path(self, m, cfg, buf, sm, st_in, st_out, last_chunk, hdr_m, hdr_l, hdr_r,
                    f_rd, rptr, rptr_nxt, row_out, advance, M, SL, K):
        """Long context: the merge of each query's chunk state into its input state.

        When the buffer takes a state-mode query's probabilities (with the softmax's ``max``
        and ``sum``), the input state's ``(m_a, l_a)`` (queued by the Q gather) and the
        chunk's ``(m_b, l_b)`` give the merge factors and the merged ``l`` in
        ``ATTN_MERGE_CYCLES`` cycles, and for the last chunk the reciprocal of ``l`` (one
        cycle to normalise it, then ``merge_divide_cycles(W)`` of division) before the P.V
        row is out. The P.V row is then taken into the state register (``SL`` int32 lanes:
        two for ``m`` and ``l``, then ``o``), which shifts ``M = N/4`` lanes a cycle:

        - state rows out: the row's Q words from the state FIFO, then its state words, each
          ``M`` lanes ``scale(A, fa) + scale(o_b, fb)`` (``A`` the input state's lanes from
          the FIFO, 0 without one), lane 0 the merged ``m``, lane 1 the merged ``l``;
        - the last chunk: ``K = SL / M`` cycles merge and normalise (``(x R + half) >> sh``)
          the lanes into the register's top, then its ``o`` lanes enter the output register
          like a P.V row.

        Returns ``(pend_ready, busy, emit)``: the factors of the query whose P.V row is
        offered are ready, the state register is in use, and the emitted words' signals.
        """
        W, D, N = self._window, self._d_head, self._size
        one = 1 << MERGE_BITS
        st = st_in | st_out
        i32 = signed(ACC_BITS)

        def scale(x, f):
            return (x * f + (one >> 1)) >> MERGE_BITS

        # --- the factors, from the query's probabilities on --------------------------------
        IDLE, Y, FACT, SUM, NORM, DIV, DONE = range(7)
        check_built("ATTN_MERGE_CYCLES", ATTN_MERGE_CYCLES, SUM - Y + 1,
                    "cycles (exponent, factors, merged sum)", "hw/tile/attention_engine.py")
        check_built("ATTN_NORM_CYCLES", ATTN_NORM_CYCLES, DIV - NORM,
                    "cycles (normalising l)", "hw/tile/attention_engine.py")
        pst = Signal(range(DONE + 1))
        pm_a, pm_b = Signal(signed(SCORE_BITS)), Signal(signed(SCORE_BITS))
        pl_a, pl_b = Signal(i32), Signal(i32)
        p_fire = buf.i_probs.valid & buf.i_probs.ready & st
        with m.If(p_fire):
            m.d.sync += [pm_a.eq(Mux(st_in, hdr_m[hdr_r], EMPTY_MAX)),
                         pl_a.eq(Mux(st_in, hdr_l[hdr_r], 0)),
                         pm_b.eq(sm.o.payload.max), pl_b.eq(sm.o.payload.sum), pst.eq(Y)]
            with m.If(st_in):
                m.d.sync += hdr_r.eq(Mux(hdr_r == ATTN_STATE_ROWS - 1, 0, hdr_r + 1))
        # Y: the exponent of |m_a - m_b| (steps 2-3 of hw.spec.softmax).
        diff = Signal(signed(SCORE_BITS + 1))
        dist = Signal(SCORE_BITS)
        dcl = Signal(range(D_MAX + 1))
        y_bits = ((D_MAX * LOG2E_MULT + (1 << (LOG2E_SHIFT - 1))) >> LOG2E_SHIFT).bit_length()
        py = Signal(y_bits)
        a_top, b_top = Signal(), Signal()
        pm = Signal(signed(SCORE_BITS))
        m.d.comb += [diff.eq(pm_a - pm_b), dist.eq(Mux(diff < 0, -diff, diff)),
                     dcl.eq(Mux(dist > D_MAX, D_MAX, dist))]
        with m.If(pst == Y):
            m.d.sync += [py.eq((dcl * LOG2E_MULT + (1 << (LOG2E_SHIFT - 1))) >> LOG2E_SHIFT),
                         a_top.eq(pm_a >= pm_b), b_top.eq(pm_b >= pm_a),
                         pm.eq(Mux(pm_a >= pm_b, pm_a, pm_b)), pst.eq(FACT)]
        # FACT: e of the distance, the larger side 1.0.
        m.submodules.merge_lut = lut = Memory(shape=MERGE_BITS + 1, depth=1 << EXP_FRAC_BITS,
                                              init=EXP_LUT)
        lut_rd = lut.read_port(domain="comb")
        f = Signal(MERGE_BITS + 1)
        fa, fb = Signal(MERGE_BITS + 1), Signal(MERGE_BITS + 1)
        m.d.comb += [lut_rd.addr.eq(py[:EXP_FRAC_BITS]),
                     f.eq(lut_rd.data >> py[EXP_FRAC_BITS:])]
        with m.If(pst == FACT):
            m.d.sync += [fa.eq(Mux(a_top, one, f)), fb.eq(Mux(b_top, one, f)), pst.eq(SUM)]
        # SUM: the merged l.
        pl = Signal(i32)
        with m.If(pst == SUM):
            m.d.sync += [pl.eq((scale(pl_a, fa) + scale(pl_b, fb))[:ACC_BITS]),
                         pst.eq(Mux(last_chunk, NORM, DONE))]
        # NORM, DIV (the last chunk): R = 2**(z + NORM_BITS) // l as 2**46 // (l << (30 - z)),
        # restoring division, merge_divide_bits(W) quotient bits a cycle.
        top = ACC_BITS - 2                      # l's highest possible bit (l > 0)
        z = Signal(range(top + 1))
        z_val = Const(0, range(top + 1))
        for b in range(top + 1):
            z_val = Mux(pl[b], b, z_val)
        pz, pos = Signal(range(top + 1)), Signal()
        dnorm = Signal(top + 1)
        rem = Signal(top + 3)
        quo = Signal(NORM_QUOTIENT_BITS)
        DB, DC = merge_divide_bits(W), merge_divide_cycles(W)
        dcnt = Signal(range(DC))
        nshift = Signal(range(top + 1))
        m.d.comb += [z.eq(z_val), nshift.eq(top - z)]
        with m.If(pst == NORM):
            m.d.sync += [pz.eq(z), pos.eq(pl > 0), dnorm.eq(pl[:top + 1] << nshift),
                         rem.eq(1 << top), quo.eq(0), dcnt.eq(0), pst.eq(DIV)]
        r, qq = rem, quo
        for b in range(DB):
            ge = Signal(name=f"ndiv_ge{b}")
            act = Signal(name=f"ndiv_act{b}")
            r_b = Signal(top + 3, name=f"ndiv_rem{b}")
            q_b = Signal(NORM_QUOTIENT_BITS, name=f"ndiv_quo{b}")
            m.d.comb += [ge.eq(r >= dnorm), act.eq(dcnt * DB + b < NORM_QUOTIENT_BITS),
                         r_b.eq(Mux(act, Mux(ge, r - dnorm, r) << 1, r)),
                         q_b.eq(Mux(act, Cat(ge, qq[:-1]), qq))]
            r, qq = r_b, q_b
        with m.If(pst == DIV):
            m.d.sync += [rem.eq(r), quo.eq(qq), dcnt.eq(dcnt + 1)]
            with m.If(dcnt == DC - 1):
                m.d.sync += pst.eq(DONE)
        pend_ready = Signal()
        m.d.comb += pend_ready.eq(pst == DONE)

        # --- the state register and the emission of a row ----------------------------------
        o_take = buf.o_out.valid & buf.o_out.ready
        e_m = Signal(signed(SCORE_BITS))
        e_l = Signal(i32)
        e_fa, e_fb = Signal(MERGE_BITS + 1), Signal(MERGE_BITS + 1)
        e_r = Signal(NORM_QUOTIENT_BITS)
        e_sh = Signal(range(top + NORM_BITS - PROB_BITS + 1))
        x = Signal(data.ArrayLayout(i32, SL))
        e_act, c_act = Signal(), Signal()       # emitting state words; merging the last chunk
        eq_ph = Signal()                        # emitting the Q words
        e_off = Signal(range(N + D + N))        # lanes of the Q words emitted
        # State lanes emitted / merged (the last chunk's merge runs attn_merge_pipe cycles
        # past the register's SL lanes).
        jbase = Signal(range(SL + (attn_merge_pipe(self._pipeline) + 1) * M + 1))
        # Lane i of the word at jbase: an input-state lane (j < d_head + 2), lane 0 (m), lane 1
        # (l); registered with jbase so that no comparison precedes the merge's multiply.
        j_in = Signal(M)
        j_m, j_l = Signal(M), Signal(M)

        def set_jbase(value):
            return [jbase.eq(value),
                    *(j_in[i].eq(value + i < cfg.d_head + 2) for i in range(M)),
                    *(j_m[i].eq(value + i == 0) for i in range(M)),
                    *(j_l[i].eq(value + i == 1) for i in range(M))]
        ccnt = Signal(range(K))
        q_span = cfg.q_lane + cfg.d_head
        w_q = Array(Const(-(-x_ // N), range(N + D + 1)) for x_ in range(N + D))[q_span]
        with m.If(o_take & st):
            m.d.sync += [e_m.eq(pm), e_l.eq(pl), e_fa.eq(fa), e_fb.eq(fb),
                         e_r.eq(Mux(pos, quo, 0)), e_sh.eq(pz + NORM_BITS - PROB_BITS),
                         *set_jbase(0), e_off.eq(0), ccnt.eq(0), pst.eq(IDLE)]
            m.d.sync += [x[j].eq(0) for j in (0, 1)]
            m.d.sync += [x[2 + d].eq(buf.o_out.payload.data[d]) for d in range(D)]
            m.d.sync += [x[j].eq(0) for j in range(D + 2, SL)]
            with m.If(st_out):
                m.d.sync += [e_act.eq(1), eq_ph.eq(1)]
            with m.Else():
                m.d.sync += c_act.eq(1)
                m.d.comb += rptr_nxt.eq(advance(rptr, w_q))

        # One word's M lanes: the input state's (FIFO; 0 without one) and x's.
        a_word = f_rd.data
        a_lanes = [Mux(st_in & j_in[i], a_word[32 * i:32 * (i + 1)].as_signed(), 0)
                   for i in range(M)]
        # The last chunk: the lanes merged, scale(a, fa) + scale(x, fb), and normalised,
        # (merged * R + 2**(sh-1)) >> sh, into the top, through P = attn_merge_pipe registers
        # ("deep": the lanes read, their products with the factors, the merged lanes, their
        # product with R; "short": the last two): the lanes read in cycle c enter the top in
        # cycle c + P, and the P words that enter first (the registers' old contents) leave
        # the bottom before the merge ends.
        deep = self._pipeline == "deep"
        put = self._stage(m, 1)
        pipe_regs = []
        accs = []
        for i in range(M):
            a_r = Signal(i32, name=f"mrg_a{i}")
            x_r = Signal(i32, name=f"mrg_x{i}")
            pa = Signal((a_r * e_fa).shape(), name=f"mrg_pa{i}")
            px = Signal((x_r * e_fb).shape(), name=f"mrg_px{i}")
            mg_r = Signal(i32, name=f"mrg_r{i}")
            prod_r = Signal((mg_r * e_r).shape(), name=f"nprod_r{i}")
            for dst, value in ((a_r, a_lanes[i]), (x_r, x[i]), (pa, a_r * e_fa),
                               (px, x_r * e_fb)):
                put(dst, value)
            m.d.sync += [mg_r.eq(_merge_sum(pa, px)), prod_r.eq(mg_r * e_r)]
            a = Signal(i32, name=f"nrm{i}")
            if deep:
                # The shift into a register, keeping the bit below the result, and the
                # rounding after it: (w + 1) >> 1 = (v + 2**(sh-1)) >> sh.
                nw = Signal((prod_r << 1).shape(), name=f"nrm_w{i}")
                m.d.sync += nw.eq((prod_r << 1) >> e_sh)
                m.d.comb += a.eq(((nw + 1) >> 1)[:ACC_BITS])
            else:
                rounding = (Const(1, 1) << e_sh) >> 1
                m.d.comb += a.eq(((prod_r + rounding) >> e_sh)[:ACC_BITS])
            accs.append(a)
            if i == 0:
                pipe_regs += [a_r, pa, mg_r, prod_r, nw] if deep else [mg_r, prod_r]
        check_built("attn_merge_pipe", attn_merge_pipe(self._pipeline), len(pipe_regs),
                    "pipeline registers (lanes read, their products with the factors, merged "
                    "lanes, their product with R, deep: its shift)", "hw/tile/attention_engine.py")
        x_nxt = Signal(data.ArrayLayout(i32, SL))
        m.d.comb += [x_nxt[j].eq(x[j + M]) for j in range(SL - M)]
        m.d.comb += [x_nxt[SL - M + i].eq(Mux(c_act, accs[i], 0)) for i in range(M)]

        class Emit:
            """A state row's words as the output registers take them: ``word`` (the FIFO's:
            a Q word as it is), and for a state word (``merge``) the operands of its M
            merged lanes (the output registers multiply and add them: :func:`_merge_sum`),
            or lane 0's ``m`` and lane 1's ``l`` (``use``: ``ovr`` instead)."""
            valid = e_act
            word = Signal(8 * N)
            merge = Signal()
            a = [Signal(i32, name=f"emit_a{i}") for i in range(M)]
            x = [Signal(i32, name=f"emit_x{i}") for i in range(M)]
            ovr = [Signal(i32, name=f"emit_ovr{i}") for i in range(M)]
            use = Signal(M)
            fa, fb = e_fa, e_fb
            ready = Signal()
            done = Signal()
            load = Signal()
            acc = Signal(data.ArrayLayout(i32, D))

        emit = Emit()
        m.d.comb += [emit.word.eq(f_rd.data), emit.merge.eq(~eq_ph),
                     emit.done.eq(~eq_ph & (jbase + M >= cfg.d_head + 2))]
        for i in range(M):
            m.d.comb += [emit.a[i].eq(a_lanes[i]), emit.x[i].eq(x[i]),
                         emit.ovr[i].eq(Mux(j_m[i], e_m.as_signed(), e_l)[:ACC_BITS]),
                         emit.use[i].eq(j_m[i] | j_l[i])]
        fire = e_act & emit.ready
        with m.If(fire):
            with m.If(eq_ph):
                m.d.comb += rptr_nxt.eq(advance(rptr))
                with m.If(e_off + N >= q_span):
                    m.d.sync += eq_ph.eq(0)
                with m.Else():
                    m.d.sync += e_off.eq(e_off + N)
            with m.Else():
                with m.If(st_in):
                    m.d.comb += rptr_nxt.eq(advance(rptr))
                m.d.sync += [x.eq(x_nxt), *set_jbase(jbase + M)]
                with m.If(emit.done):
                    m.d.sync += e_act.eq(0)
                    m.d.comb += row_out.eq(1)
        with m.If(c_act):
            with m.If(jbase < cfg.d_head + 2):
                m.d.comb += rptr_nxt.eq(advance(rptr))
            m.d.sync += [x.eq(x_nxt), *set_jbase(jbase + M), ccnt.eq(ccnt + 1)]
            with m.If(ccnt == K - 1):
                m.d.sync += c_act.eq(0)
                m.d.comb += [emit.load.eq(1), row_out.eq(1)]
        m.d.comb += [emit.acc[d].eq(x_nxt[2 + d]) for d in range(D)]
        busy = Signal()
        m.d.comb += busy.eq(e_act | c_act)
        return pend_ready, busy, emit
