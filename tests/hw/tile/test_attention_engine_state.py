"""AttentionEngine with state rows (long context, hw.tile.attention_engine): a head's keys in
chunks, the partial softmax, the merge and the final normalisation; RTL == ISS == golden,
exact cycles, random idle and backpressure. One short causal run (about 2 s of pysim) per
``attention_pipeline`` is in the default suite; the others are slow."""

import pytest

from hw.tile.attention_engine import AttentionEngine
from sim.rtl.attention_engine_driver import run_attention_engine
from tests.helpers import assert_memories_equal, state_case


@pytest.mark.parametrize("seed, npu_kw, queries, chunks, kw, causal", [
    pytest.param(50, {}, 6, [(0, 8), (8, 16), (16, 24)], {}, False, marks=pytest.mark.slow),
    (51, {}, 6, [(12, 18), (6, 12), (0, 6)], {"q_pos": 12}, True),
    (51, {"pipeline": "deep"}, 6, [(12, 18), (6, 12), (0, 6)], {"q_pos": 12}, True),
    pytest.param(52, {"size": 8, "dmax": 16, "pipeline": "deep"}, 5, [(0, 8), (8, 13)],
                 {"d_head": 12, "d_model": 16, "col": 2}, False, marks=pytest.mark.slow),
    pytest.param(52, {"size": 8, "dmax": 16}, 5, [(0, 8), (8, 13)],
                 {"d_head": 12, "d_model": 16, "col": 2}, False, marks=pytest.mark.slow),
    pytest.param(53, {}, 4, [(0, 8), (8, 16)], {"d_head": 6, "col": 7, "k_col": 2,
                                                "v_col": 13, "d_model": 20}, False,
                 marks=pytest.mark.slow),
])
def test_engine_equals_iss(seed, npu_kw, queries, chunks, kw, causal):
    """First, middle and last launches under random idle and backpressure: the engine's
    memory (state rows and the output) equals the ISS's, whose output equals the golden."""
    case, rng = state_case(seed, npu_kw, queries, chunks, kw, causal)
    got = case.run_iss()
    assert (got == case.want).all(), "ISS differs from the golden"
    assert_memories_equal(run_chunks(case, rng), case.iss.mem)


def run_chunks(case, rng, **kw):
    """The engine runs the launches one after the other, each reading what the previous one
    wrote (the driver streams a launch's words from the memory it starts with)."""
    mem = case.before
    kw = {"idle": 0.25, "stall": 0.25, **kw}
    for launch in case.launches:
        mem, _, _ = run_attention_engine(AttentionEngine.for_npu(case.npu), mem, [launch],
                                         addr_bits=case.iss.addr_bits, rng=rng,
                                         max_cycles=40_000, **kw)
    return mem


@pytest.mark.slow
@pytest.mark.parametrize("seed, npu_kw, queries, chunks, kw", [
    (60, {}, 6, [(0, 8), (8, 16), (16, 24)], {}),
    (61, {"window": 4, "length": 4}, 9, [(0, 4), (4, 8), (8, 12)], {}),       # W = 4
    (62, {"size": 8, "dmax": 16}, 5, [(0, 8), (8, 13)], {"d_head": 16, "d_model": 16}),
    (63, {"window": 3, "length": 6}, 5, [(0, 3), (3, 6)], {"d_head": 4, "col": 6,
                                                           "k_col": 1, "d_model": 12}),
    (60, {"pipeline": "deep"}, 6, [(0, 8), (8, 16), (16, 24)], {}),
    (62, {"size": 8, "dmax": 16, "pipeline": "deep"}, 5, [(0, 8), (8, 13)],
     {"d_head": 16, "d_model": 16}),
])
def test_cycles(seed, npu_kw, queries, chunks, kw):
    """Every word at once and WR1 always ready: each launch takes exactly ``launch_cycles``
    (the closed form ``state_cycles`` where it holds); with random idle and backpressure
    never fewer."""
    from hw.spec.timing.attention import launch_cycles, state_cycles
    case, rng = state_case(seed, npu_kw, queries, chunks, kw, False)
    npu = case.npu
    timing = {"window": npu.attn_window, "length": npu.softmax_len, "size": npu.array_size,
              "d_head": npu.d_head_max, "pipeline": npu.attention_pipeline}
    mem = case.before
    for i, launch in enumerate(case.launches):
        before = mem
        mem, cycles, _ = run_attention_engine(AttentionEngine.for_npu(npu), mem, [launch],
                                              addr_bits=case.iss.addr_bits)
        want = launch_cycles(launch.regs, **timing)
        assert cycles == want, f"launch {i}: {cycles} cycles, launch_cycles {want}"
        assert state_cycles(launch.regs, **timing) == want, f"launch {i}: closed form"
        _, slow, _ = run_attention_engine(AttentionEngine.for_npu(npu), before, [launch],
                                          addr_bits=case.iss.addr_bits, rng=rng, idle=0.3,
                                          stall=0.3)
        assert slow >= want, f"launch {i}: {slow} cycles with stalls, below {want}"
