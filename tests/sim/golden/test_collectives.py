"""Golden collectives (sim.golden.collectives) vs a naive per-element reference.

Cheap in NumPy, so run broadly: every kind and op, N = 1..8, widths 32 and 64, lengths 1, N-1,
N+1, a large odd one, extremes, sub-groups at every position of the ring.
"""

import itertools

import numpy as np
import pytest

from hw.spec.collective import CollectiveRequest, Kind
from sim.golden import collectives as golden
from tests.helpers import (
    COLLECTIVE_KINDS,
    REDUCE_OPS,
    assert_chips_equal,
    collective_inputs,
    requests_every_size,
)


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


@pytest.mark.parametrize("width", [32, 64])
@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_golden_matches_naive_every_size(kind, width, rng):
    for req in requests_every_size(kind, width):
        inputs = collective_inputs(rng, req)
        assert_chips_equal(golden.collective(req, inputs), _naive(req, inputs),
                           f"{kind} {req.op.name.lower()} int{width} N={req.chips} "
                           f"length={req.length}")


@pytest.mark.parametrize("width", [32, 64])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_golden_extremes_wrap(op, width, rng):
    """SUM wraps modulo 2**width: int_max + 1 is int_min; AVG divides the wrapped sum."""
    req = CollectiveRequest(kind="all_reduce", op=op, width=width, length=64, chips=4)
    inputs = collective_inputs(rng, req, extremes=True)
    assert_chips_equal(golden.collective(req, inputs), _naive(req, inputs),
                       f"extremes {op} int{width}")
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
    inputs = collective_inputs(rng, req)
    got = golden.collective(req, inputs)
    assert [g.size for g in got] == [3, 3, 2, 2]
    total = golden.reduce(np.stack(inputs), "sum", 32)
    assert np.array_equal(np.concatenate(got), total)


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_golden_subgroups_every_position(kind, rng):
    for n, first, count in itertools.product(range(2, 9), range(8), range(1, 9)):
        if first >= n or count > n:
            continue
        for op in REDUCE_OPS:
            req = CollectiveRequest(kind=kind, op=op, width=32, length=count + 3, chips=n,
                                    first=first, count=count)
            inputs = collective_inputs(rng, req)
            assert_chips_equal(golden.collective(req, inputs), _naive(req, inputs),
                               f"{kind} {op} N={n} group {first}:{count}")


def test_golden_all_gather_rejects_wrong_block_length():
    req = CollectiveRequest(kind="all_gather", op="sum", width=32, length=7, chips=2)
    with pytest.raises(ValueError, match=r"chip 1 contributes 4 elements; block 1 .* has 3"):
        golden.collective(req, [np.zeros(4, np.int32), np.zeros(4, np.int32)])


