"""Sequencer (hw.tile.sequencer): what ``start`` does to the configuration registers."""

from hw.spec.isa import REG_INDEX, START_CLEARED, Insn, Op, encode
from hw.tile.sequencer import Sequencer
from sim.rtl.pysim import run_sim
from tests.helpers import load_and_start


def test_start_clears_the_lane_and_packed_b_registers():
    """Registers keep their values from one program to the next, but ``start`` clears those of
    ``START_CLEARED`` (the attention's lane offsets, the matmul's packed-B fields): a program
    that never sets them runs with the whole-word behaviour after one that did."""
    kept = "VU_LEN"
    first = [encode(Insn(Op.SET, REG_INDEX[name], 3 + k))
             for k, name in enumerate(START_CLEARED + (kept,))] + [encode(Insn(Op.HALT))]
    programs = [first, [encode(Insn(Op.HALT))]]
    words = max(len(p) for p in programs)
    dut = Sequencer(imem_words=words)
    after = []

    async def bench(ctx):
        for program in programs:
            await load_and_start(ctx, dut, program)
            await ctx.tick().until(dut.done)
            assert not ctx.get(dut.error)
            after.append({name: ctx.get(dut.regs[REG_INDEX[name]])
                          for name in START_CLEARED + (kept,)})

    run_sim(dut, [bench], max_cycles=200)
    assert after[0] == {name: 3 + k for k, name in enumerate(START_CLEARED + (kept,))}
    assert after[1] == {**dict.fromkeys(START_CLEARED, 0), kept: 3 + len(START_CLEARED)}, after
