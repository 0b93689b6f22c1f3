"""AttentionBuffer (hw.tile.attention) vs the golden sim.golden.attention; cycles, Verilator."""

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, Signal

from hw.spec import npu_preset
from hw.spec.timing.chip import (
    ATTN_DOT_CYCLES,
    ATTN_PARTIAL_CYCLES,
    ATTN_PV_CYCLES,
    ATTN_REDUCED_CYCLES,
)
from hw.tile.attention import AttentionBuffer
from hw.tops import build_top
from sim.golden.attention import (
    KV,
    KVRing,
    Query,
    run_sequence,
    shard_sizes,
    split_partials,
)
from sim.golden.matmul import wrap
from sim.rtl.attention_driver import kv_payload, q_payload, run_attention
from sim.rtl.pysim import run_sim, stream_get, stream_put
from tests.helpers import exported_verilog, seeded

W, D, L = 16, 8, 16  # the tiny preset's window and softmax length; a small d_head
IDLE, STALL = 0.3, 0.3
# A realistic score scale: |q.k| up to ~2**17 maps to a few units of SCORE_FRAC_BITS fixed point.
MULT, SHIFT = 45000, 19


def rand_i8(rng, *shape):
    return rng.integers(-128, 128, size=shape)


def token(rng, pos, *, first=False, d=D):
    return KV(rand_i8(rng, d), rand_i8(rng, d), pos, first=first)


def query(rng, pos, *, d=D, **kw):
    kw.setdefault("mult", MULT)
    kw.setdefault("shift", SHIFT)
    return Query(rand_i8(rng, d), pos, **kw)


def prefill(rng, positions, *, first=True, d=D, **qkw):
    """Write token t then query t, for each position (a causal prefill or decode)."""
    cmds = []
    for i, pos in enumerate(positions):
        cmds.append(token(rng, pos, first=first and i == 0, d=d))
        cmds.append(query(rng, pos, last=i == len(positions) - 1, d=d, **qkw))
    return cmds


def prob_table(rng, n):
    """Random probabilities on every lane, masked ones included: the unit must ignore those."""
    table = rng.integers(0, 256, size=(n, L))
    return lambda i, scores, mask: table[i]


def check(got, exp, keys=("partial", "scores", "mask", "out")):
    assert len(got) == len(exp), f"{len(got)} queries answered, {len(exp)} expected"
    for n, (g, e) in enumerate(zip(got, exp, strict=True)):
        for key in keys:
            if key not in e:
                continue
            bad = np.flatnonzero(np.asarray(g[key]) != np.asarray(e[key]))
            assert bad.size == 0, (f"query {n} {key} lane {bad[0]}: rtl {g[key][bad[0]]} != "
                                   f"golden {e[key][bad[0]]} (rtl {list(g[key])}, golden "
                                   f"{list(e[key])})")
        for key in ("scores_last", "out_last"):
            assert g[key] == int(e["last"]), f"query {n} {key}: {g[key]} != {int(e['last'])}"


def run_and_check(cmds, rng, *, window=W, d_head=D, length=L, reduced_fn=None, idle=IDLE,
                  stall=STALL, pipeline="short"):
    n = sum(isinstance(c, Query) for c in cmds)
    probs_fn = prob_table(rng, n)
    exp = run_sequence(cmds, window=window, d_head=d_head, length=length, probs_fn=probs_fn,
                       reduced_fn=reduced_fn)
    dut = AttentionBuffer(window=window, d_head=d_head, length=length, pipeline=pipeline)
    got, _ = run_attention(dut, cmds, probs_fn=probs_fn, reduced_fn=reduced_fn, rng=rng,
                           idle=idle, stall=stall, max_cycles=20_000)
    check(got, exp)
    return got, exp


# --- functional, with random idle and backpressure on every stream ---------------------------

def test_sequence_shorter_than_window(rng):
    """Window larger than the sequence so far: only the written keys are visible."""
    _, exp = run_and_check(prefill(rng, range(6)), rng)
    assert [int(e["mask"].sum()) for e in exp] == [1, 2, 3, 4, 5, 6]


def test_sequence_longer_than_window_wraps(rng):
    """40 tokens through a 16-slot ring: keys older than W are overwritten and masked."""
    _, exp = run_and_check(prefill(rng, range(40)), rng)
    assert all(int(e["mask"].sum()) == min(t + 1, W) for t, e in enumerate(exp))


def test_halo_injection_with_position_base(rng):
    """A chip whose chunk starts at 40 first receives its neighbour's last W-1 tokens."""
    base = 40
    cmds = [token(rng, pos, first=pos == base - W + 1) for pos in range(base - W + 1, base)]
    cmds += prefill(rng, range(base, base + 5), first=False)
    # A new chunk (another head or layer) restarts the ring, with its own halo of 3 tokens.
    cmds += [token(rng, pos, first=pos == 997) for pos in range(997, 1000)]
    cmds += prefill(rng, range(1000, 1003), first=False)
    _, exp = run_and_check(cmds, rng)
    assert [int(e["mask"].sum()) for e in exp] == [W] * 5 + [4, 5, 6]


def test_bidirectional_back_to_back(rng):
    """All held keys visible; queries issued back to back overlap score and P.V sweeps."""
    cmds = [token(rng, pos, first=pos == 100) for pos in range(100, 112)]
    cmds += [query(rng, pos, bidirectional=True, last=pos == 111) for pos in range(100, 112)]
    cmds += [query(rng, 104)]  # a causal query on the same keys: 5 visible
    _, exp = run_and_check(cmds, rng)
    assert [int(e["mask"].sum()) for e in exp] == [12] * 12 + [5]


def test_queries_away_from_the_newest_key(rng):
    """Causal queries behind and ahead of the keys held (the window's both edges), then a
    restart with fewer than W tokens: the stale slots of the previous sequence stay masked."""
    cmds = [token(rng, pos, first=pos == 100) for pos in range(100, 116)]
    cmds += [query(rng, pos) for pos in (99, 100, 107, 115, 116, 120, 130, 131)]
    cmds += [token(rng, pos, first=pos == 0) for pos in range(3)]
    cmds += [query(rng, 2), query(rng, 2, bidirectional=True), query(rng, 1)]
    _, exp = run_and_check(cmds, rng)
    assert [int(e["mask"].sum()) for e in exp] == [0, 1, 8, 16, 15, 11, 1, 0, 3, 3, 2]


@pytest.mark.parametrize("pipeline", ["short", "deep"])
def test_score_requant_saturates(rng, pipeline):
    """Extreme Q.K with a large scale saturates to int16 both ways, never wraps (the deep
    pipeline's clamp by bit tests too, a split query's reduced row as well)."""
    k = np.array([127, -128] * (D // 2))
    cmds = [KV(k, rand_i8(rng, D), 0, first=True), KV(k[::-1], rand_i8(rng, D), 1),
            KV(k // 64, rand_i8(rng, D), 2)]
    q = np.array([127, -128] * (D // 2))
    cmds += [Query(q, 2, mult=65535, shift=1), Query(q, 2, mult=65535, shift=12),
             Query(q, 2, mult=1, shift=47), Query(q, 2, mult=65535, shift=1, split=True)]
    _, exp = run_and_check(cmds, rng, reduced_fn=lambda n, raw: raw, pipeline=pipeline)
    assert exp[0]["scores"][0] == 32767 and exp[0]["scores"][1] == -32768
    assert exp[3]["scores"][0] == 32767 and exp[3]["scores"][1] == -32768


@pytest.mark.parametrize("pipeline", ["short", "deep"])
@pytest.mark.parametrize("window, d_head, length", [(5, 4, 8), (1, 1, 1), (3, 2, 3)])
def test_other_sizes(rng, window, d_head, length, pipeline):
    """L > W (lanes W..L-1 always masked and 0), W not a power of two, and a one-slot ring;
    a split query's reduced row through the requantiser (the deep pipeline rotates it)."""
    cmds = []
    for t in range(9):
        cmds += [token(rng, t, first=t == 0, d=d_head), query(rng, t, d=d_head)]
    cmds += [query(rng, 8, d=d_head, bidirectional=True),
             query(rng, 8, d=d_head, split=True, last=True)]
    n = sum(isinstance(c, Query) for c in cmds)
    table = rng.integers(0, 256, size=(n, length))
    exp = run_sequence(cmds, window=window, d_head=d_head, length=length,
                       probs_fn=lambda i, s, m: table[i])
    dut = AttentionBuffer(window=window, d_head=d_head, length=length, pipeline=pipeline)
    got, _ = run_attention(dut, cmds, probs_fn=lambda i, s, m: table[i],
                           reduced_fn=lambda i, raw: raw, rng=rng, idle=IDLE, stall=STALL)
    check(got, exp)
    assert all(not e["mask"][window:].any() for e in exp)
    assert [int(e["mask"].sum()) for e in exp[:9]] == [min(t + 1, window) for t in range(9)]


# --- split-score mode: d_head split across 2 or 3 units, reduced by the testbench ------------

class _Units(Elaboratable):
    def __init__(self, units):
        self.units = units
        self.cycles = Signal(32)

    def elaborate(self, platform):
        m = Module()
        for i, unit in enumerate(self.units):
            m.submodules[f"unit{i}"] = unit
        m.d.sync += self.cycles.eq(self.cycles + 1)
        return m


def _pad(cmd):
    """A command of a head narrower than D, zero-padded to D lanes."""
    def pad(x):
        return np.concatenate([x, np.zeros(D - len(x), dtype=np.int64)])

    if isinstance(cmd, KV):
        return KV(pad(cmd.k), pad(cmd.v), cmd.pos, first=cmd.first)
    return Query(pad(cmd.q), cmd.pos, cmd.mult, cmd.shift, cmd.bidirectional, cmd.split,
                 cmd.last)


def _shard(x, lo, hi):
    """A shard of the d_head lanes, placed first, zeros elsewhere (what each chip holds)."""
    out = np.zeros_like(x)
    out[:hi - lo] = x[lo:hi]
    return out


@pytest.mark.parametrize("shards", [2, 3])
def test_split_score_shards_equal_unsplit(rng, shards):
    """Uneven d_head shards: partials match per shard, sum to the unsplit raw scores, and the
    scores and P.V (concatenated over the shards) equal the unsplit unit's, bit for bit."""
    head = D - 1  # a head narrower than the datapath: lane D-1 is padding on every unit
    cmds = [_pad(c) for c in prefill(rng, range(18), d=head, split=True)]
    n = sum(isinstance(c, Query) for c in cmds)
    probs_fn = prob_table(rng, n)
    exp = run_sequence(cmds, window=W, d_head=D, length=L, probs_fn=probs_fn)  # unsplit
    sizes = shard_sizes(head, shards)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    assert len(set(sizes)) > 1, "shards must be uneven"
    units = [AttentionBuffer(window=W, d_head=D, length=L) for _ in range(shards)]
    top = _Units(units)
    got = [[{} for _ in range(n)] for _ in range(shards)]
    rngs = [np.random.default_rng(s) for s in rng.integers(0, 2**32, size=2 * shards + 1)]

    def shard_cmd(cmd, s):
        lo, hi = bounds[s], bounds[s + 1]
        if isinstance(cmd, KV):
            return KV(_shard(cmd.k, lo, hi), _shard(cmd.v, lo, hi), cmd.pos, first=cmd.first)
        return Query(_shard(cmd.q, lo, hi), cmd.pos, cmd.mult, cmd.shift, split=True,
                     last=cmd.last)

    def sequencer(s):
        async def bench(ctx):
            for cmd in cmds:
                c = shard_cmd(cmd, s)
                if isinstance(c, KV):
                    await stream_put(ctx, units[s].i_kv, kv_payload(c), rng=rngs[s], idle=IDLE)
                else:
                    await stream_put(ctx, units[s].i_q, q_payload(c), rng=rngs[s], idle=IDLE)
        return bench

    def collector(s):
        async def bench(ctx):
            for i in range(n):
                o = await stream_get(ctx, units[s].o_out, rng=rngs[shards + s], stall=STALL)
                got[s][i]["out"] = np.array([int(o.data[d]) for d in range(D)])
        return bench

    async def reducer(ctx):
        r = rngs[-1]
        for i in range(n):
            total = np.zeros(L, dtype=np.int64)
            for s in range(shards):
                p = await stream_get(ctx, units[s].o_partial, rng=r, stall=STALL)
                got[s][i]["partial"] = np.array([int(p.data[j]) for j in range(L)])
                total = wrap(total + got[s][i]["partial"])
            for s in range(shards):
                await stream_put(ctx, units[s].i_reduced,
                                 {"data": [int(x) for x in total], "last": 0}, rng=r, idle=IDLE)
            for s in range(shards):
                sc = await stream_get(ctx, units[s].o_scores, rng=r, stall=STALL)
                got[s][i]["scores"] = np.array([int(sc.data[j]) for j in range(L)])
                got[s][i]["mask"] = np.array([int(sc.mask[j]) for j in range(L)])
            probs = probs_fn(i, None, None)
            for s in range(shards):
                await stream_put(ctx, units[s].i_probs,
                                 {"data": [int(x) for x in probs], "last": 0}, rng=r, idle=IDLE)

    run_sim(top, [*(sequencer(s) for s in range(shards)), *(collector(s) for s in range(shards)),
                  reducer], max_cycles=20_000)

    for i, e in enumerate(exp):
        for s in range(shards):
            g = got[s][i]
            assert np.array_equal(g["scores"], e["scores"]), (
                f"shard {s} query {i} scores: {list(g['scores'])} != {list(e['scores'])}")
            assert np.array_equal(g["mask"], e["mask"]), f"shard {s} query {i} mask"
            lo, hi = bounds[s], bounds[s + 1]
            assert np.array_equal(g["out"][:hi - lo], e["out"][lo:hi]), (
                f"shard {s} query {i} out: {list(g['out'])} != {list(e['out'][lo:hi])}")
            assert not g["out"][hi - lo:].any(), f"shard {s} query {i} out: padding lanes"
    _check_partials(cmds, got, bounds, shards)


def _check_partials(cmds, got, bounds, shards):
    """Each shard's partial row equals the golden partial of its lanes (split_partials), and the
    RTL partials summed with int32 wrap-around equal the unsplit raw scores."""
    ring = KVRing(window=W, d_head=D, length=L)
    i = 0
    for cmd in cmds:
        if isinstance(cmd, KV):
            ring.write(cmd.k, cmd.v, cmd.pos, first=cmd.first)
            continue
        parts = split_partials(cmd.q[:bounds[-1]], ring.keys[:, :bounds[-1]], shards)
        rtl_sum = wrap(sum(got[s][i]["partial"] for s in range(shards)))
        bad = np.flatnonzero(rtl_sum != ring.raw_scores(cmd.q))
        assert bad.size == 0, f"query {i} lane {bad[:1]}: summed RTL partials != unsplit raw"
        for s in range(shards):
            bad = np.flatnonzero(got[s][i]["partial"] != parts[s])
            assert bad.size == 0, (f"shard {s} query {i} partial lane {bad[0]}: rtl "
                                   f"{got[s][i]['partial'][bad[0]]} != golden {parts[s][bad[0]]}")
        i += 1


# --- cycle counts --------------------------------------------------------------------------

def test_cycles_match_documented_formula(rng):
    """With every stream ready, latencies and per-query periods equal the docstring's formulas."""
    cmds = prefill(rng, range(5))
    cmds += prefill(rng, range(5, 8), split=True, first=False)
    cmds += [query(rng, 7, bidirectional=True) for _ in range(4)]
    n = sum(isinstance(c, Query) for c in cmds)
    probs_fn = prob_table(rng, n)
    exp = run_sequence(cmds, window=W, d_head=D, length=L, probs_fn=probs_fn,
                       reduced_fn=lambda i, raw: raw)
    got, _ = run_attention(AttentionBuffer(window=W, d_head=D, length=L), cmds,
                           probs_fn=probs_fn, reduced_fn=lambda i, raw: raw)
    check(got, exp)
    for i, g in enumerate(got):
        split = i in (5, 6, 7)
        if split:
            assert g["t_partial"] - g["t_q"] == W + ATTN_PARTIAL_CYCLES, f"query {i}"
            assert g["t_scores"] - g["t_reduced"] == W + ATTN_REDUCED_CYCLES, f"query {i}"
        else:
            assert g["t_scores"] - g["t_q"] == W + ATTN_DOT_CYCLES, f"query {i}"
        assert g["t_out"] - g["t_probs"] == W + ATTN_PV_CYCLES, f"query {i}"
    # Interleaved causal prefill (write t, query t): one token every 2W + 11 cycles.
    periods = [got[i + 1]["t_q"] - got[i]["t_q"] for i in range(4)]
    assert periods == [2 * W + ATTN_DOT_CYCLES + ATTN_PV_CYCLES + 3] * 4, periods
    # Back-to-back queries: the next score sweep overlaps this query's P.V sweep.
    periods = [got[i + 1]["t_q"] - got[i]["t_q"] for i in range(8, 11)]
    assert periods == [W + ATTN_DOT_CYCLES + 1] * 3, periods


# --- constructor ---------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, match", [
    ({"window": 0, "d_head": 8, "length": 16}, ValueError, r"window must be >= 1, not 0"),
    ({"window": 16, "d_head": -1, "length": 16}, ValueError, r"d_head must be >= 1, not -1"),
    ({"window": 16, "d_head": 8, "length": 0}, ValueError, r"length must be >= 1, not 0"),
    ({"window": 16.0, "d_head": 8, "length": 16}, TypeError,
     r"window must be an integer, not 16.0"),
    ({"window": 16, "d_head": "8", "length": 16}, TypeError, r"d_head must be an integer, not '8'"),
    ({"window": 16, "d_head": 8, "length": True}, TypeError,
     r"length must be an integer, not True"),
    ({"window": 16, "d_head": 8, "length": 8}, ValueError, r"length=8 must be >= window=16"),
    ({"window": 1 << 17, "d_head": 8, "length": 1 << 17}, ValueError,
     r"window=131072 exceeds the 16-bit position range"),
])
def test_constructor_rejects(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        AttentionBuffer(**kwargs)


def test_constructor_is_keyword_only():
    with pytest.raises(TypeError):
        AttentionBuffer(16, 8, 16)


# --- exported Verilog under cocotb + Verilator ------------------------------------------------

def _cocotb_data(cmds, exp, probs, max_cycles):
    d_head = len(next(c for c in cmds if isinstance(c, Query)).q)
    n = len(cmds)
    data = {"kind": np.array([int(isinstance(c, Query)) for c in cmds]),
            "kv_data": np.zeros((n, 2 * d_head), dtype=np.int64),
            "kv_pos": np.zeros(n, dtype=np.int64), "kv_first": np.zeros(n, dtype=np.int64),
            "q_data": np.zeros((n, d_head), dtype=np.int64)}
    for key in ("q_pos", "q_mult", "q_shift", "q_bidir", "q_split", "q_last"):
        data[key] = np.zeros(n, dtype=np.int64)
    for i, c in enumerate(cmds):
        if isinstance(c, KV):
            data["kv_data"][i] = np.concatenate([c.k, c.v])
            data["kv_pos"][i], data["kv_first"][i] = c.pos, c.first
        else:
            data["q_data"][i] = c.q
            for key, value in (("q_pos", c.pos), ("q_mult", c.mult), ("q_shift", c.shift),
                               ("q_bidir", c.bidirectional), ("q_split", c.split),
                               ("q_last", c.last)):
                data[key][i] = value
    queries = [c for c in cmds if isinstance(c, Query)]
    data["split"] = np.array([int(q.split) for q in queries])
    data["probs"] = probs
    data["reduced"] = np.array([e.get("reduced", np.zeros(probs.shape[1], dtype=np.int64))
                                for e in exp])
    data["max_cycles"] = np.int64(max_cycles)
    return data


# About a minute (the attention buffer on Verilator, then on pysim): the chip's own Verilator
# runs (tests/hw/test_chip.py) hold the unit's integers and cycles in the default suite.
@pytest.mark.slow
@pytest.mark.verilator
def test_verilator_matches_golden_and_pysim(verilator_ok, tmp_path):
    """`npu export --top attention` (tiny preset): cocotb + Verilator give the golden results,
    and every transfer lands on the same clock edge as in Amaranth's simulator."""
    from sim.rtl.cocotb_tb import run_cocotb

    npu = npu_preset("tiny")
    window, d_head, length = npu.attn_window, npu.d_head_max, npu.softmax_len
    text = exported_verilog(tmp_path, "attention", npu)
    rng = seeded(33)
    cmds = prefill(rng, range(20), d=d_head)                         # wraps the 16-slot ring
    cmds += prefill(rng, range(20, 23), d=d_head, first=False, split=True)
    cmds += [token(rng, p, first=p == 90, d=d_head) for p in range(90, 100)]   # halo, restart
    cmds += prefill(rng, range(100, 103), d=d_head, first=False)
    cmds += [query(rng, 102, d=d_head, bidirectional=True, last=True) for _ in range(3)]
    cmds += [Query(np.full(d_head, 127), 102, 65535, 1)]                 # saturates
    n = sum(isinstance(c, Query) for c in cmds)
    probs = rng.integers(0, 256, size=(n, length))
    offsets = rng.integers(-2**31, 2**31, size=(n, length))  # "the other shards' partials"

    def probs_fn(i, scores, mask):
        return probs[i]

    def reduced_fn(i, partial):
        return wrap(partial + offsets[i])

    exp = run_sequence(cmds, window=window, d_head=d_head, length=length, probs_fn=probs_fn,
                       reduced_fn=reduced_fn)
    out = run_cocotb(text, top="npu_attention", test_module="tb_attention",
                     data=_cocotb_data(cmds, exp, probs, max_cycles=20_000))
    got_v = [{k: np.array(v) if isinstance(v, list) else v for k, v in q.items()}
             for q in out["queries"]]
    check(got_v, exp)
    got_p, _ = run_attention(build_top("attention", npu), cmds, probs_fn=probs_fn,
                             reduced_fn=reduced_fn)
    for i, (v, p) in enumerate(zip(got_v, got_p, strict=True)):
        for key in ("t_q", "t_partial", "t_reduced", "t_scores", "t_probs", "t_out"):
            assert v.get(key) == p.get(key), f"query {i} {key}: verilator {v.get(key)} != " \
                                             f"pysim {p.get(key)}"
    print(f"verilator: {out['cycles']} cycles in {out['wall_s']:.2f} s")
