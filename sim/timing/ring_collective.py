"""One ring collective's per-member busy cycles by a word-level recurrence, equal to the cycle
model's.

:func:`sim.timing.cycle.time_programs` walks a collective cycle by cycle: every chip's
sequencer, scratchpad ports and ring side, and every link's ``latency`` registers, each cycle.
On a ring of 64 chips with 200-cycle links one collective costs a minute of Python; the
launch-level model (:mod:`sim.timing.launch`) times every new shape (group, descriptors,
members' launch skews) of a plan's collectives. :func:`member_busy` gives the same busy cycles
from the members' words, one at a time, with the rules of the cycle model's units
(:mod:`sim.timing.ring`, the read and write ports of :mod:`sim.timing.cycle`):

- **read port** (RD6, :data:`~hw.spec.timing.chip.READ_FIFO_DEPTH` words counting the read in
  flight, its word on the FIFO's output :data:`~hw.spec.timing.chip.READ_LATENCY` cycles after
  the grant): scratchpad word ``k`` is granted at ``max(g[k-1] + 1, p[k-D] + 1, launch + 1)``
  and popped into the packer at ``max(g[k] + READ_LATENCY, p[k-1] + 1)``, the first word of an
  engine word not before the engine took the previous one (the packer holds one engine word
  of ``r`` scratchpad words); the engine word is valid the cycle after its last pop;
- **engine** (:class:`~sim.timing.ring.CollectiveModel`): at most one word a cycle, the step
  schedule of :func:`hw.spec.collective.steps` in order (a step of no words takes a cycle),
  a word fires once its local word is valid, its transmit buffer has room
  (:data:`~hw.spec.isa.COLL_FIFO_WORDS`), the unpacker has written the previous output word's
  ``r`` scratchpad words (one a cycle from the cycle after it fired), and its ring word is
  there: ``max(ready, arrival)`` (straight from the link in the cycle it arrives if the engine
  waits, else from the receive buffer);
- **link** (:class:`~sim.timing.ring.LinkModel`, ``c`` flits a word, ``a`` registers of a
  main and a skid register each): flit ``f`` enters the first register one cycle after flit
  ``f - 1``, not before flit ``f - 2a`` left the last register ``a`` cycles earlier (a stalled
  link holds two flits a register), a word's first flit not before the word is offered (the
  cycle after it fired, and after the word before left the transmit buffer); the serialiser
  takes a word in the cycle the last flit of the one before enters, or, idle, with its first
  flit. A flit leaves the last register ``a`` cycles after it entered and a cycle after the
  flit before at the earliest; a word's last flit when the router takes the word: a member's
  while its receive buffer has room (:data:`~hw.spec.isa.COLL_FIFO_WORDS`: the word 64
  before has been taken by the engine), a chip outside the group in the cycle its own link
  takes it (forwarding);
- **busy**: from the cycle after the COLL's launch until the engine has fired its last word,
  written the last output word, emptied its transmit buffer (the cycle after it ends) and its
  generators have passed their last word.

The members' engines, their routers and the chips between them are generators, each run as far
as the others' words allow (a word's cycles depend only on earlier cycles, so one of them
always moves). It is exact: ``tests/sim/timing/test_ring_collective.py`` compares it with the
cycle model on rings of 2 to 16 chips, sub-groups, strided groups, every kind, op, width and
length, chunks, links of their own, launches skewed by up to thousands of cycles (stalled
links). It returns None (the caller then runs the cycle model) for

- the send/recv and barrier kinds of COLL;
- RD6 or WR3 covering other words than the schedule reads and writes (the chip hangs);
- a group that never ends (the same).

Groups whose rings share links (several on one ring at once) are not modelled here: the
routers forward others' words before their own.
"""

from __future__ import annotations

from hw.spec import NpuConfig
from hw.spec.collective import Kind, command_from_registers, step_words, steps
from hw.spec.isa import ADDR_LEVELS, COLL_FIFO_WORDS
from hw.spec.timing.chip import READ_FIFO_DEPTH, READ_LATENCY
from hw.spec.topology import DimLink

__all__ = ["member_busy", "ring_constants"]

_NEVER = -(1 << 60)


def ring_constants(npu: NpuConfig, link: DimLink | None = None) -> tuple[int, int, int]:
    """``(r, c, a)``: scratchpad words an engine word holds, flits a word takes on the link
    and the link's registers (``link``, or the NPU's ``link_*``)."""
    wbytes = npu.ring_word_bytes
    width = npu.link_bytes_per_cycle if link is None else link.bytes_per_cycle
    latency = npu.link_latency_cycles if link is None else link.latency_cycles
    if wbytes % width:
        raise ValueError(f"link_bytes_per_cycle={width} does not divide the chip's ring word "
                         f"of {wbytes} bytes (a word is whole flits)")
    return wbytes // npu.array_size, wbytes // width, latency


def _gen_words(regs: dict, gen: str) -> int:
    words = 1
    for lv in range(ADDR_LEVELS):
        words *= max(1, regs.get(f"{gen}.n{lv}", 0))
    return words


class _Member:
    """One member's state through its schedule."""

    __slots__ = ("launch", "sched", "words", "r", "g", "p", "rd_words", "wr_words",
                 "fire", "local_fire", "local_n", "last_out", "tx_acc", "rx_fire", "taken")

    def __init__(self, launch, sched, words, r, rd_words, wr_words):
        self.launch = launch
        self.sched = sched
        self.words = words
        self.r = r
        self.g = []                 # grant cycle of each scratchpad word RD6 reads
        self.p = []                 # its pop cycle (into the packer)
        self.rd_words = rd_words
        self.wr_words = wr_words
        self.fire = launch          # the last fire (the engine runs from launch + 1)
        self.local_fire = _NEVER    # the last fire that took a local word
        self.local_n = 0
        self.last_out = _NEVER      # the last fire that wrote a word out
        self.tx_acc = []            # cycle each transmitted word left the transmit buffer
        self.rx_fire = []           # fire cycle of each word taken from the ring
        self.taken = []             # cycle the router took each word from the link


def _local_ready(m: _Member, depth: int) -> int:
    """Cycle the member's next local engine word is valid (its packer full), given the fire
    that took the previous one."""
    r = m.r
    g, p = m.g, m.p
    first = m.local_n * r
    for k in range(first, first + r):
        gk = max(g[k - 1] + 1 if k else m.launch + 1,
                 p[k - depth] + 1 if k >= depth else _NEVER)
        pk = max(gk + READ_LATENCY, p[k - 1] + 1 if k else _NEVER)
        if k == first:
            pk = max(pk, m.local_fire)
        g.append(gk)
        p.append(pk)
    return p[-1] + 1


class _Link:
    """One link's flits: the cycle each entered its first register (``enter``) and the cycle
    it left the last one (``leave``: taken by the next router, or the deserialiser)."""

    __slots__ = ("enter", "leave")

    def __init__(self):
        self.enter = []
        self.leave = []


def _send(link: _Link, offer: int, c: int, a: int):
    """Offers a word to ``link`` from cycle ``offer``: appends its flits' entries and returns
    the cycle the link takes it (its transmit buffer pops). A generator: yields while a flit
    waits on a ``leave`` not known yet.

    A register passes one flit a cycle and holds two (its main and skid registers); it takes
    one while its skid is empty, so flit ``f`` enters once flit ``f - 2a`` has left the last
    register ``a`` cycles before (the chain full behind a stalled word), one cycle after flit
    ``f - 1``, and a word's first flit not before it is offered. The serialiser takes the next
    word in the cycle the last flit of the one before enters, or, idle, with its first flit."""
    enter = link.enter
    first = len(enter)
    back = 2 * a
    for q in range(c):
        f = first + q
        t = enter[f - 1] + 1 if f else _NEVER
        if f >= back:
            while len(link.leave) <= f - back:
                yield
            t = max(t, link.leave[f - back] + a)
        if q == 0:
            t = max(t, offer)
        enter.append(t)
    if c > 1 and first and offer <= enter[first - 1]:
        return enter[first - 1]
    return enter[first]


def _arrive(link: _Link, c: int, a: int):
    """The cycle the next word on ``link`` is on its last register, whole (its last flit
    there and the others taken by the deserialiser): appends the leaves of its flits but the
    last (the router's to decide). A generator: yields while a flit has not entered."""
    leave = link.leave
    first = len(leave)
    for q in range(c):
        f = first + q
        while len(link.enter) <= f:
            yield
        t = link.enter[f] + a
        if f:
            t = max(t, leave[f - 1] + 1)
        if q == c - 1:
            return t
        leave.append(t)


def _forward(inlink: _Link, outlink: _Link, words: int, c: int, a: int):
    """A chip between two members: its router forwards each word to its own link in the
    cycle that link takes it."""
    for _ in range(words):
        at = yield from _arrive(inlink, c, a)
        taken = yield from _send(outlink, at, c, a)
        inlink.leave.append(taken)


def _receive(mem: _Member, inlink: _Link, words: int, c: int, a: int):
    """A member's router: it takes each word from the link into the engine (straight, or into
    its receive buffer) while the buffer has room, whatever the engine is doing."""
    for w in range(words):
        at = yield from _arrive(inlink, c, a)
        if w >= COLL_FIFO_WORDS:
            while len(mem.rx_fire) <= w - COLL_FIFO_WORDS:
                yield
            at = max(at, mem.rx_fire[w - COLL_FIFO_WORDS] + 1)
        inlink.leave.append(at)
        mem.taken.append(at)


def _run(mem: _Member, outlink: _Link, c: int, a: int, r: int):
    """One member's schedule, word by word."""
    for s, st in enumerate(mem.sched):
        count = mem.words[s]
        if count == 0:
            mem.fire += 1                   # a step of no words: one cycle of the engine's
            continue
        for _ in range(count):
            t = max(mem.fire + 1, mem.last_out + r)
            if st.local:
                t = max(t, _local_ready(mem, READ_FIFO_DEPTH))
            if st.tx:
                j = len(mem.tx_acc)
                if j >= COLL_FIFO_WORDS:
                    t = max(t, mem.tx_acc[j - COLL_FIFO_WORDS] + 1)
            if st.rx:
                w = len(mem.rx_fire)
                while len(mem.taken) <= w:
                    yield
                t = max(t, mem.taken[w])
                mem.rx_fire.append(t)
            if st.local:
                mem.local_fire = t
                mem.local_n += 1
            if st.tx:
                offer = t + 1
                if mem.tx_acc:
                    offer = max(offer, mem.tx_acc[-1] + 1)
                taken = yield from _send(outlink, offer, c, a)
                mem.tx_acc.append(taken)
            if st.out:
                mem.last_out = t
            mem.fire = t


def member_busy(npu: NpuConfig, chips: int, where: dict, member_regs: dict, launches: dict,
                link: DimLink | None = None) -> dict | None:
    """Busy cycles of each member of one collective on a ring of ``chips`` chips, or None when
    outside the conditions the model is exact under (module docstring).

    ``where``: each member's position on the ring; ``member_regs``: each member's ``CO_*``,
    ``RD6.*`` and ``WR3.*`` registers (its COLL's); ``launches``: the cycle each member's COLL
    is launched in (any origin); ``link``: the ring's links (None: the NPU's). Members are
    the keys of ``where``; the group and each one's rank come from its registers."""
    r, c, a = ring_constants(npu, link)
    wbytes = npu.ring_word_bytes
    cmds = {}
    for m, regs in member_regs.items():
        cmd = command_from_registers(regs)
        if cmd.rank is None:
            raise ValueError(f"member {m}'s COLL has CO_RANK={regs['CO_RANK']}: outside "
                             "its group")
        cmds[m] = cmd
    group = next(iter(cmds.values())).group
    if group.kind not in (Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_GATHER):
        return None
    n = group.count
    by_rank = [None] * n
    for m, cmd in cmds.items():
        if not cmd.group == group or by_rank[cmd.rank] is not None:
            raise ValueError(f"member {m}'s COLL is not the group's ({cmd.describe()})")
        by_rank[cmd.rank] = m
    if None in by_rank:
        ranks = sorted(cmd.rank for cmd in cmds.values())
        raise ValueError(f"the group of {n} has members at ranks {ranks} only")
    members = []
    for rank, m in enumerate(by_rank):
        sched = steps(group, rank)
        words = [step_words(group, st, wbytes) for st in sched]
        regs = member_regs[m]
        mem = _Member(launches[m], sched, words, r, _gen_words(regs, "RD6"),
                      _gen_words(regs, "WR3"))
        local = sum(w for st, w in zip(sched, words, strict=True) if st.local)
        out = sum(w for st, w in zip(sched, words, strict=True) if st.out)
        if mem.rd_words != local * r or mem.wr_words != out * r:
            return None
        members.append(mem)
    # links[p]: the link leaving ring position p. Each member runs its schedule; each chip
    # between two members forwards the words of the first.
    links = {}
    runs = []
    for k, mem in enumerate(members):
        here, there = where[by_rank[k]], where[by_rank[(k + 1) % n]]
        runs.append(_run(mem, links.setdefault(here, _Link()), c, a, r))
        got = sum(w for st, w in zip(mem.sched, mem.words, strict=True) if st.rx)
        if got:
            runs.append(_receive(mem, links.setdefault((here - 1) % chips, _Link()), got,
                                 c, a))
        sent = sum(w for st, w in zip(mem.sched, mem.words, strict=True) if st.tx)
        for pos in range(here + 1, here + (there - here) % chips):
            runs.append(_forward(links.setdefault((pos - 1) % chips, _Link()),
                                 links.setdefault(pos % chips, _Link()), sent, c, a))
    # Every run goes as far as the others' words allow; one round moves one of them at
    # least, or the collective never ends (the cycle model then says where it hangs).
    def moved():
        return sum(len(x.enter) + len(x.leave) for x in links.values()) + \
            sum(m.fire + len(m.taken) + len(m.rx_fire) for m in members)

    while runs:
        before = moved()
        left = []
        for run in runs:
            try:
                next(run)
                left.append(run)
            except StopIteration:
                pass
        if len(left) == len(runs) and moved() == before:
            return None
        runs = left
    out = {}
    for k, mem in enumerate(members):
        # The engine ends the cycle after its step counter passed its last step, its last
        # output word was written and its transmit buffer emptied; the unit is busy until then
        # and until its generators passed their last words.
        done = max(mem.fire + 1, mem.last_out + r + 1)
        if mem.tx_acc:
            done = max(done, mem.tx_acc[-1] + 1)
        fall = max(done + 1, mem.last_out + r + 1)
        if mem.g:
            fall = max(fall, mem.g[-1] + 1, mem.local_fire + 1)
        out[by_rank[k]] = fall - (mem.launch + 1)
    return out
