"""One ring collective's per-member busy cycles by a word-level recurrence, equal to the cycle
model's.

:func:`sim.timing.cycle.time_programs` walks a collective cycle by cycle: every chip's
sequencer, scratchpad ports and ring side, and every link's ``latency`` registers, each cycle.
On a ring of 64 chips with 200-cycle links one collective costs a minute of Python; the
launch-level model (:mod:`sim.timing.launch`) times every new shape (group, descriptors,
members' launch skews) of a plan's collectives. :func:`member_busy` gives the same busy cycles
from one pass over the members' words, step by step, with the rules of the cycle model's units
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
- **link** (:class:`~sim.timing.ring.LinkModel`, ``c`` flits a word, ``a`` registers): a word
  offered at ``o`` (the cycle after it fired, and after the previous word left the transmit
  buffer) is taken at ``max(o, e)`` and its flits enter at ``max(o, e + 1)`` onwards, ``e`` the
  previous word's last flit (the serialiser holds one word while the last flits of the one
  before go); it is on the next router ``a`` cycles after its last flit; a chip outside the
  group forwards it in that cycle (its link is then always free: words come ``c`` or more
  cycles apart), adding ``c - 1 + a`` a hop;
- **busy**: from the cycle after the COLL's launch until the engine has fired its last word,
  written the last output word, emptied its transmit buffer (the cycle after it ends) and its
  generators have passed their last word.

It is exact (``tests/sim/timing/test_ring_collective.py`` compares it with the cycle model on
rings of 2 to 16 chips, sub-groups, every kind, op, width and length, chunks, skewed launches)
under conditions it checks, returning None otherwise (the caller then runs the cycle model):

- one group on its ring (groups that share links are not modelled: the routers' priority of
  forwarded words over local ones);
- an all-reduce, reduce-scatter or all-gather (not send/recv or the barrier);
- RD6 and WR3 cover exactly the words the schedule reads and writes (else the chip hangs);
- no receive buffer fills (a word that finds :data:`~hw.spec.isa.COLL_FIFO_WORDS` words
  waiting stalls its link: only a member launching a group's worth of blocks after its
  upstream neighbour).
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

    __slots__ = ("launch", "sched", "words", "r", "g", "p", "k", "rd_words", "wr_words",
                 "fire", "local_fire", "local_n", "out_n", "last_out",
                 "tx_acc", "e", "arrive", "rx_fire", "rx_n", "step")

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
        self.out_n = 0
        self.last_out = _NEVER
        self.tx_acc = []            # cycle each transmitted word left the transmit buffer
        self.e = _NEVER             # the link's last flit so far
        self.arrive = []            # cycle each transmitted word reaches the next member
        self.rx_fire = []           # fire cycle of each word taken from the ring
        self.rx_n = 0
        self.step = 0


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
    hop = c - 1 + a
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
    # Hops from each member to the next: the extra ones forwarded by chips between.
    extra = [((where[by_rank[(k + 1) % n]] - where[by_rank[k]]) % chips - 1) * hop
             for k in range(n)]
    total = len(members[0].sched)
    for s in range(total):
        for k, mem in enumerate(members):
            st = mem.sched[s]
            count = mem.words[s]
            if count == 0:
                # A step of no words: one cycle of the engine's.
                mem.fire += 1
                continue
            up = members[k - 1]
            for _ in range(count):
                t = max(mem.fire + 1, mem.last_out + r)
                if st.local:
                    t = max(t, _local_ready(mem, READ_FIFO_DEPTH))
                if st.tx:
                    j = len(mem.tx_acc)
                    if j >= COLL_FIFO_WORDS:
                        t = max(t, mem.tx_acc[j - COLL_FIFO_WORDS] + 1)
                if st.rx:
                    w = mem.rx_n
                    arrive = up.arrive[w]
                    if w >= COLL_FIFO_WORDS and mem.rx_fire[w - COLL_FIFO_WORDS] >= arrive:
                        return None     # the receive buffer is full: the link stalls
                    t = max(t, arrive)
                    mem.rx_fire.append(t)
                    mem.rx_n += 1
                if st.local:
                    mem.local_fire = t
                    mem.local_n += 1
                if st.tx:
                    offer = t + 1
                    if mem.tx_acc:
                        offer = max(offer, mem.tx_acc[-1] + 1)
                    mem.tx_acc.append(max(offer, mem.e))
                    mem.e = max(offer, mem.e + 1) + c - 1
                    mem.arrive.append(mem.e + a + extra[k])
                if st.out:
                    mem.last_out = t
                    mem.out_n += 1
                mem.fire = t
    out = {}
    for k, mem in enumerate(members):
        # mem.fire: the cycle the engine's step counter passed its last step, less one.
        done = max(mem.fire + 1, mem.last_out + r + 1)
        if mem.tx_acc:
            done = max(done, mem.tx_acc[-1] + 1)
        fall = done + 1
        if mem.g:
            fall = max(fall, mem.g[-1] + 1, mem.local_fire + 1)
        fall = max(fall, mem.last_out + r + 1)
        out[by_rank[k]] = fall - (mem.launch + 1)
    return out
