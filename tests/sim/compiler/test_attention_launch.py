"""Attention launch planning (sim.compiler.attention_launch): schedules, heads == attention_int."""

from types import SimpleNamespace

import numpy as np
import pytest

from hw.spec import ModelConfig
from hw.spec.memory import pack_rows, row_words, unpack_rows
from sim.compiler.attention_launch import emit, head_launches, plan_schedule
from sim.golden.layer import attention_int
from sim.iss import Iss
from tests.helpers import assemble, attention_npu, seeded


@pytest.mark.parametrize("seed, seq, window, causal, d_head, pos_base", [
    (10, 8, 0, True, 8, 0),        # the tiny model's shape: preload
    (11, 8, 0, False, 4, 3),       # bidirectional, narrow heads
    (12, 7, 7, False, 8, 0),       # a window that does not cut
    (13, 21, 8, True, 8, 100),     # causal window = ring over 21 tokens: interleaved
    (14, 8, 8, True, 16, 0),       # window = ring = seq, heads of d_head_max
    (15, 8, 3, True, 8, 0),        # a causal window narrower than the sequence: preload
    (16, 19, 5, True, 4, 9),       # narrower than the ring, longer sequence: interleaved
    (17, 8, 3, False, 8, 0),       # bidirectional window, preload
    (18, 19, 4, False, 8, 50),     # bidirectional window 4 over 19 tokens: halo of 3
])
def test_head_launches_equal_attention_int(seed, seq, window, causal, d_head, pos_base):
    """For what one chip runs, the ISS over every head equals ``attention_int`` bit for bit."""
    rng = seeded(seed)
    npu = attention_npu(window=8, length=8, dmax=16)
    n_heads = 3
    d_model = n_heads * d_head
    cfg = ModelConfig(n_layers=1, d_model=d_model, n_heads=n_heads, d_head=d_head, d_ff=8,
                      seq_len=seq, window=window, causal=causal)
    layer = SimpleNamespace(score_mult=int(rng.integers(20000, 60000)), score_shift=20,
                            out_mult=int(rng.integers(20000, 60000)), out_shift=23)
    q, k, v = (rng.integers(-128, 128, (seq, d_model)) for _ in range(3))
    n = npu.array_size
    rw = row_words(d_model, 1, n)
    iss = Iss(npu)
    bases = [i * seq * rw for i in range(4)]
    for base, x in zip(bases, (q, k, v), strict=False):
        iss.write_words(base, pack_rows(x, 1, n))
    iss.run(assemble(emit, head_launches(npu=npu, cfg=cfg, layer=layer, q_base=bases[0],
                                         k_base=bases[1], v_base=bases[2], o_base=bases[3],
                                         row_words=rw, pos_base=pos_base)))
    got = unpack_rows(iss.read_words(bases[3], seq * rw), seq, d_model, 1)
    want = attention_int(cfg, layer, q, k, v, pos_base)
    bad = np.argwhere(got != want)
    assert not len(bad), f"token {bad[0][0]} column {bad[0][1]}: {got[tuple(bad[0])]} vs " \
                         f"{want[tuple(bad[0])]}"


def test_plan_schedule_refuses_what_one_chip_cannot_run():
    s = plan_schedule(seq=8, window=0, causal=True, ring=8)
    assert (s.interleaved, s.halo, s.window) == (False, 0, 0)
    s = plan_schedule(seq=8, window=3, causal=False, ring=8)
    assert (s.interleaved, s.halo, s.window) == (False, 0, 3)
    s = plan_schedule(seq=20, window=8, causal=True, ring=8)
    assert (s.interleaved, s.halo, s.window) == (True, 0, 8)
    s = plan_schedule(seq=20, window=4, causal=False, ring=8)
    assert (s.interleaved, s.halo, s.window) == (True, 3, 4)
    with pytest.raises(ValueError, match="causal attention over 20 tokens with window 0"):
        plan_schedule(seq=20, window=0, causal=True, ring=8)
    with pytest.raises(ValueError, match="window of at most 8"):
        plan_schedule(seq=20, window=9, causal=True, ring=8)
    with pytest.raises(ValueError, match=r"bidirectional .* window of at most 4 \(2 window"):
        plan_schedule(seq=20, window=5, causal=False, ring=8)
