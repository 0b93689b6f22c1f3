"""The ISS as a timing model: the cycles of chip programs, without their data.

:func:`time_programs` runs one program per chip (``hw/system.py: ChipSystem``, or one
``hw/chip.py: Chip`` alone) cycle by cycle, at the level that decides *when* anything
happens and never *what* a word holds (the chip's schedule is static: no cycle depends on the
data). Per chip it models

- the sequencer (``hw/tile/sequencer.py``): one instruction per cycle; a launch waits for its
  unit and the unit's address generators to be idle and copies the registers in the cycle it
  is taken; ``WAIT`` until the masked units are idle; ``HALT`` until every unit is;
- the address generators (one address per cycle from the cycle after a launch, while granted)
  and the scratchpad (``hw/tile/scratchpad.py``): per bank, fixed priority among the read
  ports that request it and, independently, among the write ports; a read port requests only
  while its FIFO has room (:data:`~hw.spec.timing.chip.READ_FIFO_DEPTH` words, counting the
  read in flight) and its word is on its output :data:`~hw.spec.timing.chip.READ_LATENCY`
  cycles after the grant;
- the units: :mod:`sim.timing.engines` (matmul, attention, vector) and :mod:`sim.timing.ring`
  (collective engine, send and receive units, routers, links);
- the busy vector (``hw.spec.isa.Unit`` bits, each unit busy while it or its generators are),
  the busy counters (``hw.spec.isa.BUSY_COUNTERS``) and the trace of every change of the busy
  vector (``hw/tile/trace.py``), exactly as the chip counts and records them.

So its cycles, counters and traces equal the RTL's (``tests/sim/timing/test_cycle.py`` compares
them entry by entry). A cycle costs tens of microseconds in Python: this is the model of record
for programs of up to a few million cycles; :mod:`sim.timing.launch` times larger ones in closed
form.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from hw.spec import NpuConfig
from hw.spec.collective import Kind, command_from_registers
from hw.spec.isa import (
    ADDR_LEVELS,
    BUSY_COUNTERS,
    COLL_GENS,
    READ_GENS,
    REG_INDEX,
    REGS,
    WRAP_GENS,
    WRITE_GENS,
    IsaError,
    LoopState,
    Op,
    Unit,
    decode,
)
from hw.spec.memory import bank_of
from hw.spec.timing.chip import READ_FIFO_DEPTH
from hw.spec.topology import DimLink, Topology

from ..golden.scratchpad import AddressError, addr_sequence
from ..iss.errors import IssError
from .engines import AttentionModel, MatmulModel, VectorModel
from .ring import CollectiveModel, LinkModel, RecvModel, SendModel, route

__all__ = ["ChipTiming", "SystemTiming", "ChipModel", "time_programs", "trace_entries",
           "trace_depth"]

_GENS = READ_GENS + WRITE_GENS
_RD = {g: k for k, g in enumerate(READ_GENS)}
_WR = {g: k for k, g in enumerate(WRITE_GENS)}
_LAUNCH = (Op.MATMUL, Op.ATTN, Op.VEC, Op.COLL, Op.SEND, Op.RECV)
_BIT = {Op.MATMUL: 0, Op.ATTN: 1, Op.VEC: 2, Op.COLL: 3, Op.SEND: 4, Op.RECV: 5}
_GEN_REGS = {g: (REG_INDEX[f"{g}.base"],
                 tuple(REG_INDEX[f"{g}.n{lv}"] for lv in range(ADDR_LEVELS)),
                 tuple(REG_INDEX[f"{g}.s{lv}"] for lv in range(ADDR_LEVELS)),
                 (REG_INDEX[f"{g}.wrap"], REG_INDEX[f"{g}.off"]) if g in WRAP_GENS else None)
             for g in _GENS}
_UNIT_REGS = {Op.MATMUL: ("MM_K", "MM_FOLDS", "MM_MODE", "MM_B_ROWS", "MM_B_BLOCKS",
                          "MM_B_LAST"),
              Op.ATTN: ("AT_QUERIES", "AT_KEYS", "AT_FLAGS", "AT_D_HEAD", "AT_Q_LANE",
                        "AT_K_LANE", "AT_V_LANE", "AT_O_LANE"),
              Op.VEC: ("VU_OP", "VU_ROWS", "VU_LEN", "VU_FLAGS")}
_MM_GENS = ("RD0", "RD1", "RD2", "WR0")
_AT_GENS = ("RD3", "RD4", "RD5", "WR1")
_NR = len(READ_GENS)
_G = {g: k for k, g in enumerate(_GENS)}          # a generator's index in ChipModel.gens
_SHARED = tuple(_G[g] for g in ("RD3", "RD4", "RD5", "WR1", "WR2"))
_MM = tuple(_G[g] for g in _MM_GENS)
_COLL = tuple((_G[rd], _G[wr]) for rd, wr in COLL_GENS)
#: Each write port's unit, in WRITE_GENS order.
_WR_SRC = {"WR0": "mm", "WR1": "at_vd", "WR2": "vq", "WR3": "co0", "WR4": "recv", "WR5": "co1"}


@dataclass
class ChipTiming:
    """What one chip's run measured, as the RTL reports it.

    ``cycles``: from start to ``done``; ``busy``: the busy counters by
    ``hw.spec.isa.BUSY_COUNTERS`` order; ``trace``: ``(cycle, busy vector)`` at every change
    (``hw/tile/trace.py``); ``launches``: per launch ``[pc, op name, issue cycle, done]``,
    ``done`` the first cycle its unit is idle again (the cycle after the launch for a COLL
    outside its group, which never makes its unit busy); ``issue``: the cycle each executed
    instruction was issued in (a ``WAIT`` or ``HALT``: the cycle it passed).
    """

    chip: int
    cycles: int
    busy: list
    trace: list
    launches: list = field(default_factory=list)
    issue: list = field(default_factory=list)


@dataclass
class SystemTiming:
    """``cycles``: to the last chip's ``done`` (``ChipSystem.cycles``); ``chips``: per chip."""

    cycles: int
    chips: list


class _Gen:
    __slots__ = ("banks", "pos", "n")

    def __init__(self):
        self.banks = []
        self.pos = self.n = 0


class ChipModel:
    """One chip's cycle model running ``program`` (instruction words) as chip ``chip``; on a
    torus (``row``: its row's first and last chip ids) with two links and two collective
    engines."""

    def __init__(self, npu: NpuConfig, program, chip: int = 0, chips: int = 1,
                 row: tuple[int, int] | None = None):
        self.npu = npu
        self.chip = chip
        self.chips = chips
        self.row = row
        self.engines = 1 if row is None else 2
        n = npu.array_size
        try:
            self.program = [decode(int(w)) for w in program]
        except IsaError as exc:
            raise IssError(f"chip {chip}: {exc}") from None
        self.regs = [0] * len(REGS)
        self.pc = 0
        self.loop = LoopState()
        self.running = True
        self.cycles = None
        self.error = False
        self.gens = [_Gen() for _ in _GENS]
        self.level = [0] * len(READ_GENS)
        self.inflight = [False] * len(READ_GENS)
        self.mm = MatmulModel(n)
        self.at = AttentionModel(window=npu.attn_window, length=npu.softmax_len, size=n,
                                 d_head=npu.d_head_max, pipeline=npu.attention_pipeline)
        self.vu = VectorModel(lanes=n, pipeline=npu.vector_pipeline)
        ratio = npu.ring_word_bytes // n
        self.co = [CollectiveModel(chip=chip, ratio=ratio, wbytes=npu.ring_word_bytes,
                                   engine=e) for e in range(self.engines)]
        self.send = SendModel(chip=chip, ratio=ratio)
        self.recv = RecvModel(chip=chip, ratio=ratio)
        self.owner_attn = False
        self.counters = [0] * len(BUSY_COUNTERS)
        self.trace = []
        self.prev = 0
        self.launches = []
        self.issue = []
        # unit bit (or ("coll", engine)) -> index in launches of its running launch
        self._open = {}
        self.co_busy = [False] * self.engines
        self._bank_words = npu.bank_words if npu.sram_banks > 1 else None
        self._addr_bits = npu.sram_addr_bits
        self._cache = {}
        self._starts = []
        self.busy = 0

    # --- generators ---------------------------------------------------------------------
    def _banks(self, gen: str) -> list:
        base, ns, ss, wrap = _GEN_REGS[gen]
        r = self.regs
        key = (r[base], tuple(r[i] for i in ns), tuple(r[i] for i in ss),
               (r[wrap[0]], r[wrap[1]]) if wrap else (0, 0))
        banks = self._cache.get(key)
        if banks is None:
            try:
                addrs = addr_sequence(key[0], key[1], key[2], self._addr_bits, *key[3])
            except AddressError as exc:
                raise IssError(f"chip {self.chip} pc {self.pc}: {gen}: {exc}") from None
            if self._bank_words is None:
                banks = [0] * len(addrs)
            else:
                banks = bank_of(addrs, self._bank_words).tolist()
            self._cache[key] = banks
        return banks

    def _unit_regs(self, op) -> dict:
        return {name: self.regs[REG_INDEX[name]] for name in _UNIT_REGS[op]}

    # --- one cycle: before the ring ------------------------------------------------------
    def pre(self, cycle: int):
        """Busy vector, counters and trace; the scratchpad's grants (all from the state at the
        start of the cycle)."""
        gens = self.gens
        gv = [g.pos < g.n for g in gens]
        self.gv = gv
        shared = any(gv[k] for k in _SHARED)
        mm_b = self.mm.active or any(gv[k] for k in _MM)
        at_b = self.at.active or (self.owner_attn and shared)
        vu_b = self.vu.active or (not self.owner_attn and shared)
        co_e = [co.busy_core() or gv[_COLL[e][0]] or gv[_COLL[e][1]]
                for e, co in enumerate(self.co)]
        co_b = any(co_e)
        send_b = self.send.busy_core() or gv[_G["RD7"]]
        recv_b = self.recv.busy_core() or gv[_G["WR4"]]
        busy = mm_b | at_b << 1 | vu_b << 2 | co_b << 3 | send_b << 4 | recv_b << 5
        self.busy = busy
        self.shared_busy = shared
        if self.running:
            c = self.counters
            for u in range(6):
                if busy >> u & 1:
                    c[u] += 1
            if busy:
                c[6] += 1
                if busy & 7:
                    c[7] += 1
            if busy != self.prev:
                self.trace.append((cycle, busy))
                fell = self.prev & ~busy
                for u in range(6):
                    if u != 3 and fell >> u & 1 and u in self._open:
                        self.launches[self._open.pop(u)][3] = cycle
                self.prev = busy
            # A COLL's launch ends when its engine is idle again.
            for e, b in enumerate(co_e):
                if self.co_busy[e] and not b and ("coll", e) in self._open:
                    self.launches[self._open.pop(("coll", e))][3] = cycle
        self.co_busy = co_e
        # Reads: the lowest-numbered port requesting a bank wins it.
        level, inflight = self.level, self.inflight
        taken = set()
        grant = [False] * len(READ_GENS)
        for k in range(len(READ_GENS)):
            if gv[k] and level[k] + inflight[k] < READ_FIFO_DEPTH:
                g = gens[k]
                b = g.banks[g.pos]
                if b not in taken:
                    taken.add(b)
                    grant[k] = True
        self.rgrant = grant
        # Writes: the same, among the write ports whose source offers a word.
        owner = self.owner_attn
        vd, vq = self.vu.out_valid()
        co = self.co
        src = (self.mm.out_valid(), self.at.out_valid() if owner else vd,
               (not owner) and vq, co[0].out_valid(), self.recv.out_valid(),
               len(co) > 1 and co[1].out_valid())
        taken = set()
        wgrant = [False] * len(WRITE_GENS)
        for k in range(len(WRITE_GENS)):
            if src[k] and gv[_NR + k]:
                g = gens[_NR + k]
                b = g.banks[g.pos]
                if b not in taken:
                    taken.add(b)
                    wgrant[k] = True
        self.wgrant = wgrant

    # --- one cycle: the ring side --------------------------------------------------------
    def ring(self, rxs, tx_readies):
        """Router, collective engines, send and receive units. ``rxs[d]``: the word the link
        of dimension d offers; returns ``(per link the word into its next link or None, per
        link whether its word was taken)``."""
        co, send, recv = self.co, self.send, self.recv
        wg = self.wgrant
        level = self.level
        pw = send.word()
        write = (_WR["WR3"], _WR["WR5"])
        fns = []
        for e, engine in enumerate(co):
            fns.append(lambda valid, engine=engine, e=e: engine.comb(valid, wg[write[e]]))
        txs, rx_taken, to_coll, to_p2p, cts_from, took = route(
            self.chip, self.row, rxs, tx_readies,
            recv.cts_word() if recv.cts_due else None, [e.tx_word() for e in co], pw, fns,
            recv.open, recv.src, recv.fifo_ready(), send.cts_ready)
        sent = "p2p" in took
        pops = []
        for e, engine in enumerate(co):
            pop = level[_RD[COLL_GENS[e][0]]] > 0 and engine.pack_ready()
            engine.update(to_coll[e], pop, f"coll{e}" in took, wg[write[e]])
            pops.append(pop)
        pop7 = level[_RD["RD7"]] > 0 and send.pack_ready(sent)
        send.update(pop7, sent, cts_from)
        recv.update(to_p2p, "cts" in took, wg[_WR["WR4"]])
        self.ring_pops = (pops, pop7)
        return txs, rx_taken

    # --- one cycle: units, sequencer, state -----------------------------------------------
    def post(self, cycle: int):
        level = self.level
        rv = [x > 0 for x in level]
        wg = self.wgrant
        pops = [False] * len(READ_GENS)
        mm = self.mm
        if not mm.idle() or rv[0] or rv[1] or rv[2]:
            pops[0], pops[1], pops[2] = mm.step(rv[0], rv[1], rv[2], wg[0])
        if self.owner_attn:
            if not self.at.idle() or rv[3] or rv[4] or rv[5]:
                pops[3], pops[4], pops[5] = self.at.step(rv[3], rv[4], rv[5], wg[1])
        elif not self.vu.idle() or rv[3] or rv[4] or rv[5]:
            pops[3], pops[4], pops[5] = self.vu.step(rv[3], rv[4], rv[5], wg[1], wg[2])
        coll_pops, pops[_RD["RD7"]] = self.ring_pops
        for e, pop in enumerate(coll_pops):
            pops[_RD[COLL_GENS[e][0]]] = pop
        if self.running:
            self._sequence(cycle)
        # Read ports: the word granted now is in the FIFO next cycle, on its output after.
        inflight = self.inflight
        grant = self.rgrant
        gens = self.gens
        for k in range(len(READ_GENS)):
            if inflight[k] or pops[k]:
                level[k] += inflight[k] - pops[k]
            inflight[k] = grant[k]
            if grant[k]:
                gens[k].pos += 1
        for k in range(len(WRITE_GENS)):
            if wg[k]:
                gens[_NR + k].pos += 1
        for fn in self._starts:
            fn()
        self._starts.clear()

    def _sequence(self, cycle: int):
        insn = self.program[self.pc] if self.pc < len(self.program) else None
        if insn is None:
            raise IssError(f"chip {self.chip}: program ended without HALT")
        op = insn.op
        busy = self.busy
        advance = True
        if op is Op.ADDX and not self.loop.active:   # halts with error, as a nested LOOP does
            self.running, self.error = False, True
            self.cycles = cycle + 1
            return
        if op in (Op.SET, Op.ADD, Op.ADDX):
            if insn.reg < len(REGS):          # the sequencer ignores other indices
                try:
                    self.regs[insn.reg] = self.loop.written(insn, self.regs[insn.reg], self.pc)
                except IsaError as exc:
                    raise IssError(f"chip {self.chip} pc {self.pc}: {exc}") from None
        elif op is Op.LOOP:
            try:
                self.pc = self.loop.begin(self.pc, insn.value)
            except IsaError:
                self.running, self.error = False, True
                self.cycles = cycle + 1
                return
            self.issue.append(cycle)
            return
        elif op is Op.WAIT:
            advance = busy & insn.value & int(Unit.ALL) == 0
        elif op is Op.HALT:
            advance = False
            if busy == 0:
                self.running = False
                self.cycles = cycle + 1
        elif op in _BIT:
            advance = self._can_launch(op, insn.value)
            if advance:
                self._launch(op, cycle, insn.value)
        elif op is not Op.NOP:
            self.running, self.error = False, True
            self.cycles = cycle + 1
            return
        if advance:
            self.issue.append(cycle)
            self.pc = self.loop.next_pc(self.pc)
        elif not self.running:
            self.issue.append(cycle)

    def _engine(self, value: int) -> int:
        """The collective engine a COLL with operand ``value`` runs on (a ring's chip has
        one: every COLL runs on it)."""
        return value & 1 if self.engines == 2 else 0

    def _can_launch(self, op, value: int = 0) -> bool:
        busy = self.busy
        if op is Op.MATMUL:
            return not busy & 1
        if op in (Op.ATTN, Op.VEC):
            return not (self.at.active or self.vu.active or self.shared_busy)
        if op is Op.COLL:
            return not self.co_busy[self._engine(value)]
        return not busy & (1 << _BIT[op])

    def _start_gens(self, names):
        banks = [(self.gens[_GEN_INDEX[g]], self._banks(g)) for g in names]

        def go():
            for gen, b in banks:
                gen.banks, gen.pos, gen.n = b, 0, len(b)
        self._starts.append(go)

    def _launch(self, op, cycle, value: int = 0):
        bit = _BIT[op]
        self.launches.append([self.pc, op.name, cycle, None])
        index = len(self.launches) - 1
        key = ("coll", self._engine(value)) if op is Op.COLL else bit

        def opened():
            self._open[key] = index
        self._starts.append(opened)
        if op is Op.MATMUL:
            regs = self._unit_regs(op)
            self._start_gens(_MM_GENS)
            self._starts.append(lambda: self.mm.start(regs))
        elif op is Op.ATTN:
            regs = self._unit_regs(op)
            uses = self.at.uses(regs)
            self._start_gens([g for g in _AT_GENS if uses[g]])
            self._starts.append(lambda: (self.at.start(regs), self._own(True)))
        elif op is Op.VEC:
            regs = self._unit_regs(op)
            uses = self.vu.uses(regs)
            self._start_gens([g for g in ("RD3", "RD4", "RD5", "WR1", "WR2") if uses[g]])
            self._starts.append(lambda: (self.vu.start(regs), self._own(False)))
        elif op is Op.COLL:
            self._coll(self._engine(value))
        elif op is Op.SEND:
            dest = self.regs[REG_INDEX["SR_DEST"]]
            banks = self._banks("RD7")
            self._start_gens(("RD7",))
            self._starts.append(lambda: self.send.start(dest, len(banks)))
        else:
            src = self.regs[REG_INDEX["SR_SRC"]]
            self._start_gens(("WR4",))
            self._starts.append(lambda: self.recv.start(src))

    def _own(self, attn: bool):
        self.owner_attn = attn

    def _coll(self, engine: int):
        r = {name: self.regs[REG_INDEX[name]] for name in (
            "CO_KIND", "CO_OP", "CO_WIDTH", "CO_LEN", "CO_CHIPS", "CO_RANK", "CO_NEXT",
            "CO_COUNT")}
        try:
            cmd = command_from_registers(r)
        except ValueError as exc:
            raise IssError(f"chip {self.chip} pc {self.pc}: {exc}") from None
        if cmd.rank is None:          # outside the group: a no-op (the router forwards)
            self._starts.pop()
            self.launches[-1][3] = self.launches[-1][2] + 1
            return
        req, rank = cmd.group, cmd.rank
        data = req.kind in (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER)
        sr = req.kind == Kind.SEND_RECV
        rd, wr = COLL_GENS[engine]
        gens = []
        if data or (sr and rank == 0):
            gens.append(rd)
        if data or (sr and rank == 1):
            gens.append(wr)
        self._start_gens(gens)
        co = self.co[engine]
        self._starts.append(lambda: co.start(req, rank, cmd.next))

    def result(self) -> ChipTiming:
        return ChipTiming(self.chip, self.cycles, list(self.counters), list(self.trace),
                          list(self.launches), list(self.issue))


_GEN_INDEX = {g: k for k, g in enumerate(_GENS)}


#: Registers no cycle depends on (the data's scales, positions, the count LayerNorm divides
#: by): programs that differ only in them take the same cycles.
TIMELESS_REGS = frozenset(REG_INDEX[name] for name in (
    "VU_MULT", "VU_SHIFT", "VU_GSHIFT", "VU_N", "AT_SCORE_MULT", "AT_SCORE_SHIFT",
    "AT_OUT_MULT", "AT_OUT_SHIFT", "AT_Q_POS", "AT_K_POS", "AT_WINDOW", "MM_A_UNSIGNED"))
_MASK = ((1 << 10) - 1) << 6 | 0x3F          # a SET's opcode and register index
_RESULTS: dict = {}
_RESULTS_KEPT = 32


def _timeless(word: int) -> int:
    """``word`` with the value of a SET to a :data:`TIMELESS_REGS` register cleared."""
    if word & 0x3F == Op.SET and (word >> 6) & ((1 << 10) - 1) in TIMELESS_REGS:
        return word & _MASK
    return word


def time_programs(npu: NpuConfig, programs, *, ring: bool | None = None,
                  max_cycles: int = 5_000_000, link: DimLink | None = None,
                  topology: Topology | None = None) -> SystemTiming:
    """Cycles of ``programs[i]`` on chip ``i`` of a ring (``ChipSystem``), or of one program on
    a lone chip (``ring=False``, the default for one program: ``Chip`` with its ring port
    unconnected, as ``sim/rtl/chip_runner.py`` runs it), or of the chips of ``topology`` (a
    ring, or a torus: ``ChipSystem`` of that topology, two links and two collective engines
    per chip, each dimension's links from ``topology.link``). :class:`IssError` when a chip
    never halts within ``max_cycles`` (a deadlock: the functional ISS names it first).

    ``link`` (a :class:`hw.spec.topology.DimLink`): a ring's links are that wide and deep
    instead of the NPU's ``link_*`` (one dimension of a torus, :mod:`sim.timing.launch`); the
    chip's ring word stays ``max(2 * link_bytes_per_cycle, 8)`` bytes of the NPU, cut into
    flits of the link's width.

    The last results are kept by the programs with their :data:`TIMELESS_REGS` values
    cleared: the same model over other seeds or weights is not walked again."""
    chips = len(programs)
    if topology is not None:
        if topology.chips != chips:
            raise ValueError(f"{chips} programs for the {topology.chips} chips of the "
                             f"{topology}")
        if not topology.is_torus:
            link = link or (topology.links[0] if topology.links else None)
            topology = None
    if ring is None:
        ring = chips > 1
    key = (npu, ring, link, topology,
           tuple(tuple(_timeless(int(w)) for w in p) for p in programs))
    if key in _RESULTS:
        result = _RESULTS[key]
        if result.cycles > max_cycles:
            raise IssError(f"timing: the chips did not all halt within {max_cycles} cycles")
        return copy.deepcopy(result)
    result = _walk(npu, programs, ring, max_cycles, link, topology)
    if len(_RESULTS) >= _RESULTS_KEPT:
        del _RESULTS[next(iter(_RESULTS))]
    _RESULTS[key] = copy.deepcopy(result)
    return result


def _walk(npu, programs, ring, max_cycles, link=None, topology=None) -> SystemTiming:
    chips = len(programs)
    wbytes = npu.ring_word_bytes
    if topology is not None:
        # A torus: each chip's link of dimension 0 goes to (x + 1, y), of dimension 1 to
        # (x, y + 1); a chip's router needs its row's first and last ids.
        X = topology.dims[0]
        rows = [(c - c % X, c - c % X + X - 1) for c in range(chips)]
        dim_links = [topology.link(d, npu) for d in range(2)]
        prev = [[topology.chip_at((x - 1) % X, y) for x, y in map(topology.coords,
                                                                 range(chips))],
                [topology.chip_at(x, (y - 1) % topology.dims[1])
                 for x, y in map(topology.coords, range(chips))]]
    else:
        rows = [None] * chips
        dim_links = [link or DimLink(npu.link_bytes_per_cycle, npu.link_latency_cycles)]
        prev = [[(c - 1) % chips for c in range(chips)]]
    for d in dim_links:
        if wbytes % d.bytes_per_cycle:
            raise ValueError(f"link_bytes_per_cycle={d.bytes_per_cycle} does not divide the "
                             f"chip's ring word of {wbytes} bytes (a word is whole flits)")
    models = [ChipModel(npu, p, chip=i, chips=chips, row=rows[i])
              for i, p in enumerate(programs)]
    dims = len(dim_links)
    # links[d][i]: the link of dimension d leaving chip i
    links = [[LinkModel(ratio=wbytes // d.bytes_per_cycle, latency=d.latency_cycles)
              for _ in programs] for d in dim_links] if ring else None
    nxt = [[0] * chips for _ in range(dims)]
    for d in range(dims):
        for c in range(chips):
            nxt[d][prev[d][c]] = c
    cycle = 0
    none = [None] * dims
    unready = [False] * dims
    while any(m.running for m in models):
        if cycle >= max_cycles:
            waiting = [f"chip {m.chip} at pc {m.pc}" for m in models if m.running]
            raise IssError(f"timing: the chips did not all halt within {max_cycles} cycles "
                           f"({', '.join(waiting)})")
        for m in models:
            m.pre(cycle)
        if ring:
            outs = [[lk.out_word() for lk in links[d]] for d in range(dims)]
            readies = [[lk.in_ready() for lk in links[d]] for d in range(dims)]
            txs, taken = [], []
            for i, m in enumerate(models):
                tx, rx_taken = m.ring([outs[d][prev[d][i]] for d in range(dims)],
                                      [readies[d][i] for d in range(dims)])
                txs.append(tx)
                taken.append(rx_taken)
            for d in range(dims):
                for i, lk in enumerate(links[d]):
                    lk.step(txs[i][d], taken[nxt[d][i]][d])
        else:
            for m in models:
                m.ring(none, unready)
        for m in models:
            m.post(cycle)
        cycle += 1
    return SystemTiming(max(m.cycles for m in models), [m.result() for m in models])



def trace_depth(npu: NpuConfig) -> int:
    """Entries a chip's trace buffer holds (``hw.tile.ports.trace_depth``): two per
    instruction word."""
    return 2 * npu.imem_words


def trace_entries(npu: NpuConfig, entries) -> dict:
    """A chip's trace as its host port reads it back (``sim.rtl.chip_runner.read_trace``):
    ``{"entries": [(cycle, busy)], "overflow"}``, the entries beyond the buffer lost."""
    depth = trace_depth(npu)
    return {"entries": list(entries[:depth]), "overflow": len(entries) > depth}
