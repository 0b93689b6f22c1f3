"""Scratchpad SRAM and its address generators.

The scratchpad is ``banks`` banks of :class:`amaranth.lib.memory.Memory`, each with one
synchronous read port and one write port (simple dual-port block RAM). A word is one row of the
matmul array (``word_bytes`` = N bytes). Banks hold contiguous address ranges (bank
``addr >> log2(bank_words)``: :func:`hw.spec.memory.bank_shift`), so the compiler can keep
concurrent streams in different banks.

Units never see addresses: they are reached through *read ports* (an address stream in, a word
stream out) and *write ports* (an address-and-word stream in), each fed by an :class:`AddrGen`
that the sequencer programs with a descriptor.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..spec.isa import ADDR_LEVELS, COUNT_BITS
from ..spec.memory import bank_shift
from ..spec.timing.chip import READ_FIFO_DEPTH, READ_LATENCY, check_built

__all__ = ["desc_layout", "addr_layout", "AddrGen", "Scratchpad",
           "ReadPortSignature", "WritePortSignature"]

#: Width of each loop count of a descriptor (loops of up to 65535 iterations).


def _positive_int(name, value, minimum=1):
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer of at least {minimum}, not {value!r}")


def _any(signals):
    return Cat(*signals).any() if signals else Const(0, 1)


def desc_layout(addr_bits, *, wrap=False):
    """A 4-level address descriptor: ``base``, counts ``n[l]`` and signed strides ``s[l]``
    (and, for a generator with ``wrap``, the circular buffer's length ``wrap``, 0 = none).

    A count of 0 is treated as 1.
    """
    fields = {
        "base": unsigned(addr_bits),
        "n": data.ArrayLayout(unsigned(COUNT_BITS), ADDR_LEVELS),
        "s": data.ArrayLayout(signed(addr_bits + 1), ADDR_LEVELS),
    }
    if wrap:
        fields["wrap"] = unsigned(addr_bits + 1)
        fields["off"] = unsigned(addr_bits + 1)
    return data.StructLayout(fields)


def addr_layout(addr_bits):
    return data.StructLayout({"addr": unsigned(addr_bits), "last": 1})


class AddrGen(wiring.Component):
    """Walk a 4-level loop nest of scratchpad addresses.

    For a descriptor ``(base, n, s)`` it emits, innermost level first::

        for i3 < n3: for i2 < n2: for i1 < n1: for i0 < n0:
            addr = base + i0*s0 + i1*s1 + i2*s2 + i3*s3      (modulo 2**addr_bits)

    with ``last`` on the final address. No multipliers: each level keeps the offset at which
    its current iteration started.

    With ``wrap`` (a generator that has a ``wrap`` register, ``hw.spec.isa.WRAP_GENS``) and a
    descriptor ``wrap`` M > 0, each offset ``o = off + i0*s0 + ... + i3*s3`` is folded into
    ``[0, M)`` before it is added to ``base``: ``o + M`` if ``o < 0``, ``o - M`` if ``o >= M``
    (offsets must lie in ``[-M, 2M)``): a circular buffer of M words at ``base``, starting at
    its word ``off``.

    Timing: the first address is on ``o`` the cycle after the descriptor is taken; then one
    address per cycle while ``o`` is ready. A new descriptor is taken once the previous one is
    finished (``i.ready`` is high while idle).

    Structure (for the clock): each level's end-of-loop flag is a register set a step ahead
    (from ``i + 2 == n`` when the level steps); each level's next address is one adder from
    registers (the address at which its iteration started plus its stride; with ``wrap``, the
    fold's three outcomes and its two sign tests, from ``base + offset`` and the strides plus
    and minus M registered with the descriptor), and the flags pick one: no compare or
    carry chain lies between the flags and the adders.

    Members
    -------
    i : ``In(stream.Signature(desc_layout(addr_bits)))``
    o : ``Out(stream.Signature(addr_layout(addr_bits)))``
    """

    def __init__(self, *, addr_bits, wrap=False):
        _positive_int("addr_bits", addr_bits)
        self._addr_bits = addr_bits
        self._wrap = bool(wrap)
        super().__init__({
            "i": In(stream.Signature(desc_layout(addr_bits, wrap=self._wrap))),
            "o": Out(stream.Signature(addr_layout(addr_bits))),
        })

    def elaborate(self, platform):
        m = Module()
        ab = self._addr_bits
        levels = ADDR_LEVELS
        pay = self.i.payload
        n = [Signal(COUNT_BITS, name=f"n{lv}") for lv in range(levels)]
        s = [Signal(signed(ab + 1), name=f"s{lv}") for lv in range(levels)]
        idx = [Signal(COUNT_BITS, name=f"i{lv}") for lv in range(levels)]
        # at_end[lv]: level lv is at its last iteration (i == n - 1, or n <= 1), a register
        # set a step ahead: when the level steps, from i + 2 == n; when it restarts, from
        # n <= 1 (`single`, registered with the descriptor).
        at_end = [Signal(name=f"end{lv}") for lv in range(levels)]
        single = [Signal(name=f"single{lv}") for lv in range(levels)]
        addr = Signal(ab)
        take = Signal()
        # step[lv]: level lv steps on this transfer (the innermost level not at its end).
        step = [Signal(name=f"step{lv}") for lv in range(levels)]
        m.d.comb += [
            self.i.ready.eq(~self.o.valid),
            self.o.payload.addr.eq(addr),
            self.o.payload.last.eq(Cat(*at_end).all()),
            take.eq(self.o.valid & self.o.ready),
        ]
        for lv in range(levels):
            inner_at_end = Cat(*at_end[:lv]).all() if lv else 1
            m.d.comb += step[lv].eq(take & inner_at_end & ~at_end[lv])

        # Each level's candidate: the offset (and address) if that level steps next, from the
        # offset at which its current iteration started (level 0: the current one) plus its
        # stride; one adder each, all four in parallel; the stepping level picks one.
        if self._wrap:
            # Offsets from base, exact while they stay in [-2**(ab+1), 2**(ab+1)); `y` is
            # base + offset (modulo 2**ab), so that the folded address is y + s, y + s + M or
            # y + s - M (the strides plus and minus M registered with the descriptor) and the
            # fold's tests are the signs of x + s and x + s - M: one adder deep.
            width = ab + 2
            x = [Signal(signed(width), name=f"x{lv}") for lv in range(levels)]
            y = [Signal(ab, name=f"y{lv}") for lv in range(levels)]
            s_plus = [Signal(signed(ab + 3), name=f"s_plus{lv}") for lv in range(levels)]
            s_minus = [Signal(signed(ab + 3), name=f"s_minus{lv}") for lv in range(levels)]
            cand_x = [Signal(signed(width), name=f"cand_x{lv}") for lv in range(levels)]
            cand_y = [Signal(ab, name=f"cand_y{lv}") for lv in range(levels)]
            cand = [Signal(ab, name=f"cand{lv}") for lv in range(levels)]
            for lv in range(levels):
                below = (x[lv] + s[lv])[-1]                  # x + s < 0
                above = ~(x[lv] + s_minus[lv])[-1]           # x + s >= M
                m.d.comb += [
                    cand_x[lv].eq(x[lv] + s[lv]),
                    cand_y[lv].eq(y[lv] + s[lv]),
                    cand[lv].eq(Mux(below, y[lv] + s_plus[lv],
                                    Mux(above, y[lv] + s_minus[lv], y[lv] + s[lv]))),
                ]
            first = Mux(pay.wrap == 0, 0, pay.off)
            with m.If(self.i.valid & self.i.ready):
                m.d.sync += [addr.eq(pay.base + first)]
                for lv in range(levels):
                    m.d.sync += [x[lv].eq(first), y[lv].eq(pay.base + first),
                                 s_plus[lv].eq(pay.s[lv] + pay.wrap),
                                 s_minus[lv].eq(pay.s[lv] - pay.wrap)]
            for lv in range(levels):
                with m.If(step[lv]):
                    m.d.sync += addr.eq(cand[lv])
                    m.d.sync += [x[k].eq(cand_x[lv]) for k in range(lv + 1)]
                    m.d.sync += [y[k].eq(cand_y[lv]) for k in range(lv + 1)]
        else:
            # The address itself (modulo 2**ab) is the running sum; start[lv] the address at
            # which level lv's current iteration started (start[0] is addr).
            start = [addr] + [Signal(ab, name=f"start{lv}") for lv in range(1, levels)]
            cand = [Signal(ab, name=f"cand{lv}") for lv in range(levels)]
            m.d.comb += [cand[lv].eq(start[lv] + s[lv]) for lv in range(levels)]
            with m.If(self.i.valid & self.i.ready):
                m.d.sync += [x.eq(pay.base) for x in start]
            for lv in range(levels):
                with m.If(step[lv]):
                    m.d.sync += [start[k].eq(cand[lv]) for k in range(lv + 1)]

        with m.If(self.i.valid & self.i.ready):
            m.d.sync += self.o.valid.eq(1)
            for lv in range(levels):
                m.d.sync += [n[lv].eq(pay.n[lv]), s[lv].eq(pay.s[lv]), idx[lv].eq(0)]
                one = pay.n[lv][1:] == 0                     # n <= 1
                m.d.sync += [single[lv].eq(one), at_end[lv].eq(one)]
        with m.If(take & self.o.payload.last):
            m.d.sync += self.o.valid.eq(0)
        # Step the innermost level that is not at its end; restart the ones inside it.
        for lv in range(levels):
            with m.If(step[lv]):
                m.d.sync += [idx[lv].eq(idx[lv] + 1), at_end[lv].eq(idx[lv] + 2 == n[lv])]
                for inner in range(lv):
                    m.d.sync += [idx[inner].eq(0), at_end[inner].eq(single[inner])]
        return m


class ReadPortSignature(wiring.Signature):
    """A scratchpad read port, seen from the scratchpad: addresses in, words out, in order."""

    def __init__(self, addr_bits, word_bits):
        super().__init__({
            "i_addr": In(stream.Signature(addr_layout(addr_bits))),
            "o_data": Out(stream.Signature(data.StructLayout({"data": word_bits, "last": 1}))),
        })


class WritePortSignature(wiring.Signature):
    """A scratchpad write port, seen from the scratchpad: address, word, ``mask`` (one write
    enable per byte: byte ``i`` of the word is written when bit ``i`` is set) and ``last``
    in."""

    def __init__(self, addr_bits, word_bits):
        super().__init__({
            "i": In(stream.Signature(data.StructLayout(
                {"addr": addr_bits, "data": word_bits, "mask": word_bits // 8, "last": 1}))),
        })


class Scratchpad(wiring.Component):
    """``banks`` x ``bank_words`` words of ``word_bytes`` bytes, with read and write ports.

    Ports are served by fixed priority per bank: in each cycle each bank serves the
    lowest-numbered read port and, independently, the lowest-numbered write port that address
    it; the others wait (``ready`` low). Different banks serve different ports in the same
    cycle. The schedule stays data-independent because addresses are static.

    A write port writes the bytes its ``mask`` enables (byte-wide write enables of the banks:
    the attention engine's output rows of packed heads, and the vector engine's rows that end
    inside a word, leave the other lanes of their words alone).

    A read port returns words in request order; a read taken in cycle t is in the port's output FIFO
    in cycle t + 2 and on ``o_data`` then (``hw.spec.timing.chip.READ_LATENCY``: the bank's read
    register, then the FIFO; the FIFO holds ``READ_FIFO_DEPTH`` = 4 words per port, counting the
    read in flight, so a port keeps one read per cycle under no backpressure). ``last`` travels with
    the address. A read and a write of the same word in the same cycle read the old word.

    Members
    -------
    rd : ``Out(ReadPortSignature(addr_bits, 8*word_bytes)).array(read_ports)``
    wr : ``Out(WritePortSignature(addr_bits, 8*word_bytes)).array(write_ports)``
    """

    #: The registers between a read's grant and its word on ``o_data``, which make
    #: ``READ_LATENCY`` (checked at construction).
    _READ_STAGES = ("bank read", "FIFO write")

    def __init__(self, *, words, banks, word_bytes, read_ports, write_ports):
        for name, value in (("words", words), ("banks", banks), ("word_bytes", word_bytes),
                            ("read_ports", read_ports), ("write_ports", write_ports)):
            _positive_int(name, value)
        if words % banks:
            raise ValueError(f"words={words} is not a multiple of banks={banks}")
        bank_words = words // banks
        self._bank_shift = bank_shift(bank_words)
        check_built("READ_LATENCY", READ_LATENCY, len(self._READ_STAGES),
                    f"cycles of read latency ({', '.join(self._READ_STAGES)})",
                    "hw/tile/scratchpad.py")
        self._fifo_depth = READ_FIFO_DEPTH
        self._words, self._banks, self._bank_words = words, banks, bank_words
        self._word_bits = 8 * word_bytes
        self._addr_bits = max(1, (words - 1).bit_length())
        self._read_ports, self._write_ports = read_ports, write_ports
        super().__init__({
            "rd": Out(ReadPortSignature(self._addr_bits, self._word_bits)).array(read_ports),
            "wr": Out(WritePortSignature(self._addr_bits, self._word_bits)).array(write_ports),
        })

    @property
    def addr_bits(self):
        return self._addr_bits

    def elaborate(self, platform):
        m = Module()
        nb = self._banks
        low_bits = self._bank_shift
        mems = []
        for b in range(nb):
            mem = Memory(shape=unsigned(self._word_bits), depth=self._bank_words, init=[])
            m.submodules[f"bank{b}"] = mem
            mems.append((mem, mem.read_port(), mem.write_port(granularity=8)))

        def bank_of(addr):
            return addr[low_bits:] if nb > 1 else 0

        def priority_mux(pairs):
            # (any want, the value of the lowest-numbered want) of (want, value) pairs: a
            # balanced tree of 2:1 multiplexers, each selected by whether its lower half wants,
            # rather than a chain of 2:1 multiplexers or the grants' AND-OR.
            if len(pairs) == 1:
                return pairs[0]
            lo_any, lo = priority_mux(pairs[:len(pairs) // 2])
            hi_any, hi = priority_mux(pairs[len(pairs) // 2:])
            return lo_any | hi_any, Mux(lo_any, lo, hi)

        def grants(wants):
            # Per bank, the lowest-numbered wanting port: grant[k][b].
            return [[wants[k][b] & ~_any([wants[j][b] for j in range(k)]) for b in range(nb)]
                    for k in range(len(wants))]

        # Reads: per bank, the lowest-numbered requesting port wins. A port requests while its
        # FIFO has room for the word (its level plus the read in flight below the depth):
        # `room` is a register, computed a cycle ahead from the level the FIFO will have and
        # whether this cycle's request is granted.
        rd_wants = [[Signal(name=f"rd{k}_bank{b}") for b in range(nb)]
                    for k in range(self._read_ports)]
        rd_grants = grants(rd_wants)
        for k, port in enumerate(self.rd):
            fifo = SyncFIFO(width=self._word_bits + 1, depth=self._fifo_depth)
            m.submodules[f"rd{k}_fifo"] = fifo
            inflight = Signal(name=f"rd{k}_inflight")
            inflight_bank = Signal(range(max(nb, 2)), name=f"rd{k}_from")
            inflight_last = Signal(name=f"rd{k}_last")
            room = Signal(name=f"rd{k}_room", init=1)
            request = port.i_addr.valid & room
            bank = bank_of(port.i_addr.payload.addr)
            granted = Signal(name=f"rd{k}_granted")
            m.d.comb += [rd_wants[k][b].eq(request & (bank == b)) for b in range(nb)]
            m.d.comb += granted.eq(_any([rd_grants[k][b] for b in range(nb)]))
            m.d.comb += port.i_addr.ready.eq(granted)
            m.d.sync += [inflight.eq(granted), inflight_last.eq(port.i_addr.payload.last)]
            # The FIFO's level next cycle (the word in flight written, one read out), then room.
            level_next = Signal(range(self._fifo_depth + 2), name=f"rd{k}_level_next")
            m.d.comb += level_next.eq(fifo.level + inflight - (fifo.r_en & fifo.r_rdy))
            m.d.sync += room.eq(Mux(granted, level_next < self._fifo_depth - 1,
                                    level_next < self._fifo_depth))
            with m.If(granted):
                m.d.sync += inflight_bank.eq(bank)
            # The word from the bank read in flight: a tree of 2:1 multiplexers on the bank
            # number's bits (one LUT and the slices' wide multiplexers after the block RAM).
            returned = Signal(self._word_bits, name=f"rd{k}_word")
            words_in = [mems[b][1].data for b in range(nb)]
            for bit in range(len(inflight_bank)):
                words_in = [Mux(inflight_bank[bit], words_in[i + 1], words_in[i])
                            if i + 1 < len(words_in) else words_in[i]
                            for i in range(0, len(words_in), 2)]
            m.d.comb += returned.eq(words_in[0])
            m.d.comb += [
                fifo.w_en.eq(inflight),
                fifo.w_data.eq(Cat(returned, inflight_last)),
                port.o_data.valid.eq(fifo.r_rdy),
                port.o_data.payload.data.eq(fifo.r_data[:self._word_bits]),
                port.o_data.payload.last.eq(fifo.r_data[self._word_bits]),
                fifo.r_en.eq(port.o_data.ready),
            ]
        for b, (_mem, rp, _wp) in enumerate(mems):
            en, addr = priority_mux([(rd_wants[k][b], port.i_addr.payload.addr[:low_bits])
                                     for k, port in enumerate(self.rd)])
            m.d.comb += [rp.en.eq(en), rp.addr.eq(addr)]

        # Writes: same fixed priority, independent of reads (separate BRAM port).
        wr_wants = [[Signal(name=f"wr{k}_bank{b}") for b in range(nb)]
                    for k in range(self._write_ports)]
        wr_grants = grants(wr_wants)
        for k, port in enumerate(self.wr):
            bank = bank_of(port.i.payload.addr)
            m.d.comb += [wr_wants[k][b].eq(port.i.valid & (bank == b)) for b in range(nb)]
            m.d.comb += port.i.ready.eq(_any([wr_grants[k][b] for b in range(nb)]))
        for b, (_mem, _rp, wp) in enumerate(mems):
            any_want, chosen = priority_mux([
                (wr_wants[k][b], Cat(port.i.payload.mask, port.i.payload.addr[:low_bits],
                                     port.i.payload.data))
                for k, port in enumerate(self.wr)])
            nm = len(wp.en)
            m.d.comb += [wp.en.eq(Mux(any_want, chosen[:nm], 0)),
                         wp.addr.eq(chosen[nm:nm + low_bits]),
                         wp.data.eq(chosen[nm + low_bits:])]
        return m
