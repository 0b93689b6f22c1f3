"""The chip's instruction set: one encoding shared by gateware, assembler, disassembler and ISS.

Plain Python (no Amaranth). See ``docs/isa.md`` for the programmer's view.

Every instruction is one 64-bit word::

    [5:0]   opcode
    [63:6]  operand, opcode-specific

``SET reg, value`` writes a 48-bit configuration register (``[15:6]`` register index,
``[63:16]`` value, two's complement); launch instructions (``MATMUL``, ...) start a unit with the
configuration registers as they are at launch, which the sequencer copies into the unit, so the
program may rewrite them for the next launch at once. ``WAIT mask`` stalls until every unit in
``mask`` is idle; a launch to a busy unit stalls until it is idle. There is no data-dependent
control flow: a program is a straight line ending in ``HALT``, except for one counted loop
whose trip count is in the instruction (``LOOP body, count``: the ``body`` instructions after
it run ``count`` times; ``ADD reg, value`` in the body advances addresses and positions per
iteration), so a program that repeats a step does not grow with the repeats.

Six units: matmul, attention, vector, collective (``COLL``: all chips of a group; a torus's
chip has two collective engines, the COLL's operand naming one), send and
receive (``SEND`` / ``RECV``: point-to-point, only the two chips take part).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Op", "Unit", "UNIT_BITS", "UNIT_NAMES", "BUSY_COUNTERS", "OP_UNIT", "ADDR_GENS",
           "READ_GENS", "WRITE_GENS", "WRAP_GENS", "ADDR_LEVELS", "COUNT_BITS", "MAX_COUNT", "REGS",
           "REG_INDEX", "INSN_BITS", "VALUE_BITS", "COLL_FIFO_WORDS", "RECV_FIFO_WORDS", "Insn",
           "COLL_GENS", "chip_gens",
           "encode", "decode", "disassemble", "reg", "gen_regs", "gen_fields", "IsaError",
           "LOOP_BODY_BITS", "LOOP_COUNT_BITS", "loop_operand", "loop_fields", "LoopState",
           "add_value", "ADDX_SCALE_BITS", "ITER_BITS", "check_addx_scale", "addx_value",
           "START_CLEARED"]

INSN_BITS = 64
OPCODE_BITS = 6
REG_BITS = 10
VALUE_BITS = 48
FLAGS_BITS = INSN_BITS - OPCODE_BITS


class IsaError(ValueError):
    """An instruction or operand that cannot be encoded."""


#: Bits of a LOOP's body length (operand ``[15:0]``) and trip count (``[47:16]``).
LOOP_BODY_BITS = 16
LOOP_COUNT_BITS = 32
#: Bits of ADDX's signed scale (the low bits of its value field) and of the loop's iteration
#: index ITER (as wide as the trip count), so the gateware's product is 16 x 32 bits.
ADDX_SCALE_BITS = 16
ITER_BITS = LOOP_COUNT_BITS


class Op(enum.IntEnum):
    NOP = 0
    SET = 1      #: SET reg, value
    WAIT = 2     #: WAIT unit-mask: until the units are idle
    HALT = 3     #: end of program: waits for every unit, then raises ``done``
    ADD = 4      #: ADD reg, value: the register plus value (48-bit, wrapping), encoded as SET
    LOOP = 5     #: LOOP body, count: run the next ``body`` instructions ``count`` times
    ADDX = 6     #: ADDX reg, scale: the register plus scale * ITER (48-bit, wrapping), as SET
    MATMUL = 8   #: matmul unit: A via RD0 (transposed in N x N blocks), B via RD1, params RD2
    ATTN = 9     #: attention buffer + softmax unit
    VEC = 10     #: vector unit
    COLL = 11    #: collective engine (operand: which): all-reduce, reduce-scatter, all-gather,
    #:              send/recv, barrier
    SEND = 12    #: send unit: the words RD7 walks, to chip SR_DEST (point-to-point)
    RECV = 13    #: receive unit: one message from chip SR_SRC, written through WR4


class Unit(enum.IntFlag):
    """Bits of a ``WAIT`` mask, and the unit each launch occupies."""

    MATMUL = 1
    ATTN = 2
    VEC = 4
    COLL = 8
    SEND = 16
    RECV = 32
    ALL = 63


#: Bits of a unit mask (``WAIT``, the chip's ``busy``).
UNIT_BITS = 6
#: Units in bit order, by the names the reports use.
UNIT_NAMES = ("matmul", "attention", "vector", "collective", "send", "recv")
#: The chip's busy counters (``busy_cycles``): one per unit, then ``any`` (cycles in which some
#: unit is busy) and ``compute`` (cycles in which matmul, attention or vector is busy).
BUSY_COUNTERS = UNIT_NAMES + ("any", "compute")

#: Which unit a launch opcode occupies.
OP_UNIT = {Op.MATMUL: Unit.MATMUL, Op.ATTN: Unit.ATTN, Op.VEC: Unit.VEC, Op.COLL: Unit.COLL,
           Op.SEND: Unit.SEND, Op.RECV: Unit.RECV}

#: Address generators. Each walks ``addr = base + i0*s0 + i1*s1 + i2*s2 + i3*s3`` over
#: ``i0 < n0`` innermost to ``i3 < n3`` outermost, one scratchpad word per step. A generator of
#: :data:`WRAP_GENS` also has ``wrap`` (M) and ``off`` registers: with M > 0 it walks the
#: circular buffer of M words at ``base``, ``addr = base + fold(off + i0*s0 + ... + i3*s3)``
#: where ``fold`` takes offsets in ``[-M, 2M)`` modulo M.
#: Owners: matmul RD0 (A), RD1 (B), RD2 (params), WR0; attention and vector unit share RD3,
#: RD4, RD5, WR1, WR2 (they never run at once); collective engine 0 RD6, WR3; send RD7;
#: receive WR4; collective engine 1 (a torus's chip) RD8, WR5.
READ_GENS = ("RD0", "RD1", "RD2", "RD3", "RD4", "RD5", "RD6", "RD7", "RD8")
WRITE_GENS = ("WR0", "WR1", "WR2", "WR3", "WR4", "WR5")
ADDR_GENS = READ_GENS + WRITE_GENS
#: Generators with a ``wrap`` register: a collective's blocks stream in a rotated order.
WRAP_GENS = ("RD6", "WR3", "RD8", "WR5")
#: Each collective engine's read and write generators (the COLL operand's engine index).
COLL_GENS = (("RD6", "WR3"), ("RD8", "WR5"))


def chip_gens(dims: int = 1) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The read and write generators a chip of a ``dims``-dimensional system has: a ring's
    chip (1) one collective engine's, a torus's (2) both (:data:`COLL_GENS`)."""
    unused = set() if dims == 2 else {g for pair in COLL_GENS[dims:] for g in pair}
    return (tuple(g for g in READ_GENS if g not in unused),
            tuple(g for g in WRITE_GENS if g not in unused))


ADDR_LEVELS = 4
#: Bits of an address-generator count (``n0..n3``) and of the units' row and beat counters.
COUNT_BITS = 16
#: The largest count: of a generator level, of a unit's rows or beats, of a launch's words.
MAX_COUNT = (1 << COUNT_BITS) - 1
_GEN_FIELDS = ("base",) + tuple(f"n{i}" for i in range(ADDR_LEVELS)) + \
    tuple(f"s{i}" for i in range(ADDR_LEVELS))


def gen_fields(gen: str) -> tuple[str, ...]:
    """The register fields of one address generator (``wrap`` for :data:`WRAP_GENS`)."""
    return _GEN_FIELDS + (("wrap", "off") if gen in WRAP_GENS else ())


#: Unit parameter registers (beyond the address generators), by name.
_UNIT_REGS = (
    # matmul
    "MM_K", "MM_FOLDS", "MM_MODE", "MM_A_UNSIGNED",
    # attention
    "AT_QUERIES", "AT_KEYS", "AT_Q_POS", "AT_K_POS", "AT_WINDOW", "AT_FLAGS",
    "AT_SCORE_MULT", "AT_SCORE_SHIFT", "AT_OUT_MULT", "AT_OUT_SHIFT", "AT_D_HEAD",
    # vector unit
    "VU_OP", "VU_ROWS", "VU_LEN", "VU_N", "VU_MULT", "VU_SHIFT", "VU_GSHIFT", "VU_FLAGS",
    # collectives
    "CO_KIND", "CO_OP", "CO_WIDTH", "CO_LEN", "CO_NEXT", "CO_COUNT",
    # collectives: the system's size and this chip's group rank (docs/isa.md, COLL)
    "CO_CHIPS", "CO_RANK",
    # point-to-point: the chip a SEND goes to, the chip a RECV takes its message from
    "SR_DEST", "SR_SRC",
    # attention: the head's first lane in the first word of a Q, K, V and output row (heads
    # packed in shared words)
    "AT_Q_LANE", "AT_K_LANE", "AT_V_LANE", "AT_O_LANE",
    # matmul: B rows stored per fold (the rest of MM_K's beats take zero B rows), column
    # blocks per row tile, and the columns of the last block, stored packed (0: N)
    "MM_B_ROWS", "MM_B_BLOCKS", "MM_B_LAST",
)

#: Depth in engine words of the collective engine's receive and transmit buffers in the chip:
#: every block of a COLL must fit (``hw.spec.collective.check_fits``).
COLL_FIFO_WORDS = 64
#: Depth in ring words of the receive unit's buffer between the ring port and WR4.
RECV_FIFO_WORDS = 4

#: Registers the sequencer sets to 0 when a program starts (``start``): the lane offsets of
#: packed heads and the matmul's packed-B fields, whose 0 keeps the whole-word behaviour, so a
#: program that never uses them need not set them (the assembler knows them as 0).
START_CLEARED = ("AT_Q_LANE", "AT_K_LANE", "AT_V_LANE", "AT_O_LANE",
                 "MM_B_ROWS", "MM_B_BLOCKS", "MM_B_LAST")

REGS: tuple[str, ...] = tuple(f"{g}.{f}" for g in ADDR_GENS for f in gen_fields(g)) + _UNIT_REGS
REG_INDEX = {name: i for i, name in enumerate(REGS)}
assert len(REGS) <= 1 << REG_BITS


def reg(name: str) -> int:
    try:
        return REG_INDEX[name]
    except KeyError:
        raise IsaError(f"unknown register {name!r}") from None


def gen_regs(gen: str) -> dict[str, int]:
    """Register indices of one address generator's fields."""
    if gen not in ADDR_GENS:
        raise IsaError(f"unknown address generator {gen!r}")
    return {f: REG_INDEX[f"{gen}.{f}"] for f in gen_fields(gen)}


@dataclass(frozen=True)
class Insn:
    op: Op
    reg: int = 0        #: SET: register index
    value: int = 0      #: SET: value; WAIT: unit mask; launches: flags

    def __str__(self):
        return disassemble(encode(self))


def loop_operand(body: int, count: int) -> int:
    """The operand of ``LOOP body, count`` (``body`` >= 1 instructions, ``count`` >= 0 times;
    0 skips the body)."""
    if not 1 <= body < 1 << LOOP_BODY_BITS:
        raise IsaError(f"LOOP body {body} outside 1..{(1 << LOOP_BODY_BITS) - 1}")
    if not 0 <= count < 1 << LOOP_COUNT_BITS:
        raise IsaError(f"LOOP count {count} outside 0..{(1 << LOOP_COUNT_BITS) - 1}")
    return body | count << LOOP_BODY_BITS


def loop_fields(operand: int) -> tuple[int, int]:
    """``(body, count)`` of a LOOP operand."""
    return (operand & ((1 << LOOP_BODY_BITS) - 1),
            (operand >> LOOP_BODY_BITS) & ((1 << LOOP_COUNT_BITS) - 1))


def add_value(old: int, value: int) -> int:
    """What ``ADD`` leaves in a register holding ``old``: the 48-bit two's complement sum."""
    return sign_extend(old + value)


def check_addx_scale(scale: int) -> int:
    """``scale`` if it is an ADDX scale (signed :data:`ADDX_SCALE_BITS` bits), else IsaError."""
    lo, hi = -(1 << (ADDX_SCALE_BITS - 1)), (1 << (ADDX_SCALE_BITS - 1)) - 1
    if not lo <= scale <= hi:
        raise IsaError(f"ADDX scale {scale} outside {lo}..{hi}")
    return scale


def addx_value(old: int, scale: int, iteration: int) -> int:
    """What ``ADDX`` leaves in a register holding ``old`` in the loop's trip ``iteration``
    (ITER): ``old + scale * iteration``, 48-bit two's complement. The product itself always
    fits 48 bits (|scale| <= 2^15, ITER < 2^32). IsaError on a scale outside 16 bits."""
    if not 0 <= iteration < 1 << ITER_BITS:
        raise IsaError(f"ADDX iteration {iteration} outside 0..{(1 << ITER_BITS) - 1}")
    return sign_extend(old + check_addx_scale(scale) * iteration)


class LoopState:
    """The sequencer's loop registers and its next-pc rule (the ISS and the timing models run
    it; ``hw.tile.sequencer`` is the gateware). One loop at a time: a LOOP inside a body, or a
    body of 0 instructions, is an error (the chip halts with ``error``). ``iteration`` is ITER,
    the running trip's index (0 in the first, ``count - 1`` in the last), which ADDX scales;
    an ADDX outside a body is an error too."""

    def __init__(self):
        self.active = False
        self.start = self.end = self.left = self.iteration = 0

    def begin(self, pc: int, operand: int) -> int:
        """Execute the LOOP at ``pc``; return the next pc. IsaError on a nested LOOP."""
        body, count = loop_fields(operand)
        if self.active:
            raise IsaError(f"LOOP at pc {pc} inside the loop of pc {self.start - 1}")
        if body == 0:
            raise IsaError(f"LOOP at pc {pc} has an empty body")
        if count == 0:
            return pc + body + 1
        self.active, self.start, self.end, self.left = True, pc + 1, pc + body, count - 1
        self.iteration = 0
        return pc + 1

    def iteration_at(self, pc: int) -> int:
        """ITER for the ADDX at ``pc``; IsaError outside a loop body."""
        if not self.active:
            raise IsaError(f"ADDX at pc {pc} outside a loop body")
        return self.iteration

    def written(self, insn: Insn, old: int, pc: int) -> int:
        """What the SET, ADD or ADDX ``insn`` at ``pc`` leaves in a register holding ``old``
        (the one rule of the ISS and both timing models). IsaError for an ADDX outside a loop
        body or with a scale outside 16 bits."""
        if insn.op is Op.SET:
            return insn.value
        if insn.op is Op.ADD:
            return add_value(old, insn.value)
        if insn.op is Op.ADDX:
            return addx_value(old, insn.value, self.iteration_at(pc))
        raise IsaError(f"{insn.op.name} writes no register")

    def next_pc(self, pc: int) -> int:
        """The pc after the (non-LOOP) instruction at ``pc`` completes."""
        if self.active and pc == self.end:
            if self.left:
                self.left -= 1
                self.iteration += 1
                return self.start
            self.active = False
        return pc + 1


#: Opcodes with a register index and a value (``[15:6]``, ``[63:16]``).
_REG_OPS = (Op.SET, Op.ADD, Op.ADDX)


def encode(insn: Insn) -> int:
    op = Op(insn.op)
    if op is Op.ADDX:
        check_addx_scale(insn.value)
    if op in _REG_OPS:
        if not 0 <= insn.reg < len(REGS):
            raise IsaError(f"{op.name} register index {insn.reg} outside 0..{len(REGS) - 1}")
        lo, hi = -(1 << (VALUE_BITS - 1)), (1 << VALUE_BITS) - 1
        if not lo <= insn.value <= hi:
            raise IsaError(f"{op.name} {REGS[insn.reg]} value {insn.value} does not fit "
                           f"{VALUE_BITS} bits")
        value = insn.value & ((1 << VALUE_BITS) - 1)
        return op | (insn.reg << OPCODE_BITS) | (value << (OPCODE_BITS + REG_BITS))
    if not 0 <= insn.value < 1 << FLAGS_BITS:
        raise IsaError(f"{op.name} operand {insn.value} does not fit {FLAGS_BITS} bits")
    return op | (insn.value << OPCODE_BITS)


def decode(word: int) -> Insn:
    if not 0 <= word < 1 << INSN_BITS:
        raise IsaError(f"instruction word {word:#x} is not {INSN_BITS} bits")
    try:
        op = Op(word & ((1 << OPCODE_BITS) - 1))
    except ValueError:
        raise IsaError(f"unknown opcode {word & 0x3f} in {word:#018x}") from None
    if op in _REG_OPS:
        index = (word >> OPCODE_BITS) & ((1 << REG_BITS) - 1)
        value = word >> (OPCODE_BITS + REG_BITS)
        if value >> (VALUE_BITS - 1):
            value -= 1 << VALUE_BITS
        return Insn(op, index, value)
    return Insn(op, 0, word >> OPCODE_BITS)


def sign_extend(value: int, bits: int = VALUE_BITS) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def disassemble(word: int) -> str:
    insn = decode(word)
    if insn.op in _REG_OPS:
        name = REGS[insn.reg] if insn.reg < len(REGS) else f"r{insn.reg}"
        return f"{insn.op.name:<6} {name:<16} {insn.value}"
    if insn.op is Op.LOOP:
        body, count = loop_fields(insn.value)
        return f"LOOP   {body} x{count}"
    if insn.op is Op.WAIT:
        return f"WAIT   {Unit(insn.value)!r}" if insn.value else "WAIT   0"
    if insn.op in (Op.NOP, Op.HALT):
        return insn.op.name
    return f"{insn.op.name:<6} {insn.value:#x}"
