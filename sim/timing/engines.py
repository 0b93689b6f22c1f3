"""Cycle models of the chip's compute engines: their handshakes, without their data.

Each model follows one engine of ``hw/tile`` register for register where it decides *when* a
word moves (valid, ready, counters, FSM states, pipeline valid bits) and leaves out *what* the
word holds, which never changes when anything happens (the chip's schedule is static):

- :class:`MatmulModel`: ``hw/tile/matmul_engine.py`` (transposer, array, requantiser, packer);
- :class:`AttentionModel`: ``hw/tile/attention_engine.py`` (row gathers, the K/V ring's score
  and P.V sweeps, the softmax unit's row slots, the output requantiser);
- :class:`VectorModel`: ``hw/tile/vector_engine.py`` and ``hw/tile/vector.py`` (operand gathers,
  the unit's FSM and its pipeline of 4 or 13 stages, the output FIFO, the packer, statistics
  records).

A model is stepped once per cycle by :class:`sim.timing.cycle.ChipModel`: :meth:`step` gets
whether each of its read ports offers a word (``valid``) and whether each of its write ports
takes the word it offers (the scratchpad's grant), computes the cycle's handshakes exactly as
the gateware's combinational logic does, then moves to the next cycle's state; it returns the
read ports whose word it took. :meth:`out_valid` is what a write port's source offers (a
register in every engine, so the scratchpad can grant before the engines step). :meth:`start`
is a launch's configuration beat.
"""

from __future__ import annotations

from collections import deque

from hw.spec.attention import (
    FLAG_INTERLEAVED,
    FLAG_PARTIAL,
    FLAG_REDUCED,
    flags_halo,
    launch_words,
    partial_row_words,
    softmax_lanes,
    state_mode,
    state_words,
)
from hw.spec.formats import OutMode, out_words
from hw.spec.memory import PARAM_WORDS
from hw.spec.timing.chip import (
    ATTN_DOT_CYCLES,
    ATTN_MERGE_CYCLES,
    ATTN_NORM_CYCLES,
    ATTN_PARTIAL_CYCLES,
    ATTN_PV_CYCLES,
    ATTN_REDUCED_CYCLES,
    ATTN_STATE_ROWS,
    VEC_OUT_FIFO_DEPTH,
    attn_out_pipe,
    merge_divide_cycles,
    merge_rotate_cycles,
    softmax_stages,
)
from hw.spec.timing.matmul import REQUANT_LATENCY, array_row_delay
from hw.spec.timing.vector import check_pipeline, latency, rsqrt_cycles, stats_cycles
from hw.spec.vector import VectorOp, twin_of
from hw.spec.vector_engine import (
    LOAD_OPS,
    RECORD_OUT_OPS,
    VecFlags,
    record_words,
    stats_words,
    table_entries,
    uses_a,
    uses_b,
    uses_records,
)

__all__ = ["MatmulModel", "AttentionModel", "VectorModel"]


class MatmulModel:
    """``MATMUL``: RD0 -> transposer -> array <- RD1; RD2 -> parameter gather -> requantiser;
    requantiser -> packer -> WR0.

    The array moves as a whole on one clock enable, so in *enabled cycles* it is a fixed delay:
    a fold whose last beat is taken in enabled cycle ``e`` has row ``r`` on its output (the
    deskew registers) in enabled cycle ``e + array_row_delay(N) + r`` (``hw/tile/matmul.py``,
    :func:`hw.spec.timing.matmul.array_row_delay`); the model keeps those rows in a queue and
    counts enabled cycles. The requantiser is ``REQUANT_LATENCY`` valid bits on its own enable.
    B beats past ``MM_B_ROWS`` take no word; in the packed last column block (``MM_B_LAST``) a
    beat takes a word only when the held word's unused bytes are fewer than its columns.
    """

    def __init__(self, size: int):
        self.n = size
        self.active = False
        self.k = self.folds = 0
        self.kb = self.blocks = self.last = 0
        self.blk = self.held = 0
        self.nwords = 1
        self.tfull = [False, False]
        self.wsel = self.rsel = self.trow = self.tcol = 0
        self.beat = 0
        self.pcount = 0
        self.pfull = False
        self.step_no = 0               # enabled cycles of the array so far
        self.since_last = size
        self.rows = deque()            # (enabled cycle, is the tile's last row)
        # The requantiser's stages, first to last (the last is its output register).
        self.rv = [False] * REQUANT_LATENCY
        self.part = self.tile_row = self.fold = 0

    def start(self, regs):
        self.active = True
        self.k = regs["MM_K"]
        self.folds = regs["MM_FOLDS"]
        self.kb = regs.get("MM_B_ROWS", 0) or self.k
        self.blocks = regs.get("MM_B_BLOCKS", 0)
        self.last = regs.get("MM_B_LAST", 0)
        self.blk = self.held = 0
        self.nwords = out_words(OutMode(regs["MM_MODE"]))
        self.part = self.tile_row = self.fold = 0

    def out_valid(self) -> bool:
        return self.rv[-1]

    def idle(self) -> bool:
        return not (self.active or any(self.rv) or self.rows
                    or self.tfull[0] or self.tfull[1] or self.pfull)

    def step(self, rv0, rv1, rv2, wg0):
        n = self.n
        rows = self.rows
        arr_valid = bool(rows) and rows[0][0] == self.step_no
        arr_last = arr_valid and rows[0][1]
        # Requantiser and packer: unit.o.ready = o.ready & row_done.
        row_done = self.part == self.nwords - 1
        en_rq = (not self.rv[-1]) or (wg0 and row_done)
        arr_ready = en_rq and self.pfull
        take_rq = arr_ready and arr_valid
        param_xfer = take_rq and arr_last
        # Array: one enable; A from the transposer, B from RD1, joined.
        en = (not arr_valid) or arr_ready
        a_valid = self.active and self.tfull[self.rsel]
        a_last = self.beat == self.k - 1
        zero = self.beat >= self.kb
        narrow = bool(self.last) and self.blk + 1 >= self.blocks
        need_word = not zero and (not narrow or self.held < self.last)
        take = (en and a_valid and self.active and (rv1 or not need_word)
                and (self.since_last == n or not a_last))
        p0 = rv0 and not self.tfull[self.wsel]
        p2 = rv2 and self.active and not self.pfull

        if p0:
            if self.trow == n - 1:
                self.trow = 0
                self.tfull[self.wsel] = True
                self.wsel ^= 1
            else:
                self.trow += 1
        if take:
            if narrow and not zero:
                self.held = n - (self.last - self.held) if need_word else \
                    self.held - self.last
            if a_last:
                self.held = 0
                self.blk = 0 if self.blk + 1 >= self.blocks else self.blk + 1
            if self.tcol == n - 1:
                self.tcol = 0
                self.tfull[self.rsel] = False
                self.rsel ^= 1
            else:
                self.tcol += 1
            if a_last:
                self.beat = 0
                first = self.step_no + array_row_delay(n)
                for r in range(n):
                    rows.append((first + r, r == n - 1))
            else:
                self.beat += 1
        if en:
            if take and a_last:
                self.since_last = 1
            elif self.since_last != n:
                self.since_last += 1
            if arr_valid:
                rows.popleft()
            self.step_no += 1
        if en_rq:
            self.rv = [take_rq] + self.rv[:-1]
        if wg0:
            if row_done:
                self.part = 0
                if self.tile_row == n - 1:
                    self.tile_row = 0
                    if self.fold == self.folds - 1:
                        self.active = False
                        self.fold = 0
                    else:
                        self.fold += 1
                else:
                    self.tile_row += 1
            else:
                self.part += 1
        if p2:
            if self.pcount == PARAM_WORDS - 1:
                self.pcount = 0
                self.pfull = True
            else:
                self.pcount += 1
        if param_xfer:
            self.pfull = False
        return p0, take and need_word, p2


_IDLE, _DOT, _SCORES, _PARTIAL, _REDUCED, _REQUANT = range(6)
_SWEEP, _OUT = 1, 2
# The merge factors' stages (hw/tile/attention_engine.py, _merge_path).
_P_IDLE, _P_Y, _P_SUM, _P_NORM, _P_DIV, _P_DONE = 0, 1, ATTN_MERGE_CYCLES, \
    ATTN_MERGE_CYCLES + 1, ATTN_MERGE_CYCLES + 1 + ATTN_NORM_CYCLES, \
    ATTN_MERGE_CYCLES + 2 + ATTN_NORM_CYCLES


class AttentionModel:
    """``ATTN``: RD3 K, RD4 V, RD5 Q -> row gathers -> K/V writes and queries in schedule order
    -> score sweep -> softmax -> P.V sweep -> output row -> requantiser -> WR1.

    The buffer's score sweep offers its row ``W + ATTN_DOT_CYCLES`` cycles after taking a
    query; its P.V sweep offers the output ``W + ATTN_PV_CYCLES`` cycles after taking the
    probabilities; the softmax advances its five row stages every ``T = L / P`` cycles
    (``hw/tile/softmax.py``: a slot counter that idles at ``T - 1`` while the unit is empty).

    The split-score passes (``AT_FLAGS`` bits 2 and 3): a split query's partial row is offered
    ``W + ATTN_PARTIAL_CYCLES`` cycles after the query is taken, the buffer then waits for its
    reduced row and offers the score row ``W + ATTN_REDUCED_CYCLES`` after taking it. The
    partial pass (no V) holds each partial row in a register emitted as ``R`` words on WR1,
    answers the reduced row with zeros at once, drops the score row (no softmax), answers it
    with a zero probability row and drops the output row; it ends once its last row is out and
    its last output row dropped. The reduced pass (no K) gathers one ``R``-word reduced row per
    query from RD5, drops the partial rows, and continues as a normal query.

    State rows (``AT_FLAGS`` bits 4 and 5): a Q row is its Q words and, with a state in, its
    state words, and its first word waits while the state FIFO holds ``ATTN_STATE_ROWS`` rows;
    the merge factors take ``1 + ATTN_MERGE_CYCLES`` cycles from the probabilities' take (the
    last chunk: ``ATTN_NORM_CYCLES`` and the division's more), the P.V row waits for them and
    for the state register; then the row's Q and state words go out one per granted cycle
    (released after the last), or the last chunk merges for ``K`` cycles (released) and its
    int8 row enters the output register.

    ``pipeline = "deep"`` (the NPU file's ``attention_pipeline``): every word WR1 takes (int8,
    partial row or state word) leaves its source into ``attn_out_pipe("deep")`` output
    registers, the last one ``o``; they move together while ``o`` is empty or granted (a stall
    holds them all, bubbles included), and the launch ends when its final word is granted out
    of the last. ``"short"``: WR1 takes the source's word.
    """

    def __init__(self, *, window: int, length: int, size: int, d_head: int = 1,
                 pipeline: str = "short"):
        self.W = window
        self.T = length // softmax_lanes(length)
        self.n = size
        self.R = partial_row_words(window, size)
        self.K = merge_rotate_cycles(d_head, size, pipeline) if size % 4 == 0 else 0
        self.DC = merge_divide_cycles(window)
        self.st_in = self.st_out = False
        self.sw = 0
        self.rows_held = 0
        self.pst = _P_IDLE
        self.dcnt = 0
        self.e_act = self.c_act = False
        self.e_word = self.ccnt = 0
        self.active = False
        self.Q = self.S = self.halo = 0
        self.kw = self.vw = self.qw = self.ow = 1
        self.interleaved = False
        self.partial = self.reduced = False
        self.kf = self.vf = self.qf = self.rf = False
        self.ko = self.vo = self.qo = self.ro = 0
        self.kc = self.vc = self.qc = self.rc = 0
        self.written = self.issued = 0
        self.sstate = _IDLE
        self.scnt = 0
        self.pv_full = False
        self.pstate = _IDLE
        self.pcnt = 0
        self.sm_cnt = self.T - 1
        self.smv = [False] * softmax_stages(pipeline)
        self.sm_ovalid = False
        self.o_full = False
        self.o_off = 0
        self.rows_out = 0
        self.p_full = False
        self.p_off = 0
        self.dropped = 0
        self.out_done = False
        # The output registers, the first to o: None (empty) or whether the word is the
        # launch's final one (none: "short", o is the source's word).
        self.pipe = [None] * attn_out_pipe(pipeline)

    def start(self, regs):
        self.active = True
        self.Q, self.S = regs["AT_QUERIES"], regs["AT_KEYS"]
        words = launch_words(regs, self.n)
        self.kw, self.vw, self.qw, self.ow = (words[s] for s in "kvqo")
        flags = regs["AT_FLAGS"]
        self.interleaved = bool(flags & FLAG_INTERLEAVED)
        self.halo = flags_halo(flags)
        # Bit 3 wins if both are set, as in the engine (the ISS refuses that).
        self.reduced = bool(flags & FLAG_REDUCED)
        self.partial = bool(flags & FLAG_PARTIAL) and not self.reduced
        mode = None if self.partial or self.reduced or not self.K else \
            state_mode(flags & ~(FLAG_PARTIAL | FLAG_REDUCED))
        self.st_in, self.st_out = mode in ("middle", "last"), mode in ("first", "middle")
        self.sw = state_words(regs["AT_D_HEAD"], self.n) if mode is not None else 0
        # An RD5 row: the Q words, then the state words.
        self.qrow = self.qw + (self.sw if self.st_in else 0)
        self.written = self.issued = self.rows_out = self.dropped = 0
        self.kc = self.vc = self.qc = self.rc = 0
        self.out_done = False

    @staticmethod
    def uses(regs) -> dict:
        """The generators a launch starts (the engine's ``uses``): no V (RD4) in the partial
        pass, no K (RD3) in the reduced pass."""
        flags = regs["AT_FLAGS"]
        reduced = bool(flags & FLAG_REDUCED)
        return {"RD3": not reduced, "RD4": not flags & FLAG_PARTIAL or reduced, "RD5": True,
                "WR1": True}

    def out_valid(self) -> bool:
        """The last of the output registers holds a word (without them: the source has one)."""
        return self.pipe[-1] is not None if self.pipe else self._src_valid()

    def _src_valid(self) -> bool:
        """A word is ready to enter the output registers."""
        if self.st_out:
            return self.e_act
        return self.p_full if self.partial else self.o_full

    def idle(self) -> bool:
        return not (self.active or self.sm_ovalid or any(self.smv) or self.pv_full
                    or self.sstate or self.pstate or self.e_act or self.c_act) \
            and self.sm_cnt == self.T - 1

    def step(self, rv3, rv4, rv5, wg1):
        active = self.active
        # The output registers move together when o's is empty or taken (wg1).
        adv = not self.pipe or self.pipe[-1] is None or wg1
        sfire = adv and self._src_valid() if self.pipe else wg1
        partial, reduced = self.partial, self.reduced
        split = partial or reduced
        ahead = self.halo + self.issued + 1
        target = ahead if self.interleaved and ahead < self.S else self.S
        want_key = self.written < target
        sidle = self.sstate == _IDLE
        all_idle = sidle and self.pstate == _IDLE and not self.pv_full
        kv_fire = (active and want_key and (self.kf or reduced) and (self.vf or partial)
                   and all_idle)
        q_fire = (active and not want_key and self.issued < self.Q and (self.qf or reduced)
                  and sidle)
        # Split-score rows: the buffer's partial row out, its reduced row in.
        part_fire = self.sstate == _PARTIAL and (reduced or not self.p_full)
        red_fire = self.sstate == _REDUCED and (partial or self.rf)
        red_take = red_fire and reduced
        k_pop = rv3 and active and (not self.kf or kv_fire) and \
            self.kc < (0 if reduced else self.S)
        v_pop = rv4 and active and (not self.vf or kv_fire) and \
            self.vc < (0 if partial else self.S)
        st = self.st_in or self.st_out
        q_pop = rv5 and active and (not self.qf or q_fire) and \
            self.qc < (0 if reduced else self.Q) and \
            (not st or self.qo > 0 or self.rows_held < ATTN_STATE_ROWS)
        r_pop = rv5 and active and reduced and (not self.rf or red_take) and self.rc < self.Q
        # Softmax slots (the partial pass feeds it nothing and takes nothing from it).
        T = self.T
        smv = self.smv
        boundary = self.sm_cnt == T - 1
        probs_ready = self.pstate == _IDLE and self.pv_full
        sm_o_ready = probs_ready and not partial
        run = not (boundary and smv[-1] and self.sm_ovalid and not sm_o_ready)
        scores_valid = self.sstate == _SCORES and not self.pv_full
        sm_in = scores_valid and not partial
        scores_fire = scores_valid and (partial or (boundary and run))
        probs_fire = probs_ready and (partial or self.sm_ovalid)
        oout_fire = self.pstate == _OUT and active and (partial or (
            not self.o_full and not self.e_act and not self.c_act
            and (not st or self.pst == _P_DONE)))

        # Score side.
        if self.sstate == _IDLE:
            if q_fire:
                self.sstate = _DOT
                self.scnt = self.W + (ATTN_PARTIAL_CYCLES if split else ATTN_DOT_CYCLES) - 1
        elif self.sstate == _DOT:
            self.scnt -= 1
            if self.scnt == 0:
                self.sstate = _PARTIAL if split else _SCORES
        elif self.sstate == _PARTIAL:
            if part_fire:
                self.sstate = _REDUCED
        elif self.sstate == _REDUCED:
            if red_fire:
                self.sstate = _REQUANT
                self.scnt = self.W + ATTN_REDUCED_CYCLES - 1
        elif self.sstate == _REQUANT:
            self.scnt -= 1
            if self.scnt == 0:
                self.sstate = _SCORES
        elif scores_fire:
            self.pv_full = True
            self.sstate = _IDLE
        # P.V side.
        if self.pstate == _IDLE:
            if probs_fire:
                self.pv_full = False
                self.pstate = _SWEEP
                self.pcnt = self.W + ATTN_PV_CYCLES - 1
        elif self.pstate == _SWEEP:
            self.pcnt -= 1
            if self.pcnt == 0:
                self.pstate = _OUT
        elif oout_fire:
            self.pstate = _IDLE
        # Softmax.
        if run:
            if boundary:
                busy = sm_in or any(smv[:-1])
                self.sm_cnt = 0 if busy else T - 1
                if smv[-1]:
                    self.sm_ovalid = True
                elif sm_o_ready:
                    self.sm_ovalid = False
                self.smv = [sm_in] + smv[:-1]
            else:
                self.sm_cnt += 1
                if sm_o_ready:
                    self.sm_ovalid = False
        # Merge factors (state rows).
        released = False
        if st:
            if probs_fire:
                self.pst = _P_Y
            elif _P_Y <= self.pst < _P_SUM:
                self.pst += 1
            elif self.pst == _P_SUM:
                self.pst = _P_NORM if not self.st_out else _P_DONE
            elif self.pst == _P_NORM:
                self.pst, self.dcnt = _P_DIV, 0
            elif self.pst == _P_DIV:
                if self.dcnt == self.DC - 1:
                    self.pst = _P_DONE
                self.dcnt += 1
            if oout_fire:
                self.pst = _P_IDLE
        # Gathers and schedule.
        if kv_fire:
            self.written += 1
            self.kf = self.vf = False
        if q_fire:
            self.issued += 1
            self.qf = False
        if red_take:
            self.rf = False
        if k_pop:
            if self.ko + 1 == self.kw:
                self.kf, self.ko = True, 0
                self.kc += 1
            else:
                self.ko += 1
        if v_pop:
            if self.vo + 1 == self.vw:
                self.vf, self.vo = True, 0
                self.vc += 1
            else:
                self.vo += 1
        if q_pop:
            if st and self.qo == 0:
                self.rows_held += 1
            if self.qo + 1 == self.qrow:
                self.qf, self.qo = True, 0
                self.qc += 1
            else:
                self.qo += 1
        if r_pop:
            if self.ro + 1 == self.R:
                self.rf, self.ro = True, 0
                self.rc += 1
            else:
                self.ro += 1
        # Output row and requantiser (one word per cycle); the partial pass's rows instead.
        final = False
        dropped = self.dropped
        if partial:
            if part_fire:
                self.p_full, self.p_off = True, 0
            if oout_fire:
                self.dropped += 1
            if sfire:
                if self.p_off + 1 == self.R:
                    self.p_full, self.p_off = False, 0
                    final = self.rows_out == self.Q - 1
                    self.rows_out += 1
                else:
                    self.p_off += 1
        elif self.st_out:
            # State rows out: the Q and state words, one per granted cycle.
            if oout_fire:
                self.e_act, self.e_word = True, 0
            elif sfire:
                if self.e_word + 1 == self.qw + self.sw:
                    self.e_act = False
                    released = True
                    final = self.rows_out == self.Q - 1
                    self.rows_out += 1
                else:
                    self.e_word += 1
        else:
            if oout_fire and st:
                self.c_act, self.ccnt = True, 0
            elif oout_fire:
                self.o_full = True
                self.o_off = 0
            if self.c_act and not oout_fire:
                # The last chunk: K cycles of merging, then the int8 row.
                if self.ccnt == self.K - 1:
                    self.c_act = False
                    self.o_full, self.o_off = True, 0
                    released = True
                else:
                    self.ccnt += 1
            if sfire:
                if self.o_off + 1 == self.ow:
                    self.o_full = False
                    self.o_off = 0
                    final = self.rows_out == self.Q - 1
                    self.rows_out += 1
                else:
                    self.o_off += 1
        if released:
            self.rows_held -= 1
        # The output registers; the launch ends after its final word leaves the last.
        if self.pipe:
            out_final = bool(wg1 and self.pipe[-1])
            if adv:
                self.pipe = [final if sfire else None] + self.pipe[:-1]
            final = out_final
        # Launch end: after the final word (the partial pass: and its last dropped row).
        if active:
            tail = not partial or dropped == self.Q or (oout_fire and dropped == self.Q - 1)
            if (self.out_done or final) and tail:
                self.active = False
                self.out_done = False
            elif final:
                self.out_done = True
        return k_pop, v_pop, q_pop or r_pop


# Vector unit FSM states (hw/tile/vector.py).
(_V_IDLE, _V_ELEM, _V_LOAD, _V_ACC, _V_STATS, _V_GET, _V_RSQRT, _V_NORM, _V_GEN,
 _V_PAIRS, _V_DRAIN) = range(11)


class _Gather:
    """Operand words -> beats of ``1 << code`` words (fewer at a row's end)."""

    __slots__ = ("full", "cnt", "left", "need", "row_bytes")

    def __init__(self):
        self.full = False
        self.cnt = self.left = self.row_bytes = 0
        self.need = 1

    def start(self, length, code):
        self.full = False
        self.cnt = 0
        self.row_bytes = length << code
        self.left = self.row_bytes
        self.need = 1 << code

    def word(self, n):
        """Take one word (after a possible take of the beat in the same cycle)."""
        row_end = self.left <= n
        if row_end or self.cnt == self.need - 1:
            self.full = True
            self.cnt = 0
        else:
            self.cnt += 1
        self.left = self.row_bytes if row_end else self.left - n


class VectorModel:
    """``VEC``: RD3 (A), RD4 (B), RD5 (statistics) -> gathers -> the vector unit -> output
    FIFO -> packer -> WR1 (data) and WR2 (q or statistics records). ``pipeline``: the unit's
    (the NPU file's ``vector_pipeline``), which sets its stages and its rsqrt's cycles."""

    def __init__(self, *, lanes: int, pipeline: str = "short"):
        self.n = lanes
        self.pipeline = check_pipeline(pipeline)
        self.rsqrt_end = rsqrt_cycles(pipeline) - 1
        self.drain_end = stats_cycles(pipeline) - 2
        stages = latency(pipeline) - 1
        self.active = False
        self.op = VectorOp.ADD
        self.rows = self.length = 0
        self.flags = VecFlags()
        self.issued = 0
        self.ga, self.gb = _Gather(), _Gather()
        self.rec = stats_words(lanes)
        self.s_cnt = 0
        self.s_full = False
        self.so_full = False
        self.so_part = self.so_row = 0
        # The unit.
        self.state = _V_IDLE
        self.u_op = VectorOp.ADD
        self.u_pc = False          # per_channel of the running command
        self.remaining = 0
        self.rstep = 0
        self.pv = [False] * stages    # the pipeline's stage registers, then the output's
        self.pl = [False] * stages    # their beats' `last`
        self.uo_valid = False
        self.uo_last = False
        # Output FIFO (beats' `last` flags) and packer.
        self.fifo = deque()
        self.full = False
        self.beat_last = False
        self.d_done = self.q_done = False
        self.part = 0
        self.d_left = 0
        self.out_row = 0

    def start(self, regs):
        self.active = True
        self.op = twin_of(regs["VU_OP"])     # RMSNorm's ops run as LayerNorm's
        self.rows = regs["VU_ROWS"]
        self.length = regs["VU_LEN"]
        self.flags = f = VecFlags.decode(regs["VU_FLAGS"])
        self.rec = record_words(self.op, self.n) or stats_words(self.n)
        self.issued = 0
        self.ga.start(self.length, _code(f.a_bytes))
        self.gb.start(self.length, _code(f.b_bytes))
        self.s_cnt = 0
        self.s_full = False
        self.so_full = False
        self.so_row = 0
        self.out_row = 0
        self.full = False
        self.part = 0
        self.d_left = self.length << _code(f.d_bytes)

    def uses(self, regs) -> dict:
        """Which shared generators a launch with ``regs`` starts (the engine's ``uses``)."""
        op = twin_of(regs["VU_OP"])
        f = VecFlags.decode(regs["VU_FLAGS"])
        b = uses_b(op, f.per_channel)
        writes = op not in LOAD_OPS
        return {"RD3": uses_a(op, f.pairs), "RD4": b, "RD5": uses_records(op, f.pairs),
                "WR1": f.wr_data and writes and op not in RECORD_OUT_OPS,
                "WR2": f.wr_q and writes}

    def out_valid(self):
        """(WR1 source valid, WR2 source valid)."""
        d = self.full and not self.d_done
        if self.op in RECORD_OUT_OPS:
            return d, self.so_full
        return d, self.full and not self.q_done

    def idle(self) -> bool:
        return not (self.active or self.uo_valid or any(self.pv) or self.fifo or self.full
                    or self.state != _V_IDLE)

    def step(self, rv3, rv4, rv5, wg1, wg2):
        n = self.n
        active = self.active
        ga, gb = self.ga, self.gb
        state = self.state
        # The unit's handshakes.
        adv = (not self.uo_valid) or len(self.fifo) < VEC_OUT_FIFO_DEPTH
        a_ready = b_ready = False
        fire = False
        a_take = False
        uop = self.u_op
        if state == _V_ELEM:
            need_b = uop in (VectorOp.ADD, VectorOp.BIAS) or (uop is VectorOp.REQUANT
                                                               and self.u_pc)
            a_ready = adv and (not need_b or gb.full)
            b_ready = need_b and adv and ga.full
            fire = ga.full and a_ready
            a_take = fire
        elif state in (_V_LOAD, _V_ACC):
            a_ready = True
            a_take = ga.full
        elif state == _V_NORM:
            from_buf = uop is VectorOp.LN
            a_ready = (not from_buf) and adv and gb.full
            b_ready = adv and (from_buf or ga.full)
            fire = gb.full and b_ready
            a_take = ga.full and a_ready
        elif state == _V_GEN:
            fire = adv
        b_take = gb.full and b_ready
        cmd_fire = state == _V_IDLE and active and self.issued != self.rows
        is_stats = self.op in RECORD_OUT_OPS
        # Engine: gathers, statistics, packer.
        p3 = rv3 and active and (not ga.full or a_ready)
        p4 = rv4 and active and (not gb.full or b_ready)
        p5 = rv5 and active and not self.s_full
        u_valid = bool(self.fifo)
        f = self.flags
        d_row_end = self.d_left <= n
        d_beat_end = d_row_end or self.part == (1 << _code(f.d_bytes)) - 1
        q_fire = wg2 and not is_stats
        finish = self.full and (self.d_done or (wg1 and d_beat_end)) and (self.q_done or q_fire)
        u_ready = (not self.full) or finish
        load = u_valid and u_ready
        last_beat = self.remaining <= n
        so_fire = is_stats and self.so_full and wg2
        lut_end = (active and self.op in LOAD_OPS and self.issued == self.rows
                   and state == _V_IDLE)

        # Unit FSM.
        if state == _V_IDLE:
            if cmd_fire:
                op = self.op
                self.u_op = op
                self.u_pc = f.per_channel
                self.remaining = table_entries(op) if op in LOAD_OPS else self.length
                if op in LOAD_OPS:
                    # LOAD_LUT and LOAD_LUT16 take a word every cycle it is offered and emit
                    # nothing (the gateware's LOAD and LOAD16 states).
                    self.state = _V_LOAD
                elif op is VectorOp.ARGMAX and f.pairs:
                    self.state = _V_PAIRS
                elif op in (VectorOp.LN, VectorOp.LN_STATS, VectorOp.ARGMAX):
                    self.state = _V_ACC
                elif op in (VectorOp.LN_APPLY, VectorOp.ONEHOT):
                    self.state = _V_GET
                else:
                    self.state = _V_ELEM
        elif state in (_V_ELEM, _V_NORM, _V_GEN):
            if fire:
                self.remaining -= n
                if last_beat:
                    self.state = _V_IDLE
        elif state == _V_LOAD:
            if ga.full:
                self.remaining -= n
                if last_beat:
                    self.state = _V_IDLE
        elif state == _V_ACC:
            if ga.full:
                self.remaining -= n
                if last_beat:
                    if uop is VectorOp.LN:
                        self.rstep = 0
                        self.state = _V_RSQRT
                    elif self.pipeline == "deep":
                        self.rstep = 0
                        self.state = _V_DRAIN       # LN_STATS, ARGMAX: their statistics steps
                    else:
                        self.state = _V_STATS
        elif state == _V_DRAIN:
            if self.rstep == self.drain_end:
                self.state = _V_STATS
            self.rstep += 1
        elif state == _V_STATS:
            if not self.so_full:
                self.so_full = True
                self.so_part = 0
                self.state = _V_IDLE
        elif state == _V_PAIRS:
            if self.s_full:
                self.s_full = False
                self.remaining -= 1
                if self.remaining == 0:
                    self.state = _V_STATS
        elif state == _V_GET:
            if self.s_full:
                self.s_full = False
                self.rstep = 0
                self.state = _V_GEN if uop is VectorOp.ONEHOT else _V_RSQRT
        elif state == _V_RSQRT:
            self.remaining = self.length
            if self.rstep == self.rsqrt_end:
                self.state = _V_NORM
            self.rstep += 1
        # Pipeline (one enable: the output register is free or taken).
        if adv:
            if self.uo_valid:
                self.fifo.append(self.uo_last)
            self.uo_valid, self.uo_last = self.pv[-1], self.pl[-1]
            self.pv = [fire, *self.pv[:-1]]
            self.pl = [fire and last_beat, *self.pl[:-1]]
        if cmd_fire:
            self.issued += 1
        # Gathers.
        if a_take:
            ga.full = False
        if p3:
            ga.word(n)
        if b_take:
            gb.full = False
        if p4:
            gb.word(n)
        if p5:
            if self.s_cnt == self.rec - 1:
                self.s_cnt = 0
                self.s_full = True
            else:
                self.s_cnt += 1
        # Statistics records out (LN_STATS) through WR2.
        if so_fire:
            if self.so_part == self.rec - 1:
                self.so_full = False
                if self.so_row == self.rows - 1:
                    self.active = False
                self.so_row += 1
            else:
                self.so_part += 1
        # Packer.
        if wg1:
            if d_beat_end:
                self.d_done = True
                self.part = 0
            else:
                self.part += 1
            self.d_left = self.length << _code(f.d_bytes) if d_row_end else self.d_left - n
        if q_fire:
            self.q_done = True
        if finish:
            self.full = False
            if self.beat_last:
                if self.out_row == self.rows - 1:
                    self.active = False
                self.out_row += 1
        if load:
            self.beat_last = self.fifo.popleft()
            self.full = True
            self.part = 0
            self.d_done = not f.wr_data
            self.q_done = not f.wr_q
        # LOAD_LUT(16) writes nothing: the launch ends when the unit is back for a command.
        if lut_end:
            self.active = False
        return p3, p4, p5


def _code(nbytes: int) -> int:
    return (1, 2, 4).index(nbytes)
