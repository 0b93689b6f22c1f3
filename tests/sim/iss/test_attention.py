"""The ISS's attention executor (sim.iss.attention): inconsistent ATTN registers are refused."""

import dataclasses

import numpy as np
import pytest

from sim.compiler.attention_launch import emit
from sim.iss import IssError
from tests.helpers import AttentionCase, assemble, attention_npu


@pytest.mark.parametrize("reg, value, match", [
    ("AT_QUERIES", 0, "AT_QUERIES=0"),
    ("AT_KEYS", 0, "AT_KEYS=0"),
    ("AT_D_HEAD", 0, "AT_D_HEAD=0"),
    ("AT_D_HEAD", 16, "AT_D_HEAD=16"),
    ("AT_Q_LANE", 4, "AT_Q_LANE=4"),
    ("AT_O_LANE", -1, "AT_O_LANE=-1"),
    ("AT_K_LANE", 2, "RD3 walks 6 words, the launch needs 3 rows of 3 words"),
    ("AT_FLAGS", 16, "AT_FLAGS=0x10"),
    ("AT_FLAGS", 2 | (9 << 8), "halo 9"),
    ("AT_FLAGS", 5 << 8, "needs the interleaved schedule"),
    ("AT_WINDOW", -1, "AT_WINDOW=-1"),
    ("AT_Q_POS", 65534, "AT_Q_POS=65534"),
    ("AT_OUT_SHIFT", 0, "AT_OUT_SHIFT=0"),
    ("AT_SCORE_MULT", 1 << 16, "AT_SCORE_MULT=65536"),
    ("AT_KEYS", 5, "RD3 walks 6 words, the launch needs 5 rows"),
    ({"AT_FLAGS": 2, "AT_QUERIES": 2}, None, "AT_KEYS=3 > halo 0 \\+ AT_QUERIES=2"),
])
def test_iss_rejects_inconsistent_registers(reg, value, match):
    rng = np.random.default_rng(6)
    case = AttentionCase(rng, attention_npu(), queries=3, keys=3, d_model=8, col=0, d_head=8)
    change = reg if isinstance(reg, dict) else {reg: value}
    program = assemble(emit, [dataclasses.replace(case.launch, regs={**case.launch.regs,
                                                                     **change})])
    with pytest.raises(IssError, match=match):
        case.iss.run(program)
