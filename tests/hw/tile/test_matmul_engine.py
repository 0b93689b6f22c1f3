"""MatmulEngine (hw.tile.matmul_engine) on a compiled MATMUL launch: RTL memory == ISS == golden."""

import numpy as np
import pytest

from hw.spec.formats import OutMode
from hw.spec.memory import (
    pack_params,
    pack_rows,
    pack_weight_blocks,
    row_words,
    unpack_rows,
    weight_words,
)
from hw.tile.matmul_engine import MatmulEngine
from sim.compiler.descriptors import emit_matmul, matmul_launch
from sim.golden.matmul import matmul_unit
from sim.golden.scratchpad import addr_sequence
from sim.iss import Iss
from sim.rtl.pysim import collect, run_sim, send_all, stream_put
from tests.helpers import (
    assemble,
    assert_memories_equal,
    byte_beat,
    matmul_operands,
    seeded,
    square_npu,
    word_beat,
    words_of,
)


def setup(rng, size, m, k, n, mode, a_unsigned=False, kr=None, packed=False):
    """A [m, k] @ B [kr, n]: A's columns past ``kr`` are garbage (the zero B rows past
    MM_B_ROWS cancel them); ``packed``: B's last column block stored packed."""
    iss = Iss(square_npu(size, sram_words=1024))
    kr = k if kr is None else kr
    a, b, bias, mult = matmul_operands(rng, m, k, n, a_unsigned=a_unsigned)
    b = b[:kr]
    shift = rng.integers(12, 30, n)
    arw = row_words(k, 1, size)
    eb = {OutMode.INT8: 1, OutMode.INT16: 2, OutMode.RAW: 4}[mode]
    ncols = -(-n // size) * size   # C rows hold whole column blocks
    crw = row_words(ncols, eb, size)
    a_base, b_base = 0, m * arw
    weights = pack_weight_blocks(b, size, packed=packed)
    assert len(weights) == weight_words(kr, n, size, packed=packed)
    p_base = b_base + len(weights)
    c_base = p_base + len(pack_params(bias, mult, shift, size))
    iss.write_words(a_base, pack_rows(np.where(a > 127, a - 256, a), 1, size))
    iss.write_words(b_base, weights)
    iss.write_words(p_base, pack_params(bias, mult, shift, size))
    launch = matmul_launch(size=size, m=m, k=k, n=n, a_base=a_base, a_row_words=arw,
                           b_base=b_base, p_base=p_base, c_base=c_base, c_row_words=crw,
                           mode=mode, a_unsigned=a_unsigned, b_rows=kr, packed=packed)
    want = matmul_unit(a[:, :kr], b, bias, mult, shift, mode, a_unsigned=a_unsigned)
    return iss, launch, want, (c_base, m, ncols, eb)


@pytest.mark.parametrize("seed, size, m, k, n, mode, a_unsigned, kr, packed", [
    (1, 4, 8, 8, 6, OutMode.INT8, False, None, False),
    (2, 4, 4, 12, 9, OutMode.INT16, True, None, False),
    (3, 4, 8, 4, 4, OutMode.RAW, False, None, False),
    (4, 2, 6, 4, 3, OutMode.INT16, False, None, False),
    (5, 4, 8, 12, 11, OutMode.INT8, False, 10, True),    # B 10 x 11: packed block of 3
    (6, 4, 4, 16, 5, OutMode.INT16, True, 13, True),     # packed block of 1 lane
    (7, 4, 8, 8, 2, OutMode.RAW, False, 7, True),        # only a packed block
    (8, 4, 4, 8, 8, OutMode.INT8, False, 5, True),       # whole blocks: b_rows alone
])
def test_engine_equals_iss_and_golden(seed, size, m, k, n, mode, a_unsigned, kr, packed):
    """A matmul launch, B whole or stored unpadded (``kr`` rows of the k beats, the last
    column block packed): RTL memory == ISS == golden."""
    rng = seeded(seed)
    iss, launch, want, (c_base, rows, cols, eb) = setup(rng, size, m, k, n, mode, a_unsigned,
                                                        kr, packed)
    before = iss.mem.copy()
    iss.run(assemble(emit_matmul, [launch]))
    got_iss = unpack_rows(iss.read_words(c_base, rows * row_words(cols, eb, size)), rows, cols,
                          eb)[:, :want.shape[1]]
    bad = np.argwhere(got_iss != want)
    assert not len(bad), f"ISS row {bad[0][0]} col {bad[0][1]}: {got_iss[tuple(bad[0])]}"

    dut = MatmulEngine(size=size)
    ab = iss.addr_bits
    streams = {name: [word_beat(w) for w in words_of(before, getattr(launch, gen), ab)]
               for name, gen in (("i_a", "rd0"), ("i_b", "rd1"), ("i_p", "rd2"))}
    total = launch.wr0.total
    out = []

    async def control(ctx):
        await stream_put(ctx, dut.i_cfg, {"k": launch.k, "folds": launch.folds,
                                          "mode": int(launch.mode),
                                          "a_unsigned": int(launch.a_unsigned),
                                          "b_rows": launch.b_rows,
                                          "b_blocks": launch.b_blocks,
                                          "b_last": launch.b_last})

    async def drain(ctx):
        out.extend(await collect(ctx, dut.o, total, rng=rng, stall=0.2, convert=byte_beat))
        for _ in range(3):
            await ctx.tick()
        assert not ctx.get(dut.busy), "engine still busy after its last word"

    benches = [control, drain]
    for name in streams:
        async def bench(ctx, name=name):
            await send_all(ctx, getattr(dut, name), streams[name], rng=rng, idle=0.2)
        benches.append(bench)
    run_sim(dut, benches, max_cycles=20_000)
    mem = before.copy()
    mem[addr_sequence(launch.wr0.base, launch.wr0.n, launch.wr0.s, ab)] = \
        np.array([w for w, _ in out], np.uint8)
    assert [last for _, last in out] == [0] * (total - 1) + [1]
    assert_memories_equal(mem, iss.mem)


def test_back_to_back_launches_with_different_shapes():
    """Three launches, each configured the cycle the previous one ends, with a different mode,
    K, B rows and packing: the registers that hold the counters' tests (the fold's last beat,
    zero rows, the packed block, a row's last output word) start over from each launch's
    configuration. Words out == the ISS's, launch by launch, under random stalls. (As in the
    chip, a launch's words are offered once it is configured: its generators start then.)"""
    rng = seeded(9)
    cases = [(4, 8, 12, 11, OutMode.RAW, False, 10, True),
             (4, 4, 8, 8, OutMode.INT8, True, None, False),
             (4, 8, 4, 6, OutMode.INT16, False, 3, True)]
    streams = {"i_a": [], "i_b": [], "i_p": []}      # per stream, per launch
    cfgs, want = [], []
    for size, m, k, n, mode, a_unsigned, kr, packed in cases:
        iss, launch, _, _ = setup(rng, size, m, k, n, mode, a_unsigned, kr, packed)
        before = iss.mem.copy()
        iss.run(assemble(emit_matmul, [launch]))
        ab = iss.addr_bits
        for name, gen in (("i_a", "rd0"), ("i_b", "rd1"), ("i_p", "rd2")):
            streams[name].append([word_beat(w)
                                  for w in words_of(before, getattr(launch, gen), ab)])
        wr = launch.wr0
        want.append([[int(x) for x in iss.mem[a]]
                     for a in addr_sequence(wr.base, wr.n, wr.s, ab)])
        cfgs.append({"k": launch.k, "folds": launch.folds, "mode": int(launch.mode),
                     "a_unsigned": int(launch.a_unsigned), "b_rows": launch.b_rows,
                     "b_blocks": launch.b_blocks, "b_last": launch.b_last})
    dut = MatmulEngine(size=4)
    got, started = [], []

    async def control(ctx):
        for cfg in cfgs:
            await stream_put(ctx, dut.i_cfg, cfg)
            started.append(True)

    async def drain(ctx):
        for words in want:
            got.append(await collect(ctx, dut.o, len(words), rng=rng, stall=0.3,
                                     convert=byte_beat))

    benches = [control, drain]
    for name in streams:
        async def bench(ctx, name=name):
            for i, words in enumerate(streams[name]):
                while len(started) <= i:
                    await ctx.tick()
                await send_all(ctx, getattr(dut, name), words, rng=rng, idle=0.2)
        benches.append(bench)
    run_sim(dut, benches, max_cycles=20_000)
    for i, (words, out) in enumerate(zip(want, got, strict=True)):
        assert [last for _, last in out] == [0] * (len(words) - 1) + [1], f"launch {i}"
        for w, (a, (b, _)) in enumerate(zip(words, out, strict=True)):
            assert b == a, f"launch {i} word {w}: {b} != ISS {a}"
