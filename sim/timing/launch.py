"""A launch-level timing model: the cycles of programs far too long for the cycle model.

:func:`time_programs_fast` follows the sequencer's rules (one instruction per cycle; a launch
waits for its unit, ATTN and VEC for each other; ``WAIT``; ``HALT``) with one duration per
launch instead of a cycle-by-cycle walk, so its cost grows with the number of instructions,
not of cycles: a Llama-2-7B-sized program on the ``lpu-like`` preset takes well under a second.

A launch's duration (busy cycles, from the cycle after the launch to the cycle its unit is idle)
comes from the chip-context closed forms of :mod:`hw.spec.timing.chip` when they are exact
(every stream of the launch in a bank of its own, or the same-bank cases they model), and
otherwise from the cycle model (:mod:`sim.timing.cycle`) run on the launch alone: exactly when the
launch is short, or on the launch cut to a few repeats (folds, rows, queries, message words)
and extrapolated along its steady state; the cycle model walks a launch once per pattern of
bank collisions (:meth:`LaunchTimer._bank_pattern`). A collective is timed from each member's
own launch once the last member has launched, alone on its ring by the word-level recurrence of
:mod:`sim.timing.ring_collective` (equal to the cycle model), or by the cycle model where that
does not apply (groups sharing a ring's links at once); a SEND/RECV pair when both sides have
launched.

What it leaves out is what happens *between* launches on different units: a launch that runs
beside another (LOAD_LUT beside the FFN1 matmul, a SEND/RECV beside a stage's compute) is timed
as if it had the scratchpad's banks to itself, and a collective as if every member started in
the same cycle. On the programs the compiler emits this costs a few cycles per such overlap;
``sim/benches/plan.py`` measures it against the cycle model and the RTL.
"""

from __future__ import annotations

import numpy as np

from hw.spec import NpuConfig
from hw.spec.attention import FLAG_INTERLEAVED, flags_halo, launch_words
from hw.spec.collective import command_from_registers, walk_group
from hw.spec.formats import OutMode, out_words
from hw.spec.isa import (
    ADDR_LEVELS,
    BUSY_COUNTERS,
    COLL_GENS,
    REG_INDEX,
    REGS,
    WRAP_GENS,
    IsaError,
    LoopState,
    Op,
    Unit,
    decode,
)
from hw.spec.memory import bank_of, packed_block_words
from hw.spec.timing import attention as attn_timing
from hw.spec.timing import chip as chip_timing
from hw.spec.timing import vector as vec_timing
from hw.spec.topology import DimLink, Topology, system_topology
from hw.spec.vector import VectorOp, twin_of
from hw.spec.vector_engine import VecFlags, uses_a, uses_b, uses_records

from ..golden.scratchpad import AddressError, addr_sequence
from ..iss.errors import IssError, begin_loop, loop_iteration
from .cycle import ChipTiming, SystemTiming, time_programs
from .ring_collective import member_busy

__all__ = ["LaunchTimer", "time_programs_fast"]

_UNIT_BIT = {Op.MATMUL: 0, Op.ATTN: 1, Op.VEC: 2, Op.COLL: 3, Op.SEND: 4, Op.RECV: 5}
_GENS_OF = {Op.MATMUL: ("RD0", "RD1", "RD2", "WR0"), Op.ATTN: ("RD3", "RD4", "RD5", "WR1"),
            Op.VEC: ("RD3", "RD4", "RD5", "WR1", "WR2"), Op.COLL: ("RD6", "WR3"),
            Op.SEND: ("RD7",), Op.RECV: ("WR4",)}
_UNIT_REGS = {Op.MATMUL: ("MM_K", "MM_FOLDS", "MM_MODE", "MM_A_UNSIGNED", "MM_B_ROWS",
                          "MM_B_BLOCKS", "MM_B_LAST"),
              Op.ATTN: ("AT_QUERIES", "AT_KEYS", "AT_Q_POS", "AT_K_POS", "AT_WINDOW",
                        "AT_FLAGS", "AT_D_HEAD", "AT_Q_LANE", "AT_K_LANE", "AT_V_LANE",
                        "AT_O_LANE"),
              Op.VEC: ("VU_OP", "VU_ROWS", "VU_LEN", "VU_N", "VU_FLAGS"),
              Op.COLL: ("CO_KIND", "CO_OP", "CO_WIDTH", "CO_LEN", "CO_CHIPS", "CO_RANK",
                        "CO_NEXT", "CO_COUNT"),
              Op.SEND: ("SR_DEST",), Op.RECV: ("SR_SRC",)}
#: The walk's slot of collective engine 1 (a torus's chip): busy as the collective unit (bit 3).
_COLL1 = 6
#: Launches shorter than this many cycles are timed exactly, by the cycle model alone.
EXACT_CYCLES = 4000
#: Longer launches outside the exact closed forms are cut to a few repeats and simulated up
#: to this many cycles; beyond, approximated (:meth:`LaunchTimer.approximate`).
EXTRAPOLATE_CYCLES = 100_000


def _gen_regs(gen):
    names = [f"{gen}.base"] + [f"{gen}.{x}{lv}" for x in "ns" for lv in range(ADDR_LEVELS)]
    if gen in WRAP_GENS:
        names += [f"{gen}.wrap", f"{gen}.off"]
    return names


_REGS_OF = {op: tuple(r for g in _GENS_OF[op] for r in _gen_regs(g)) + _UNIT_REGS[op]
            for op in _GENS_OF}


def _extent(regs, gen):
    """(first word, last word, words) a generator's descriptor covers (wrap: its buffer)."""
    base = regs.get(f"{gen}.base", 0)
    lo = hi = 0
    words = 1
    for lv in range(ADDR_LEVELS):
        count = max(1, regs.get(f"{gen}.n{lv}", 0))
        step = regs.get(f"{gen}.s{lv}", 0) * (count - 1)
        lo, hi = lo + min(0, step), hi + max(0, step)
        words *= count
    if gen in WRAP_GENS and regs.get(f"{gen}.wrap", 0):
        return base, base + regs[f"{gen}.wrap"] - 1, words
    return base + lo, base + hi, words


class LaunchTimer:
    """Busy cycles of single launches in a chip of ``npu`` (memoised by their registers)."""

    def __init__(self, npu: NpuConfig):
        self.npu = npu
        self.n = npu.array_size
        self._cache = {}
        self._sims = {}
        self.bank_words = npu.bank_words

    # --- exact: the cycle model on the launch alone ---------------------------------------
    def _program(self, op, regs):
        words = []
        for name in _REGS_OF[op]:
            words.append(_set(name, regs.get(name, 0)))
        words.append(Op(op) | 0)
        words.append(int(Op.HALT))
        return words

    def simulate(self, op, regs) -> int:
        """Busy cycles of the launch with ``regs`` run alone (the cycle model), once per
        :meth:`_bank_pattern`."""
        key = self._bank_pattern(op, regs)
        got = self._sims.get(key) if key is not None else None
        if got is None:
            t = time_programs(self.npu, [self._program(op, regs)], ring=False)
            got = _busy_span(t.chips[0].trace, _UNIT_BIT[op], t.chips[0].cycles)
            if key is not None:
                self._sims[key] = got
        return got

    def _bank_pattern(self, op, regs):
        """What the cycle model's timing of a launch alone depends on: its unit's registers
        and the banks each of its generators walks, one per cycle, the banks renamed in the
        order they first appear (the scratchpad's ports only compare banks: the same launch on
        other addresses with the same pattern of bank collisions takes the same cycles).
        None for a walk the cycle model rejects (it then names the error)."""
        walks = []
        for g in _GENS_OF[op]:
            try:
                addrs = addr_sequence(
                    regs.get(f"{g}.base", 0),
                    [regs.get(f"{g}.n{lv}", 0) for lv in range(ADDR_LEVELS)],
                    [regs.get(f"{g}.s{lv}", 0) for lv in range(ADDR_LEVELS)],
                    self.npu.sram_addr_bits, regs.get(f"{g}.wrap", 0) if g in WRAP_GENS else 0,
                    regs.get(f"{g}.off", 0) if g in WRAP_GENS else 0)
            except (AddressError, ValueError):
                return None
            walks.append(addrs)
        sizes = [len(w) for w in walks]
        if self.npu.sram_banks == 1:
            names = np.zeros(sum(sizes), dtype=np.int64)
        else:
            banks = bank_of(np.concatenate(walks), self.bank_words)
            _, first, inverse = np.unique(banks, return_index=True, return_inverse=True)
            order = np.empty(len(first), dtype=np.int64)
            order[np.argsort(first)] = np.arange(len(first))
            names = order[inverse.reshape(-1)]
        return (op, tuple(regs.get(name, 0) for name in _UNIT_REGS[op]), tuple(sizes),
                names.tobytes())

    # --- the launch's banks ---------------------------------------------------------------
    def _banks(self, regs, gen):
        lo, hi, _ = _extent(regs, gen)
        if self.npu.sram_banks == 1:
            return (0, 0)
        words = self.npu.sram_words
        return bank_of(lo % words, self.bank_words), bank_of(hi % words, self.bank_words)

    def _vec_closed_exact(self, regs) -> bool:
        """Whether the vector engine's chip-context closed form is exact for a ``VEC`` launch
        of any length: no two of its read streams in one bank, nor two of its write streams.
        A bank serves one read port and, independently, one write port a cycle, so a read and
        a write in one bank do not meet. The same-bank cases the closed form also models
        are off by a few cycles on launches of a few rows, so those stay with the cycle
        model here. ``tests/sim/timing/test_launch.py`` places the streams in every way over
        three banks."""
        vop = twin_of(regs["VU_OP"])
        flags = VecFlags.decode(regs["VU_FLAGS"])
        reads = [g for g, used in (("RD3", uses_a(vop, flags.pairs)),
                                   ("RD4", uses_b(vop, flags.per_channel)),
                                   ("RD5", uses_records(vop, flags.pairs))) if used]
        writes = [g for g, used in (("WR1", flags.wr_data), ("WR2", flags.wr_q)) if used]
        return not any(self._share(regs, a, b) for gens in (reads, writes)
                       for i, a in enumerate(gens) for b in gens[i + 1:])

    def _share(self, regs, a, b) -> bool:
        (a0, a1), (b0, b1) = self._banks(regs, a), self._banks(regs, b)
        return a0 <= b1 and b0 <= a1

    # --- durations ------------------------------------------------------------------------
    def duration(self, op, regs: dict) -> int:
        key = (op,) + tuple(regs.get(name, 0) for name in _REGS_OF[op])
        got = self._cache.get(key)
        if got is None:
            est = self.estimate(op, regs)
            if est is not None and est > EXACT_CYCLES:
                # Long launches by shape and relative bank layout: every layer's copy of a
                # launch is timed once.
                shape = self._signature(op, regs)
                got = self._cache.get(shape)
                if got is None:
                    got = self._cache[shape] = self._duration(op, regs)
            else:
                got = self._duration(op, regs)
            self._cache[key] = got
        return got

    def _signature(self, op, regs):
        gens = [g for g in _GENS_OF[op] if regs.get(f"{g}.n0")]
        banks = {g: self._banks(regs, g) for g in gens}
        ref = min((b[0] for b in banks.values()), default=0)
        parts = [("sig", op)] + [regs.get(name, 0) for name in _UNIT_REGS[op]]
        for g in gens:
            parts.append((g, tuple(regs.get(f"{g}.{x}{lv}", 0) for x in "ns"
                                   for lv in range(ADDR_LEVELS)),
                          banks[g][0] - ref, banks[g][1] - ref))
        return tuple(parts)

    def _duration(self, op, regs) -> int:
        est = self.estimate(op, regs)
        if est is None or est <= EXACT_CYCLES:
            closed = self.closed_form(op, regs) \
                if op is Op.VEC and self._vec_closed_exact(regs) else None
            return self.simulate(op, regs) if closed is None else closed
        closed = self.closed_form(op, regs)
        if closed is not None:
            return closed
        if est > EXTRAPOLATE_CYCLES:
            approx = self.approximate(op, regs)
            if approx is not None:
                return approx
        return self._extrapolate(op, regs)

    def approximate(self, op, regs) -> int | None:
        """Launches too long to cut and simulate, outside the exact closed forms' domain: a
        matmul whose A and parameters share a bank, or whose K is so short that the next
        fold's parameters stall the array (:func:`hw.spec.timing.chip.matmul_approx`)."""
        if op is not Op.MATMUL:
            return None
        ow = out_words(OutMode(regs["MM_MODE"]))
        shared = self._share(regs, "RD0", "RD2") or self._share(regs, "RD1", "RD2") or \
            self._share(regs, "RD0", "RD1")
        return chip_timing.matmul_approx(self.n, regs["MM_K"], regs["MM_FOLDS"], ow,
                                         shared=shared)

    def estimate(self, op, regs) -> int | None:
        """Roughly the launch's cycles (to choose how to time it)."""
        if op is Op.MATMUL:
            return regs["MM_K"] * regs["MM_FOLDS"]
        if op is Op.VEC:
            lanes = self.n
            return regs["VU_ROWS"] * (4 * -(-regs["VU_LEN"] // lanes) + 12)
        if op is Op.ATTN:
            return attn_timing.launch_cycles(regs, window=self.npu.attn_window,
                                             length=self.npu.softmax_len, size=self.n,
                                             d_head=self.npu.d_head_max,
                                             pipeline=self.npu.attention_pipeline) \
                if regs["AT_QUERIES"] + regs["AT_KEYS"] < 4096 else \
                regs["AT_QUERIES"] * (2 * self.npu.attn_window + 5 * self.npu.softmax_len)
        if op in (Op.SEND, Op.RECV):
            return None
        return None

    def closed_form(self, op, regs) -> int | None:
        """The chip-context closed form when it is exact for these registers, else None."""
        n = self.n
        if op is Op.MATMUL:
            k, folds = regs["MM_K"], regs["MM_FOLDS"]
            ow = out_words(OutMode(regs["MM_MODE"]))
            if self._share(regs, "RD0", "RD2") or self._share(regs, "RD1", "RD2") or \
                    self._share(regs, "RD0", "RD1"):
                return None
            if k < chip_timing.matmul_k_min(n, ow):
                return None
            return chip_timing.matmul_cycles(n, k, folds, ow)
        if op is Op.VEC:
            vop = twin_of(regs["VU_OP"])     # RMSNorm's ops are LayerNorm's
            flags = VecFlags.decode(regs["VU_FLAGS"])
            pipeline = self.npu.vector_pipeline
            base = vec_timing.launch_cycles(vop, rows=regs["VU_ROWS"], length=regs["VU_LEN"],
                                            lanes=n, flags=flags, pipeline=pipeline)
            shared = uses_b(vop, flags.per_channel) and self._share(regs, "RD3", "RD4")
            both = flags.wr_data and flags.wr_q and vop in (VectorOp.LN, VectorOp.LN_APPLY)
            if vop not in (VectorOp.LN, VectorOp.LN_APPLY, VectorOp.ADD, VectorOp.BIAS,
                           VectorOp.REQUANT, VectorOp.RELU, VectorOp.LUT):
                return None
            return chip_timing.vector_cycles(
                vop, base, rows=regs["VU_ROWS"], length=regs["VU_LEN"], lanes=n, flags=flags,
                shared=shared, outputs_shared=both and self._share(regs, "WR1", "WR2"),
                pipeline=pipeline)
        if op is Op.ATTN:
            flags = regs["AT_FLAGS"]
            shared = self._share(regs, "RD3", "RD4") or self._share(regs, "RD4", "RD5") or \
                self._share(regs, "RD3", "RD5")
            if flags & FLAG_INTERLEAVED and shared != (
                    self._share(regs, "RD3", "RD4") and self._share(regs, "RD4", "RD5")):
                return None                 # two of the three share a bank: not modelled
            words = launch_words(regs, n)
            if shared and flags & FLAG_INTERLEAVED and len(set(words.values())) > 1:
                return None                 # rows of different lengths in one bank
            base = attn_timing.preload_cycles(regs, window=self.npu.attn_window,
                                              length=self.npu.softmax_len, size=n,
                                              pipeline=self.npu.attention_pipeline)
            return chip_timing.attention_cycles(
                base, keys=regs["AT_KEYS"], words=words, shared=shared,
                interleaved=bool(flags & FLAG_INTERLEAVED), halo=flags_halo(flags))
        return None

    def _extrapolate(self, op, regs) -> int:
        """The launch cut to a few repeats, timed by the cycle model, extended linearly."""
        points = []
        for r in (4, 6, 8):
            cut = _cut(op, regs, r, self.n)
            if cut is None:
                break
            reps, cregs = cut
            if points and reps <= points[-1][0]:
                continue
            points.append((reps, self.simulate(op, cregs)))
        full = _repeats(op, regs)
        if len(points) < 2 or full <= points[-1][0]:
            return self.simulate(op, regs)
        (r1, d1), (r2, d2) = points[-2], points[-1]
        slope = (d2 - d1) / (r2 - r1)
        return round(d2 + slope * (full - r2))


def _set(name, value):
    return int(Op.SET) | REG_INDEX[name] << 6 | (int(value) & ((1 << 48) - 1)) << 16


def _busy_span(trace, bit, end) -> int:
    """Cycles unit ``bit`` was busy (the launch's one interval) in a trace."""
    start = None
    for cycle, busy in list(trace) + [(end, 0)]:
        on = busy >> bit & 1
        if on and start is None:
            start = cycle
        elif not on and start is not None:
            return cycle - start
    return 0


def _repeats(op, regs) -> int:
    if op is Op.MATMUL:
        return regs["MM_FOLDS"]
    if op is Op.VEC:
        return regs["VU_ROWS"]
    if op is Op.ATTN:
        return regs["AT_QUERIES"]
    return 1


def _cut(op, regs, r, n):
    """``regs`` with the launch cut to about ``r`` repeats: ``(repeats, regs)`` or None."""
    out = dict(regs)
    if op is Op.MATMUL:
        folds = regs["MM_FOLDS"]
        nb, mb = max(1, regs["RD2.n1"]), max(1, regs["RD2.n2"])   # column blocks, row tiles
        if folds <= r:
            return None
        if nb >= r:
            nb2, mb2 = r, 1
        else:
            nb2, mb2 = nb, min(mb, -(-r // nb))
        f2 = nb2 * mb2
        for gen, lv_nb, lv_mb in (("RD0", 2, 3), ("RD2", 1, 2), ("WR0", 2, 3)):
            out[f"{gen}.n{lv_nb}"] = nb2
            out[f"{gen}.n{lv_mb}"] = mb2
        last = regs.get("MM_B_LAST", 0)
        if last:
            # A packed B walks its row tile's words in one run: fewer whole blocks, then the
            # packed one.
            kb = regs.get("MM_B_ROWS", 0) or regs["MM_K"]
            words = (nb2 - 1) * kb + packed_block_words(kb, last, n)
            out.update({"RD1.n0": words, "RD1.n1": 1, "RD1.s1": words, "RD1.n2": mb2,
                        "MM_B_BLOCKS": nb2})
        else:
            out["RD1.n1"], out["RD1.n2"] = nb2, mb2
        out["MM_FOLDS"] = f2
        return f2, out
    if op is Op.VEC:
        rows = regs["VU_ROWS"]
        if rows <= r:
            return None
        for gen in ("RD3", "RD4", "RD5", "WR1", "WR2"):
            if regs.get(f"{gen}.n1", 0) == rows:
                out[f"{gen}.n1"] = r
        out["VU_ROWS"] = r
        return r, out
    if op is Op.ATTN:
        q, s = regs["AT_QUERIES"], regs["AT_KEYS"]
        if q <= r:
            return None
        halo = flags_halo(regs["AT_FLAGS"]) if regs["AT_FLAGS"] & FLAG_INTERLEAVED else 0
        s2 = min(s, halo + r) if regs["AT_FLAGS"] & FLAG_INTERLEAVED else min(s, r)
        out["AT_QUERIES"], out["AT_KEYS"] = r, s2
        out["RD3.n1"] = out["RD4.n1"] = s2
        out["RD5.n1"] = out["WR1.n1"] = r
        return r, out
    return None


class _Chip:
    """One chip's walk through its program at launch level."""

    def __init__(self, program, chip):
        try:
            self.program = [decode(int(w)) for w in program]
        except IsaError as exc:
            raise IssError(f"chip {chip}: {exc}") from None
        self.chip = chip
        self.pc = 0
        self.loop = LoopState()
        self.t = 0                       # the cycle the next instruction may issue in
        # Per slot (the unit bits, then collective engine 1: _COLL1): the first cycle it is
        # idle (None: a posted launch pending) and its busy intervals.
        self.free = [0] * 7
        self.spans = [[] for _ in range(7)]
        self.regs = {}
        self.launches = []
        self.slots = []                  # each launch's slot
        self.cycles = None
        self.pending = {}                # slot -> posted operation

    def done_launch(self, slot, end):
        """The slot's posted launch (the last of its slot still open) ends at ``end``."""
        for launch, at in zip(reversed(self.launches), reversed(self.slots), strict=True):
            if at == slot and launch[3] is None:
                launch[3] = end
                return


def time_programs_fast(npu: NpuConfig, programs, *, timer: LaunchTimer | None = None,
                       topology: Topology | None = None) -> SystemTiming:
    """Cycles of ``programs`` at launch level (see the module docstring); per chip the busy
    counters and the trace are built from the launches' busy intervals. ``topology``: how
    the chips are connected (default :func:`hw.spec.topology.system_topology`: the NPU's, or a
    ring); on a torus each collective and transfer is timed on the rings of the dimensions it
    uses, with their links (:class:`_Comm`)."""
    timer = timer or LaunchTimer(npu)
    chips = [_Chip(p, i) for i, p in enumerate(programs)]
    if topology is None:
        topology = system_topology(npu, len(programs))
    elif topology.chips != len(programs):
        raise ValueError(f"{len(programs)} programs for the {topology.chips} chips of the "
                         f"{topology}")
    comm = _Comm(npu, timer, len(programs), topology)
    while True:
        moved = False
        for c in chips:
            moved |= _advance(c, timer, comm)
        met = comm.meet(chips)
        if all(c.cycles is not None for c in chips):
            break
        if not moved and not met:
            waiting = [f"chip {c.chip} at pc {c.pc}" for c in chips if c.cycles is None]
            raise IssError(f"timing: the programs cannot go on ({', '.join(waiting)})")
    out = [_chip_result(c) for c in chips]
    return SystemTiming(max(c.cycles for c in chips), out)


def _advance(c: _Chip, timer: LaunchTimer, comm) -> bool:
    moved = False
    prog = c.program
    while c.cycles is None:
        if c.pc >= len(prog):
            raise IssError(f"chip {c.chip}: program ended without HALT")
        insn = prog[c.pc]
        op = insn.op
        if op in (Op.SET, Op.ADD, Op.ADDX):
            if op is Op.ADDX:
                loop_iteration(c.loop, c.chip, c.pc)      # IssError outside a loop body
            if insn.reg < len(REGS):
                name = REGS[insn.reg]
                try:
                    c.regs[name] = c.loop.written(insn, c.regs.get(name, 0), c.pc)
                except IsaError as exc:
                    raise IssError(f"chip {c.chip} pc {c.pc}: {exc}") from None
            c.t += 1
        elif op is Op.LOOP:
            c.pc = begin_loop(c.loop, c.chip, c.pc, insn.value)
            c.t += 1
            moved = True
            continue
        elif op is Op.NOP:
            c.t += 1
        elif op in (Op.WAIT, Op.HALT):
            mask = int(Unit.ALL) if op is Op.HALT else insn.value
            units = [u for u in range(6) if mask >> u & 1] + \
                ([_COLL1] if mask & Unit.COLL else [])
            if any(c.free[u] is None for u in units):
                return moved
            at = max([c.t] + [c.free[u] for u in units])
            if op is Op.HALT:
                c.cycles = at + 1
            c.t = at + 1
        elif op in _UNIT_BIT:
            bit = _UNIT_BIT[op]
            if op is Op.COLL and comm.engines == 2 and insn.value & 1:
                bit = _COLL1
            deps = (1, 2) if op in (Op.ATTN, Op.VEC) else (bit,)
            if any(c.free[u] is None for u in deps):
                return moved
            at = max([c.t] + [c.free[u] for u in deps])
            c.launches.append([c.pc, op.name, at, None])
            c.slots.append(bit)
            if op in (Op.MATMUL, Op.ATTN, Op.VEC):
                dur = timer.duration(op, c.regs)
                c.spans[bit].append((at + 1, at + 1 + dur))
                c.free[bit] = at + 1 + dur
                c.launches[-1][3] = at + 1 + dur
            else:
                comm.post(c, op, at, bit)
            c.t = at + 1
        else:
            raise IssError(f"chip {c.chip} pc {c.pc}: {op.name} cannot be timed")
        c.pc = c.loop.next_pc(c.pc)
        moved = True
    return moved


class _Comm:
    """Posted COLL, SEND and RECV launches; they meet like the ISS's scheduler's.

    On a ring every collective and transfer is timed on the whole ring (the cycle model: its
    words pass the routers of the chips between). On a torus (``topology.is_torus``):

    - a group on one ring of the torus (a row's consecutive chips, dimension 0, or a
      column's, dimension 1: :meth:`~hw.spec.topology.Topology.ring_of`) is timed on that
      ring alone, with that dimension's links; rows' and columns' rings share no link, so
      groups that run at the same time are timed each on its own ring;
    - a group on no one ring of the torus is timed on a ring of all the chips with the
      slowest dimension's links (narrowest, deepest);
    - a transfer is timed along each dimension it moves in (x first, then y: the hops of
      :meth:`~hw.spec.topology.Topology.hops`) on that dimension's ring and links, the legs'
      cycles added (a message crossing both dimensions is counted as two transfers).
    """

    #: Time collectives by :mod:`sim.timing.ring_collective` where it is exact (False: by
    #: the cycle model always, which it equals; the tests compare the two).
    closed_form = True

    def __init__(self, npu, timer, chips, topology: Topology | None = None):
        self.npu = npu
        self.timer = timer
        self.chips = chips
        self.topology = topology or Topology.ring(chips)
        #: Collective engines per chip (a torus's chip has two).
        self.engines = 2 if self.topology.is_torus else 1
        #: A ring's links when its topology gives its own (None: the NPU's).
        self.ring_link = None if self.topology.is_torus or not self.topology.links else \
            self.topology.links[0]
        self._coll_cache = {}
        self._p2p_cache = {}

    def _placed(self, req):
        """``(chips, {member: sub-ring position}, first, link)``: the ring ``req`` is timed on."""
        topo = self.topology
        if not topo.is_torus:
            return req.chips, {m: m for m in req.members}, req.first, self.ring_link
        dim = 0 if req.count == 1 else topo.ring_of(req.members)
        if dim is None:
            links = [topo.link(d, self.npu) for d in range(2)]
            slow = DimLink(min(x.bytes_per_cycle for x in links),
                           max(x.latency_cycles for x in links))
            return req.chips, {m: m for m in req.members}, req.first, slow
        where = {m: topo.coords(m)[dim] for m in req.members}
        return topo.dims[dim], where, where[req.members[0]], topo.link(dim, self.npu)

    def _group_programs(self, req, member_regs, offsets):
        """Programs of one collective on the ring it is timed on (each member's COLL after
        ``offsets[i]`` NOPs), and that ring's positions of the members and its links."""
        n, where, first, link = self._placed(req)
        programs = [[int(Op.HALT)] for _ in range(n)]
        for m, regs, off in zip(req.members, member_regs, offsets, strict=True):
            regs = dict(regs)
            if n != req.chips or where[m] != m:
                regs.update(CO_CHIPS=n, CO_NEXT=where[req.next_member(m)])
            words = [int(Op.NOP)] * off
            words += [_set(name, regs.get(name, 0)) for name in _REGS_OF[Op.COLL]]
            words += [int(Op.COLL), int(Op.WAIT) | int(Unit.ALL) << 6, int(Op.HALT)]
            programs[where[m]] = words
        return programs, where, link

    def _closed(self, req, member_regs, offsets) -> dict | None:
        """Each member's busy cycles of one collective alone on the ring it is timed on,
        member ``i`` launching ``offsets[i]`` cycles after the first: the word-level
        recurrence of :mod:`sim.timing.ring_collective`, equal to the cycle model's
        (``_group_programs`` on :func:`time_programs`); None where that is not exact (the
        cycle model then times it), or when :attr:`closed_form` is off."""
        if not self.closed_form:
            return None
        n, where, _, link = self._placed(req)
        regs = {}
        for m, r in zip(req.members, member_regs, strict=True):
            r = dict(r)
            if n != req.chips or where[m] != m:
                r.update(CO_CHIPS=n, CO_NEXT=where[req.next_member(m)])
            regs[m] = r
        try:
            return member_busy(self.npu, n, where, regs,
                               dict(zip(req.members, offsets, strict=True)), link)
        except ValueError as exc:
            raise IssError(str(exc)) from None

    def post(self, c: _Chip, op, at, slot):
        r = c.regs
        if op is Op.COLL:
            try:
                cmd = command_from_registers(r)
            except ValueError as exc:
                raise IssError(f"chip {c.chip} pc {c.pc}: {exc}") from None
            if cmd.rank is None:
                c.launches[-1][3] = at + 1  # outside the group: a no-op, never busy
                return
            # Timed on a ring's chip (one engine): engine 1's generators become engine 0's.
            regs = dict(r)
            if slot == _COLL1:
                for (rd, wr), (rd1, wr1) in [(COLL_GENS[0], COLL_GENS[1])]:
                    for g, g1 in ((rd, rd1), (wr, wr1)):
                        for name in _gen_regs(g):
                            regs[name] = r.get(g1 + name[len(g):], 0)
            c.pending[slot] = ("coll", cmd, at, self._placed_at_zero(regs))
        elif op is Op.SEND:
            words = _extent(r, "RD7")[2]
            c.pending[slot] = ("send", r["SR_DEST"], at, words)
        else:
            words = _extent(r, "WR4")[2]
            c.pending[slot] = ("recv", r["SR_SRC"], at, words)
        c.free[slot] = None

    def _placed_at_zero(self, regs) -> dict:
        """A COLL's registers with its buffers moved down as far as its timing allows, so
        that the same collective on other addresses (the blocks of a split collective, the
        layers of a model) is timed once. The cycle model's only use of an address is its
        bank (the ports' arbitration): buffers in one bank move to the start of bank 0;
        otherwise they move down by whole banks (the same bank pattern); a walk that wraps
        at the scratchpad's end stays where it is."""
        regs = dict(regs)
        gens = ("RD6", "WR3")
        spans = [_extent(regs, g) for g in gens]
        lo = min(s[0] for s in spans)
        if lo < 0 or max(s[1] for s in spans) >= self.npu.sram_words:
            return regs
        bank_words = self.npu.bank_words if self.npu.sram_banks > 1 else None
        if bank_words is None or len({bank_of(a, bank_words) for s in spans
                                      for a in s[:2]}) == 1:
            shift = lo
        else:
            shift = lo - lo % bank_words
        for g in gens:
            regs[f"{g}.base"] = regs.get(f"{g}.base", 0) - shift
        return regs

    def meet(self, chips) -> bool:
        met = self._meet_collectives(chips)
        for c in chips:
            send = c.pending.get(4)
            if send is not None:
                dest = chips[send[1]]
                recv = dest.pending.get(5)
                if recv is not None and recv[1] == c.chip:
                    s_dur, r_dur, lag = self._p2p(c.chip, dest.chip, send[3])
                    # The message streams once both have launched and the clear-to-send
                    # token has reached the sender (``lag`` cycles after the RECV).
                    t0 = max(send[2], recv[2] + lag)
                    c.spans[4].append((send[2] + 1, t0 + 1 + s_dur))
                    c.free[4] = t0 + 1 + s_dur
                    c.done_launch(4, t0 + 1 + s_dur)
                    dest.spans[5].append((recv[2] + 1, t0 + 1 + r_dur))
                    dest.free[5] = t0 + 1 + r_dur
                    dest.done_launch(5, t0 + 1 + r_dur)
                    del c.pending[4]
                    del dest.pending[5]
                    met = True
        return met

    def _meet_collectives(self, chips) -> bool:
        """Time every collective whose members have all launched, each member from its own
        launch (the early members' words move before the last member launches). Those whose
        groups run at the same time (their intervals overlap) share the ring's links, the
        routers forwarding each group's words past the others: they are timed together."""
        ready = []
        for slot in (3, _COLL1):
            posted = {c.chip: c.pending[slot][1] for c in chips
                      if c.pending.get(slot) is not None}
            for chip in list(posted):
                if chip not in posted:
                    continue
                try:
                    req = walk_group(posted, chip)
                except ValueError as exc:
                    raise IssError(str(exc)) from None
                if req is None:
                    continue
                for m in req.members:
                    del posted[m]
                posts = [chips[m].pending[slot] for m in req.members]
                regs = [p[3] for p in posts]
                alone = self._coll(req, regs)       # every member starting with the last
                last = max(p[2] for p in posts)
                ready.append((req, posts, min(p[2] for p in posts),
                              last + 1 + max(alone.values()), slot))
        if not ready:
            return False
        # Clusters of overlapping intervals (by first launch, each joining the previous
        # cluster while it starts before that cluster's last end).
        ready.sort(key=lambda r: r[2])
        clusters = []
        for item in ready:
            # Collectives of different engines run on different links (a torus's two
            # dimensions): only one engine's overlap on shared links.
            if clusters and item[4] == clusters[-1][0][4] and \
                    item[2] < max(x[3] for x in clusters[-1]):
                clusters[-1].append(item)
            else:
                clusters.append([item])
        for cluster in clusters:
            for (req, posts, _, _, slot), dur in zip(cluster, self._colls(cluster),
                                                     strict=True):
                for m, p in zip(req.members, posts, strict=True):
                    chip = chips[m]
                    end = p[2] + 1 + dur[m]
                    chip.spans[slot].append((p[2] + 1, end))
                    chip.free[slot] = end
                    chip.done_launch(slot, end)
                    del chip.pending[slot]
        return True

    def _colls(self, cluster) -> list[dict]:
        """Each member's busy cycles of collectives on disjoint groups, every member launching
        in its own cycle: each group alone on its ring by :meth:`_closed` (a torus's groups,
        or a ring's one group), else the cycle model on them together (a ring's groups at
        once share its links)."""
        t0 = min(x[2] for x in cluster)
        key = tuple((x[0],) + tuple((p[2] - t0,) + tuple(p[3].get(name, 0)
                                                         for name in _REGS_OF[Op.COLL])
                                    for p in x[1]) for x in cluster)
        if key in self._coll_cache:
            return self._coll_cache[key]
        if self.topology.is_torus or len(cluster) == 1:
            # Groups on rings of their own (a torus's rows and columns), or one group on
            # the ring: each in closed form where it is exact.
            out = [self._closed(req, [p[3] for p in posts], [p[2] - t0 for p in posts])
                   for req, posts, _, _, _ in cluster]
            if None not in out:
                self._coll_cache[key] = out
                return out
        if self.topology.is_torus:
            out = []
            for req, posts, _, _, _ in cluster:
                programs, where, link = self._group_programs(
                    req, [p[3] for p in posts], [p[2] - t0 for p in posts])
                t = time_programs(self.npu, programs, ring=len(programs) > 1, link=link)
                out.append({m: _busy_span(t.chips[where[m]].trace, 3,
                                          t.chips[where[m]].cycles) for m in req.members})
            self._coll_cache[key] = out
            return out
        chips = cluster[0][0].chips
        programs = [[int(Op.HALT)] for _ in range(chips)]
        for req, posts, _, _, _ in cluster:
            for m, p in zip(req.members, posts, strict=True):
                words = [int(Op.NOP)] * (p[2] - t0)
                words += [_set(name, p[3].get(name, 0)) for name in _REGS_OF[Op.COLL]]
                words += [int(Op.COLL), int(Op.WAIT) | int(Unit.ALL) << 6, int(Op.HALT)]
                programs[m] = words
        t = time_programs(self.npu, programs, ring=chips > 1, link=self.ring_link)
        out = [{m: _busy_span(t.chips[m].trace, 3, t.chips[m].cycles) for m in x[0].members}
               for x in cluster]
        self._coll_cache[key] = out
        return out

    def _coll(self, req, member_regs) -> dict:
        """Each member's busy cycles when every member launches in the same cycle (the
        collective alone, with each member's own RD6/WR3 descriptors: :meth:`_closed`, or
        the cycle model where that does not apply)."""
        descs = tuple(tuple(r.get(name, 0) for name in _REGS_OF[Op.COLL]) for r in member_regs)
        key = (req, descs)
        if key in self._coll_cache:
            return self._coll_cache[key]
        out = self._closed(req, member_regs, [0] * req.count)
        if out is not None:
            self._coll_cache[key] = out
            return out
        if self.topology.is_torus:
            programs, where, link = self._group_programs(req, member_regs, [0] * req.count)
            t = time_programs(self.npu, programs, ring=len(programs) > 1, link=link)
            out = {m: _busy_span(t.chips[where[m]].trace, 3, t.chips[where[m]].cycles)
                   for m in req.members}
            self._coll_cache[key] = out
            return out
        by_chip = dict(zip(req.members, member_regs, strict=True))
        programs = []
        for chip in range(req.chips):
            regs = by_chip.get(chip)
            if regs is None:            # outside the group: its router forwards
                programs.append([int(Op.HALT)])
                continue
            words = [_set(name, regs.get(name, 0)) for name in _REGS_OF[Op.COLL]]
            words += [int(Op.COLL), int(Op.WAIT) | int(Unit.ALL) << 6, int(Op.HALT)]
            programs.append(words)
        # Members start together: pad the shorter programs with NOPs before the COLL.
        longest = max(len(p) for p in programs)
        programs = [p if len(p) == 1 else [int(Op.NOP)] * (longest - len(p)) + p
                    for p in programs]
        t = time_programs(self.npu, programs, ring=req.chips > 1,
                          link=self.ring_link)
        out = {m: _busy_span(t.chips[m].trace, 3, t.chips[m].cycles) for m in req.members}
        self._coll_cache[key] = out
        return out

    def _p2p(self, src, dest, words):
        """``(send busy, recv busy, lag)`` of ``words`` scratchpad words from ``src`` to
        ``dest`` when the SEND launches ``lag`` or more cycles after the RECV (the
        clear-to-send token is then already there): the cycle model on the pair alone,
        extended linearly for long messages."""
        key = (src, dest, words)
        if key in self._p2p_cache:
            return self._p2p_cache[key]
        topo = self.topology
        if topo.is_torus:
            out = (0, 0, 0)
            a, b = topo.coords(src), topo.coords(dest)
            for dim, hops in enumerate(topo.hops(src, dest)):
                if hops:
                    leg = self._p2p_ring(topo.dims[dim], a[dim], b[dim], words,
                                         topo.link(dim, self.npu))
                    out = tuple(x + y for x, y in zip(out, leg, strict=True))
        else:
            out = self._p2p_ring(self.chips, src, dest, words, self.ring_link)
        self._p2p_cache[key] = out
        return out

    def _p2p_ring(self, chips, src, dest, words, link):
        """:meth:`_p2p` on a ring of ``chips`` chips with links ``link`` (None: the NPU's)."""
        ratio = self.npu.ring_word_bytes // self.npu.array_size
        latency = self.npu.link_latency_cycles if link is None else link.latency_cycles

        def run(w, delay):
            programs = []
            for chip in range(chips):
                prog = []
                if chip == src:
                    prog += [int(Op.NOP)] * delay + [
                        _set("RD7.base", 0), _set("RD7.n0", w), _set("RD7.s0", 1),
                        _set("SR_DEST", dest), int(Op.SEND)]
                if chip == dest:
                    prog += [_set("WR4.base", self.npu.bank_words), _set("WR4.n0", w),
                             _set("WR4.s0", 1), _set("SR_SRC", src), int(Op.RECV)]
                prog += [int(Op.WAIT) | int(Unit.ALL) << 6, int(Op.HALT)]
                programs.append(prog)
            t = time_programs(self.npu, programs, ring=True, link=link)
            s = _busy_span(t.chips[src].trace, 4, t.chips[src].cycles)
            r = _busy_span(t.chips[dest].trace, 5, t.chips[dest].cycles)
            return s, r - delay

        delay = 4 * (latency + ratio + 2) * chips
        if words <= 64 * ratio:
            s, r = run(words, delay)
        else:
            w1, w2 = 32 * ratio, 64 * ratio
            (s1, r1), (s2, r2) = run(w1, delay), run(w2, delay)
            s = round(s2 + (s2 - s1) * (words - w2) / (w2 - w1))
            r = round(r2 + (r2 - r1) * (words - w2) / (w2 - w1))
        # Launched together, the SEND waits for the token: the lag is what it waited.
        s0, _ = run(min(words, 2 * ratio), 0)
        s1, _ = run(min(words, 2 * ratio), delay)
        return s, r, s0 - s1


def _chip_result(c: _Chip) -> ChipTiming:
    """Busy counters and the busy-vector trace from the launches' intervals."""
    end = c.cycles
    events = {}
    for u, spans in enumerate(c.spans):
        bit = 3 if u == _COLL1 else u       # either collective engine: the collective unit
        for s, e in spans:
            if e > s:
                events.setdefault(s, []).append((bit, 1))
                events.setdefault(e, []).append((bit, -1))
    depth = [0] * 6
    trace = []
    busy = 0
    counters = [0] * len(BUSY_COUNTERS)
    prev_t = 0
    for t in sorted(events):
        span = min(t, end) - prev_t
        if span > 0 and busy:
            for u in range(6):
                if busy >> u & 1:
                    counters[u] += span
            counters[6] += span
            if busy & 7:
                counters[7] += span
        for u, d in events[t]:
            depth[u] += d
        new = sum(1 << u for u in range(6) if depth[u] > 0)
        if new != busy:
            trace.append((t, new))
            busy = new
        prev_t = t
    return ChipTiming(c.chip, end, counters, trace, c.launches, [])
