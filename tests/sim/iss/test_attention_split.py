"""The ISS's ATTN split-score passes (sim/iss/attention.py): partial rows equal the golden
``split_partials``, the reduced pass over the summed rows equals the whole head."""

import dataclasses

import numpy as np
import pytest

from hw.spec.attention import (
    FLAG_PARTIAL,
    FLAG_REDUCED,
    KNOWN_FLAGS,
    flags_value,
    partial_row_words,
    split_mode,
)
from sim.compiler.attention_launch import emit, partial_launch, reduced_launch
from sim.golden.attention import shard_sizes, split_partials
from sim.golden.float_model import attention_mask
from sim.iss import IssError
from tests.helpers import (
    SplitCase,
    assemble,
    attention_npu,
    attention_reference,
    seeded,
)


def run_both(case):
    """Pass 1 of every shard, the sum of the rows, pass 2 of every shard (ISS)."""
    case.iss.run(assemble(emit, case.partials))
    total = case.reduce()
    case.iss.run(assemble(emit, case.reduced))
    return total


def test_flags_and_row_words():
    assert flags_value(bidirectional=False, interleaved=False, split="partial") == FLAG_PARTIAL
    assert flags_value(bidirectional=True, interleaved=True, halo=3, split="reduced") == \
        1 | 2 | FLAG_REDUCED | 3 << 8
    assert [split_mode(f) for f in (0, FLAG_PARTIAL, FLAG_REDUCED)] == [None, "partial",
                                                                         "reduced"]
    assert FLAG_PARTIAL | FLAG_REDUCED <= KNOWN_FLAGS
    with pytest.raises(ValueError, match="exclusive"):
        split_mode(FLAG_PARTIAL | FLAG_REDUCED)
    with pytest.raises(ValueError, match="split must be"):
        flags_value(bidirectional=False, interleaved=False, split="both")
    # W int32 lanes in words of N bytes, the last one padded.
    assert [partial_row_words(w, n) for w, n in ((8, 4), (64, 8), (1, 8), (3, 2))] == \
        [8, 32, 1, 6]


@pytest.mark.parametrize("seed, shards", [(1, 2), (2, 3)])
def test_partial_rows_equal_golden_split_partials(seed, shards):
    """Preload, every key in the ring: shard s's row of query t is the golden partial of its
    lanes, lanes beyond the keys 0 (they hold no key of the launch)."""
    rng = seeded(seed)
    npu = attention_npu(window=8, length=8, dmax=8)
    d_head = 8 * shards
    case = SplitCase(rng, npu, queries=5, keys=6, shards=shard_sizes(d_head, shards),
                     d_model=d_head + 4, col=4)
    case.iss.run(assemble(emit, case.partials))
    head = case.sl
    for t in range(case.queries):
        want = split_partials(case.q[t, head], case.k[:, head], shards)
        for s in range(shards):
            got = case.partial_rows(s)[t]
            assert (got[:6] == want[s]).all(), f"query {t} shard {s}"
            assert (got[6:] == 0).all(), f"query {t} shard {s}: unheld lanes not 0"


@pytest.mark.parametrize("seed, kw, mask", [
    (3, {}, attention_mask(7, 0, True)),                                   # causal preload
    (4, {"bidirectional": True}, attention_mask(7, 0, False)),
    (5, {"interleaved": True, "window": 3}, attention_mask(7, 3, True)),   # ring wraps (W=4)
])
def test_reduced_pass_equals_the_whole_head(seed, kw, mask):
    """Both passes over 2 shards of a head of 8 lanes (4 + 4) give the whole head's output."""
    rng = seeded(seed)
    window = 4 if kw.get("interleaved") else 8
    npu = attention_npu(window=window, length=8)
    case = SplitCase(rng, npu, queries=7, keys=7, shards=[4, 4], d_model=12, col=4, **kw)
    run_both(case)
    want = attention_reference(case.q[:, case.sl], case.k[:, case.sl], case.v[:, case.sl], mask)
    bad = np.argwhere(case.output() != want)
    assert not len(bad), f"query {bad[0][0]} lane {bad[0][1]} differs"


def test_one_shard_is_the_normal_launch():
    """A single shard reduced with itself equals ATTN without split-score mode."""
    rng = seeded(6)
    npu = attention_npu()
    case = SplitCase(rng, npu, queries=6, keys=6, shards=[8], d_model=8)
    run_both(case)
    want = attention_reference(case.q, case.k, case.v, attention_mask(6, 0, True))
    assert (case.output() == want).all()


@pytest.mark.parametrize("change, match", [
    ({"AT_FLAGS": FLAG_PARTIAL | FLAG_REDUCED}, "exclusive"),
    ({"AT_FLAGS": 128}, "AT_FLAGS=0x80"),
])
def test_iss_rejects_bad_split_flags(change, match):
    rng = seeded(7)
    case = SplitCase(rng, attention_npu(), queries=3, keys=3, shards=[8], d_model=8)
    launch = dataclasses.replace(case.partials[0], regs={**case.partials[0].regs, **change})
    with pytest.raises(IssError, match=match):
        case.iss.run(assemble(emit, [launch]))


def test_iss_rejects_short_reduced_rows():
    """The reduced pass reads ``partial_row_words`` words per query on RD5."""
    rng = seeded(8)
    case = SplitCase(rng, attention_npu(), queries=3, keys=3, shards=[8], d_model=8)
    launch = case.reduced[0]
    short = dataclasses.replace(launch.rd5, n=(launch.rd5.n[0] - 1, 3, 1, 1))
    with pytest.raises(IssError, match="RD5 walks 21 words, the launch needs 3 rows of 8"):
        case.iss.run(assemble(emit, [dataclasses.replace(launch, rd5=short)]))


def test_launch_builders():
    common = {"size": 4, "window": 8, "d_head": 8, "queries": 3, "keys": 3}
    p = partial_launch(q_base=0, k_base=10, p_base=100, q_row_words=2, k_row_words=2,
                       p_row_words=9, **common)
    assert p.rd4 is None and p.wr1.n[:2] == (8, 3) and p.wr1.s[1] == 9
    assert p.regs["AT_FLAGS"] == FLAG_PARTIAL
    r = reduced_launch(v_base=20, r_base=100, o_base=50, v_row_words=2, o_row_words=2,
                       window_cut=2, score_mult=1, score_shift=1, out_mult=1, out_shift=1,
                       **common)
    assert r.rd3 is None and r.rd5.base == 100 and r.rd5.n[:2] == (8, 3)
    assert r.regs["AT_FLAGS"] == FLAG_REDUCED and r.regs["AT_WINDOW"] == 2
    with pytest.raises(ValueError, match="p_row_words=7 cannot hold a partial row of 8"):
        partial_launch(q_base=0, k_base=10, p_base=100, q_row_words=2, k_row_words=2,
                       p_row_words=7, **common)
    with pytest.raises(ValueError, match="r_row_words=1 cannot hold a reduced row of 8"):
        reduced_launch(v_base=20, r_base=100, o_base=50, v_row_words=2, o_row_words=2,
                       r_row_words=1, score_mult=1, score_shift=1, out_mult=1, out_shift=1,
                       **common)
