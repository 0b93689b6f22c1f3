"""The ISS's ATTN with state rows (long context, sim/iss/attention.py): a head's keys in
chunks, one launch each (first, middles, last), equals the golden ``chunked_attention``."""

import numpy as np
import pytest

from hw.spec.attention import (
    FLAG_PARTIAL,
    FLAG_STATE_IN,
    FLAG_STATE_OUT,
    flags_value,
    q_row_words,
    state_mode,
    state_words,
)
from sim.compiler.attention_launch import emit, state_launch, state_row_words
from sim.iss import IssError
from tests.helpers import assemble, attention_npu, state_case


def test_flags_and_words():
    assert flags_value(bidirectional=False, interleaved=False, state_out=True) == FLAG_STATE_OUT
    both = flags_value(bidirectional=True, interleaved=False, state_in=True, state_out=True)
    assert state_mode(both) == "middle" and state_mode(FLAG_STATE_IN) == "last"
    assert state_mode(FLAG_STATE_OUT) == "first" and state_mode(0) is None
    with pytest.raises(ValueError, match="exclude"):
        state_mode(FLAG_STATE_IN | FLAG_PARTIAL)
    with pytest.raises(ValueError, match="exclusive"):
        flags_value(bidirectional=False, interleaved=False, split="partial", state_in=True)
    assert state_words(8, 4) == 10 and state_words(64, 8) == 33 and state_words(6, 16) == 2
    with pytest.raises(ValueError, match="multiple of 4"):
        state_words(8, 6)
    regs = {"AT_FLAGS": FLAG_STATE_IN, "AT_D_HEAD": 6, "AT_Q_LANE": 3}
    assert q_row_words(regs, 4) == 3 + 8
    assert state_row_words(6, 7, 4) == 3 + 8


@pytest.mark.parametrize("seed, npu_kw, queries, chunks, kw, causal", [
    (40, {}, 8, [(0, 8), (8, 16), (16, 24)], {}, False),                     # bidirectional
    (41, {}, 8, [(16, 24), (8, 16), (0, 8)], {"q_pos": 16}, True),           # the last block
    (42, {"window": 6, "length": 8}, 5, [(0, 6), (6, 9)], {}, False),        # ragged, L > W
    (43, {"size": 8, "dmax": 16}, 6, [(0, 8), (8, 14)], {}, False),          # N = 8
    (44, {}, 4, [(0, 8), (8, 16)], {"d_head": 6, "col": 7, "k_col": 2,
                                    "v_col": 13, "d_model": 20}, False),     # packed lanes
    (45, {}, 6, [(14, 20), (10, 14), (5, 10), (0, 5)], {"q_pos": 14}, True),  # 2 middles
])
def test_chunks_equal_the_golden(seed, npu_kw, queries, chunks, kw, causal):
    case, _ = state_case(seed, npu_kw, queries, chunks, kw, causal)
    got = case.run_iss()
    bad = np.argwhere(got != case.want)
    assert not len(bad), f"query {bad[0][0]} lane {bad[0][1]}: {got[tuple(bad[0])]}, " \
        f"golden {case.want[tuple(bad[0])]}"


def test_state_rows_need_whole_lanes():
    npu = attention_npu(size=6, window=4, length=4)
    launch = state_launch(mode="first", size=4, d_head=4, queries=2, keys=2, q_base=0,
                          q_row_words=1, col=0, k_base=0, v_base=0, k_row_words=1,
                          v_row_words=1, k_col=0, v_col=0, s_base=64, score_mult=1,
                          score_shift=1, out_mult=1, out_shift=1)
    from sim.iss import Iss
    with pytest.raises(IssError, match="multiple of 4 bytes"):
        Iss(npu).run(assemble(emit, [launch]))
