"""Golden collectives vs a naive per-element reference, and the engine's step schedule vs golden.

Cheap in NumPy, so run broadly: every kind and op, N = 1..8, widths 32 and 64, lengths 1, N-1,
N+1, a large odd one, extremes, sub-groups at every position of the ring.
"""

import itertools

import numpy as np
import pytest

from hw.spec.collective import (
    CollectiveRequest,
    Kind,
    ReduceOp,
    block_sizes,
    check_fits,
    local_blocks,
    output_blocks,
    pack_blocks,
    steps,
    unpack_blocks,
    word_bytes,
)
from hw.spec.timing.collective import predicted_cycles, ring_bound_cycles
from sim.golden import collectives as golden

KINDS = ("all_reduce", "reduce_scatter", "all_gather")
OPS = ("sum", "max", "min", "avg")


def _lengths(n):
    return sorted({1, max(1, n - 1), n + 1, 1001})


def _random_inputs(rng, req, extremes=False):
    dtype = np.int32 if req.width == 32 else np.int64
    info = np.iinfo(dtype)
    sizes = block_sizes(req.length, req.count)
    out = []
    for chip in range(req.chips):
        p = req.position(chip)
        size = (sizes[p] if p is not None else 0) if req.kind == Kind.ALL_GATHER else req.length
        if extremes:
            x = rng.choice(np.array([info.min, info.max, info.min + 1, info.max - 1, -1, 0, 1],
                                    dtype=dtype), size=size)
        else:
            x = rng.integers(info.min, info.max, size=size, dtype=dtype, endpoint=True)
        out.append(x)
    return out


def _naive_reduce(values, op, width):
    """Python integers, one element at a time: the definition, written independently."""
    n = len(values)
    if op == "max":
        return max(values)
    if op == "min":
        return min(values)
    total = sum(int(v) for v in values) % (1 << width)
    if total >= 1 << (width - 1):
        total -= 1 << width
    return total // n if op == "avg" else total


def _naive(req, inputs):
    members = req.members
    n = req.count
    empty = [[] for _ in range(req.chips)]
    if req.kind == Kind.ALL_GATHER:
        total = [int(v) for c in members for v in inputs[c]]
        return [total if req.position(c) is not None else [] for c in range(req.chips)]
    reduced = [_naive_reduce([int(inputs[c][e]) for c in members], req.op.name.lower(),
                             req.width) for e in range(req.length)]
    if req.kind == Kind.ALL_REDUCE:
        return [reduced if req.position(c) is not None else [] for c in range(req.chips)]
    q, r = divmod(req.length, n)
    for p, c in enumerate(members):
        start = p * q + min(p, r)
        empty[c] = reduced[start:start + q + (p < r)]
    return empty


def _check(got, want, what):
    assert len(got) == len(want), what
    for chip, (g, w) in enumerate(zip(got, want, strict=True)):
        g = [int(v) for v in g]
        assert len(g) == len(w), f"{what}: chip {chip} has {len(g)} elements, expected {len(w)}"
        for e, (a, b) in enumerate(zip(g, w, strict=True)):
            assert a == b, f"{what}: chip {chip} element {e}: {a} != {b}"


def _execute_schedule(req, inputs, wbytes=8):
    """Run every chip's step schedule on words (the ring as FIFOs): what the engine computes."""
    dtype = np.int32 if req.width == 32 else np.int64
    scheds = [steps(req, c) for c in range(req.chips)]
    local = [list(pack_blocks(inputs[c], req, local_blocks(req, c), wbytes))
             if local_blocks(req, c) else [] for c in range(req.chips)]
    rings = [[] for _ in range(req.chips)]   # words sent by chip c to chip c+1
    outs = [[] for _ in range(req.chips)]
    lanes = wbytes // (req.width // 8)
    sizes = req.blocks()
    # Steps are executed round-robin; a chip waits until its upstream has sent enough words.
    pos = [0] * req.chips
    rx_at = [0] * req.chips
    local_at = [0] * req.chips
    progress = True
    while progress:
        progress = False
        for c in range(req.chips):
            while pos[c] < len(scheds[c]):
                step = scheds[c][pos[c]]
                words = 1 if req.kind == Kind.BARRIER else -(-sizes[step.block] // lanes)
                up = rings[(c - 1) % req.chips]
                if step.rx and rx_at[c] + words > len(up):
                    break
                for _ in range(words):
                    def elems(word):
                        raw = int(word).to_bytes(wbytes, "little")
                        return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))
                    a = elems(up[rx_at[c]]) if step.rx else None
                    b = elems(local[c][local_at[c]]) if step.local else None
                    rx_at[c] += step.rx
                    local_at[c] += step.local
                    if a is not None and b is not None:
                        op = "sum" if req.op == ReduceOp.AVG else req.op.name.lower()
                        v = golden.reduce(np.stack([a, b]), op, req.width)
                    else:
                        v = a if a is not None else b if b is not None else np.zeros(lanes, dtype)
                    if step.final and req.op == ReduceOp.AVG:
                        v = np.floor_divide(v.astype(np.int64), req.count).astype(dtype)
                    word = int.from_bytes(np.asarray(v, dtype=np.dtype(dtype).newbyteorder("<"))
                                          .tobytes(), "little")
                    if step.tx:
                        rings[c].append(word)
                    if step.out:
                        outs[c].append(word)
                pos[c] += 1
                progress = True
    assert all(p == len(s) for p, s in zip(pos, scheds, strict=True)), "schedule deadlocked"
    for c in range(req.chips):
        down = (c + 1) % req.chips
        assert rx_at[down] == len(rings[c]), f"chip {down} left ring words unread"
    results = []
    for c in range(req.chips):
        blocks = output_blocks(req, c)
        if not blocks:
            results.append(np.zeros(0, dtype))
            continue
        parts = unpack_blocks(outs[c], req, blocks, wbytes)
        if req.kind in (Kind.REDUCE_SCATTER, Kind.SEND_RECV):
            results.append(parts[blocks[0]])
        else:
            results.append(np.concatenate([parts[b] for b in sorted(parts)]))
    return results


@pytest.mark.parametrize("width", [32, 64])
@pytest.mark.parametrize("kind", KINDS)
def test_golden_matches_naive_every_size(kind, width, rng):
    for n in range(1, 9):
        for length, op in itertools.product(_lengths(n), OPS):
            req = CollectiveRequest(kind=kind, op=op, width=width, length=length, chips=n)
            inputs = _random_inputs(rng, req)
            _check(golden.collective(req, inputs), _naive(req, inputs),
                   f"{kind} {op} int{width} N={n} length={length}")


@pytest.mark.parametrize("width", [32, 64])
@pytest.mark.parametrize("op", OPS)
def test_golden_extremes_wrap(op, width, rng):
    """SUM wraps modulo 2**width: int_max + 1 is int_min; AVG divides the wrapped sum."""
    req = CollectiveRequest(kind="all_reduce", op=op, width=width, length=64, chips=4)
    inputs = _random_inputs(rng, req, extremes=True)
    _check(golden.collective(req, inputs), _naive(req, inputs), f"extremes {op} int{width}")
    info = np.iinfo(np.int32 if width == 32 else np.int64)
    two = [np.array([info.max], dtype=info.dtype), np.array([1], dtype=info.dtype)]
    req2 = CollectiveRequest(kind="all_reduce", op=op, width=width, length=1, chips=2)
    got = int(golden.collective(req2, two)[0][0])
    want = {"sum": int(info.min), "max": int(info.max), "min": 1,
            "avg": int(info.min) // 2}[op]
    assert got == want, f"{op} of [{info.max}, 1] at int{width}: {got} != {want}"


def test_golden_avg_floors_towards_minus_infinity():
    req = CollectiveRequest(kind="all_reduce", op="avg", width=32, length=2, chips=3)
    inputs = [np.array([-1, 1], np.int32), np.array([0, 0], np.int32),
              np.array([0, 1], np.int32)]
    assert golden.collective(req, inputs)[0].tolist() == [-1, 0]


def test_golden_reduce_scatter_blocks_like_array_split(rng):
    req = CollectiveRequest(kind="reduce_scatter", op="sum", width=32, length=10, chips=4)
    inputs = _random_inputs(rng, req)
    got = golden.collective(req, inputs)
    assert [g.size for g in got] == [3, 3, 2, 2]
    total = golden.reduce(np.stack(inputs), "sum", 32)
    assert np.array_equal(np.concatenate(got), total)


@pytest.mark.parametrize("kind", KINDS)
def test_golden_subgroups_every_position(kind, rng):
    for n, first, count in itertools.product(range(2, 9), range(8), range(1, 9)):
        if first >= n or count > n:
            continue
        for op in OPS:
            req = CollectiveRequest(kind=kind, op=op, width=32, length=count + 3, chips=n,
                                    first=first, count=count)
            inputs = _random_inputs(rng, req)
            _check(golden.collective(req, inputs), _naive(req, inputs),
                   f"{kind} {op} N={n} group {first}:{count}")


@pytest.mark.parametrize("width", [32, 64])
@pytest.mark.parametrize("kind", KINDS)
def test_schedule_computes_golden(kind, width, rng):
    """The engine's step schedule (hw.spec.collective.steps) run on words equals the golden."""
    for n in range(1, 9):
        for length in _lengths(n):
            for op in OPS:
                req = CollectiveRequest(kind=kind, op=op, width=width, length=length, chips=n)
                inputs = _random_inputs(rng, req)
                _check(_execute_schedule(req, inputs), golden.collective(req, inputs),
                       f"schedule {kind} {op} int{width} N={n} length={length}")


def test_schedule_subgroups_and_send_recv(rng):
    for kind, n, first in itertools.product(KINDS + ("send_recv",), range(2, 9), range(8)):
        if first >= n:
            continue
        for count in ([2] if kind == "send_recv" else range(1, n + 1)):
            req = CollectiveRequest(kind=kind, op="max", width=32, length=count + 5, chips=n,
                                    first=first, count=count)
            inputs = _random_inputs(rng, req)
            _check(_execute_schedule(req, inputs), golden.collective(req, inputs),
                   f"schedule {kind} N={n} group {first}:{count}")


def test_schedule_barrier_terminates():
    for n, first in itertools.product(range(1, 9), range(8)):
        if first >= n:
            continue
        for count in range(1, n + 1):
            req = CollectiveRequest(kind="barrier", op="sum", width=32, length=1, chips=n,
                                    first=first, count=count)
            _execute_schedule(req, [np.zeros(1, np.int32)] * n)


@pytest.mark.parametrize("field, value, match", [
    ("length", 0, r"length must be 1\.\.16777215 elements, not 0"),
    ("first", 4, r"group first=4 is outside the ring of 4 chips"),
    ("count", 5, r"group count=5 must be 1\.\.4"),
    ("count", 0, r"group count=0 must be 1\.\.4"),
    ("width", 16, r"width must be 32 or 64, not 16"),
    ("chips", 9, r"chips must be 1\.\.8, not 9"),
    ("kind", "gather", r"kind must be one of all_reduce, .*not 'gather'"),
    ("op", "prod", r"op must be one of sum, max, min, avg, not 'prod'"),
])
def test_request_rejected(field, value, match):
    params = {"kind": "all_reduce", "op": "sum", "width": 32, "length": 8, "chips": 4}
    params[field] = value
    with pytest.raises(ValueError, match=match):
        CollectiveRequest(**params)


def test_request_rejected_types_and_send_recv():
    with pytest.raises(TypeError, match=r"length must be an integer, not 2\.5"):
        CollectiveRequest(kind="all_reduce", op="sum", width=32, length=2.5, chips=4)
    with pytest.raises(ValueError, match=r"send/recv needs a group of 2 chips.*count=3"):
        CollectiveRequest(kind="send_recv", op="sum", width=32, length=2, chips=4, count=3)
    with pytest.raises(ValueError, match=r"link_bytes_per_cycle must be a power of two, not 3"):
        word_bytes(3)


def test_check_fits_rejects_block_larger_than_buffers():
    req = CollectiveRequest(kind="all_reduce", op="sum", width=32, length=1000, chips=2)
    check_fits(req, 8, 250)
    with pytest.raises(ValueError, match=r"block of 250 words .* exceeds .* fifo_words=249"):
        check_fits(req, 8, 249)


def test_golden_all_gather_rejects_wrong_block_length():
    req = CollectiveRequest(kind="all_gather", op="sum", width=32, length=7, chips=2)
    with pytest.raises(ValueError, match=r"chip 1 contributes 4 elements; block 1 .* has 3"):
        golden.collective(req, [np.zeros(4, np.int32), np.zeros(4, np.int32)])


def test_pack_unpack_roundtrip(rng):
    for width, wbytes, length, n in itertools.product((32, 64), (8, 16, 32), (1, 7, 33), (1, 3)):
        req = CollectiveRequest(kind="reduce_scatter", op="sum", width=width, length=length,
                                chips=n)
        x = _random_inputs(rng, req)[0]
        blocks = list(range(n))[::-1]
        parts = unpack_blocks(pack_blocks(x, req, blocks, wbytes), req, blocks, wbytes)
        assert np.array_equal(np.concatenate([parts[b] for b in range(n)]), x), \
            f"int{width} word {wbytes} B length {length} N={n}"


def test_bound_and_model_agree_for_large_messages():
    """The engine's model cost stays within 1% of the step-synchronous bound at 16 KiB."""
    for n, kind in itertools.product((2, 4, 8), KINDS):
        length = 4096 if kind != "all_gather" else 4096
        req = CollectiveRequest(kind=kind, op="sum", width=32, length=length, chips=n)
        bound = ring_bound_cycles(req.kind, 4 * length, n, 4, 2)
        model = predicted_cycles(req, 4, 2)
        assert model <= 1.01 * bound, f"{kind} N={n}: model {model} vs bound {bound}"
