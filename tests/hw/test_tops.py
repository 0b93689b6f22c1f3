"""The registry of top-level designs (hw.tops): each top is built with its preset's sizes;
``npu fpga`` builds the chip-bearing tops without AVG's divider."""

import re

import pytest
from amaranth.back import rtlil

from hw.chip import reg_widths
from hw.fpga.board import COLL_AVG, PE_DSP, BoardTop, _ChipOnRing
from hw.fpga.units import AddrGenUnit, SequencerUnit
from hw.ring.collective import CollectiveEngine
from hw.spec import npu_preset
from hw.spec.attention import softmax_lanes
from hw.spec.isa import READ_GENS, REG_INDEX, WRITE_GENS, Insn, Op, chip_gens, encode
from hw.tops import build_top
from sim.rtl.pysim import collect, run_sim
from tests.helpers import load_and_start


def test_top_registered():
    npu = npu_preset("tiny")
    dut = build_top("attention", npu)
    assert (dut.window, dut.d_head, dut.length) == (npu.attn_window, npu.d_head_max,
                                                    npu.softmax_len)


def test_top_builder_uses_softmax_len():
    for preset in ("tiny", "fpga"):
        npu = npu_preset(preset)
        assert build_top("softmax", npu).length == npu.softmax_len


def _division_cells(design):
    return sorted(set(re.findall(r"cell \$(div\w*|mod\w*)\b", rtlil.convert(design))))


def test_collective_engine_without_avg_has_no_division():
    """The FPGA build's engine has no generic division cell (synth_ecp5 crashes on AVG's
    64-bit one: tests/hw/test_yosys_regressions.py); the default engine has AVG's."""
    assert _division_cells(CollectiveEngine(link_bytes=8)) == ["divfloor"]
    assert _division_cells(CollectiveEngine(link_bytes=8, avg=False)) == []


def test_fpga_builds_leave_out_avg():
    npu = npu_preset("tiny")
    assert build_top("tile", npu).coll_avg and not build_top("tile", npu, fpga=True).coll_avg
    assert not any(c.coll_avg for c in build_top("system", npu, fpga=True).chip)
    assert all(c.coll_avg for c in build_top("system", npu).chip)
    assert build_top("node", npu).chip.coll_avg
    assert not build_top("node", npu, fpga=True).chip.coll_avg
    assert not any(e.avg for e in build_top("ring", npu, fpga=True).engines)
    assert build_top("matmul", npu, fpga=True).size == npu.array_size


def test_fpga_builds_take_pe_products_in_dsps():
    npu = npu_preset("tiny")
    assert build_top("tile", npu, fpga=True).pe_dsp and not build_top("tile", npu).pe_dsp
    assert build_top("node", npu, fpga=True).chip.pe_dsp
    assert build_top("matmul", npu, fpga=True).pe_dsp is PE_DSP is True
    assert not build_top("matmul", npu).pe_dsp
    assert _ChipOnRing(npu).chip.pe_dsp
    assert not _ChipOnRing(npu).chip.coll_avg and not COLL_AVG


def test_ecp5_builds_instantiate_the_vector_units_dsps():
    """``npu fpga`` (an ECP5) builds the vector unit and engine, the chip and the board with
    the deep pipeline's products in MULT18X18D instances; simulation and Verilator do not."""
    npu = npu_preset("ulx3s")
    for name in ("vector", "vector_engine"):
        assert build_top(name, npu, fpga=True).ecp5_dsp and not build_top(name, npu).ecp5_dsp
    assert build_top("tile", npu, fpga=True).ecp5_dsp and not build_top("tile", npu).ecp5_dsp
    assert build_top("node", npu, fpga=True).chip.ecp5_dsp
    assert not build_top("node", npu).chip.ecp5_dsp
    assert _ChipOnRing(npu).chip.ecp5_dsp
    # The board's chip on the ECP5, not the simulated board's (Verilator has no MULT18X18D).
    assert BoardTop(npu=npu, divisor=8).ring.chip.ecp5_dsp
    assert not BoardTop(npu=npu, divisor=8, sim=True).ring.chip.ecp5_dsp


# --- the chip's units as npu fpga --top NAME builds them (the per-unit table) -----------------

def test_unit_tops_have_the_chips_sizes():
    npu = npu_preset("fpga")
    assert isinstance(build_top("sequencer", npu), SequencerUnit)
    spad = build_top("scratchpad", npu)
    reads, writes = chip_gens(1)       # a ring's chip: one collective engine's generators
    assert (len(spad.rd), len(spad.wr)) == (len(reads) + 1, len(writes) + 1)
    assert (len(spad.rd), len(spad.wr)) == (len(READ_GENS), len(WRITE_GENS))
    assert spad.addr_bits == npu.sram_addr_bits
    gens = build_top("addrgen", npu)
    assert isinstance(gens, AddrGenUnit)
    assert len(gens.signature.members) == len(reads) + len(writes)
    sm = build_top("softmax", npu)
    assert sm.length == npu.softmax_len
    assert build_top("attention_engine", npu).length == npu.softmax_len
    assert softmax_lanes(npu.softmax_len) == build_top("attention_engine", npu).lanes_per_cycle
    assert build_top("collective", npu).avg and not build_top("collective", npu, fpga=True).avg
    assert build_top("router", npu).signature.members["i_link"].signature is not None


def test_sequencer_unit_runs_a_program_from_its_memory():
    """The wrapper's instruction memory is the sequencer's: SETs, an ADD and HALT, written
    through ``imem_wr``, run to ``done``. The registers keep the bits the chip reads
    (``reg_widths``): RD0.base, ab bits, holds the low bits of the 48-bit sum, sign-extended."""
    npu = npu_preset("tiny")
    dut = SequencerUnit(npu=npu)
    base = REG_INDEX["RD0.base"]
    ab = npu.sram_addr_bits
    assert reg_widths(npu)[base] == ab and reg_widths(npu)[REG_INDEX["MM_K"]] == 16
    big = (1 << 40) + (3 << ab) + 7
    program = [encode(Insn(Op.SET, REG_INDEX["MM_K"], 12345)), encode(Insn(Op.SET, base, big)),
               encode(Insn(Op.ADD, base, -9)), encode(Insn(Op.HALT, 0, 0))]
    seen = {}

    async def bench(ctx):
        for addr, word in enumerate(program):
            ctx.set(dut.imem_wr.valid, 1)
            ctx.set(dut.imem_wr.payload.addr, addr)
            ctx.set(dut.imem_wr.payload.data, word)
            await ctx.tick()
        ctx.set(dut.imem_wr.valid, 0)
        ctx.set(dut.can_launch, 0b111111)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        await ctx.tick().until(dut.done)
        seen["error"] = ctx.get(dut.error)
        seen["k"] = ctx.get(dut.regs[REG_INDEX["MM_K"]])
        seen["base"] = ctx.get(dut.regs[base])

    run_sim(dut, [bench], max_cycles=200)
    low = (big - 9) % (1 << ab)                        # 2**ab - 2: the top bit set
    want = low - (1 << ab) if low >> (ab - 1) else low
    assert seen == {"error": 0, "k": 12345, "base": want}, seen


def test_sequencer_unit_folds_its_registers():
    """``--top sequencer`` leaves the registers as ``regs_fold``: the stored bits (each
    register's ``reg_widths`` low bits, in REGS order) XORed four at a time into flip-flops,
    and bit k the XOR of groups k, k + fold_bits, ...; a bad ``fold_bits`` is refused."""
    npu = npu_preset("tiny")
    assert "regs_fold" in build_top("sequencer", npu).signature.members
    with pytest.raises(ValueError, match="fold_bits must be a positive integer"):
        SequencerUnit(npu=npu, fold_bits=0)
    fold = 8
    dut = SequencerUnit(npu=npu, fold_bits=fold)
    widths = reg_widths(npu, chip_bits=1)
    values = {REG_INDEX["MM_K"]: 12345, REG_INDEX["RD0.base"]: -3, REG_INDEX["CO_LEN"]: 1 << 47,
              REG_INDEX["SR_DEST"]: 1}
    program = [encode(Insn(Op.SET, i, v)) for i, v in values.items()] + [encode(Insn(Op.HALT))]
    seen = {}

    async def bench(ctx):
        await load_and_start(ctx, dut, program)
        await ctx.tick().until(dut.done)
        await ctx.tick().repeat(2)          # the write-back, then the fold's flip-flops
        seen["fold"] = ctx.get(dut.regs_fold)

    run_sim(dut, [bench], max_cycles=200)
    bits = []
    for i, w in enumerate(widths):
        bits += [(values.get(i, 0) >> b) & 1 for b in range(w)]
    groups = [sum(bits[4 * j:4 * j + 4]) & 1 for j in range((len(bits) + 3) // 4)]
    want = sum((sum(groups[k::fold]) & 1) << k for k in range(fold))
    assert want != 0 and seen["fold"] == want, (seen, want)


def test_addrgen_unit_walks_each_generator():
    """Every generator of the group is wired through: a 3-address descriptor on WR3 (a wrap
    generator) and RD0 each give their addresses, ``last`` on the third."""
    dut = AddrGenUnit(npu=npu_preset("tiny"))
    got = {}

    async def bench(ctx):
        for name, base in (("gen_rd0", 10), ("gen_wr3", 40)):
            gen = getattr(dut, name)
            ctx.set(gen.i.payload.base, base)
            ctx.set(gen.i.payload.n[0], 3)
            ctx.set(gen.i.payload.s[0], 2)
            ctx.set(gen.i.valid, 1)
            await ctx.tick().until(gen.i.ready)
            ctx.set(gen.i.valid, 0)
            got[name] = [(int(p.addr), int(p.last)) for p in await collect(ctx, gen.o, 3)]

    run_sim(dut, [bench], max_cycles=200)
    assert got == {"gen_rd0": [(10, 0), (12, 0), (14, 1)],
                   "gen_wr3": [(40, 0), (42, 0), (44, 1)]}, got
