"""The collective contract (hw.spec.collective): requests, buffers, packing, step schedules."""

import itertools

import numpy as np
import pytest

from hw.spec.collective import (
    CollectiveRequest,
    Kind,
    ReduceOp,
    check_fits,
    local_blocks,
    output_blocks,
    pack_blocks,
    steps,
    unpack_blocks,
    word_bytes,
)
from sim.golden import collectives as golden
from tests.helpers import (
    COLLECTIVE_KINDS,
    assert_chips_equal,
    collective_inputs,
    requests_every_size,
)


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
@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_schedule_computes_golden(kind, width, rng):
    """The engine's step schedule (hw.spec.collective.steps) run on words equals the golden."""
    for req in requests_every_size(kind, width):
        inputs = collective_inputs(rng, req)
        assert_chips_equal(_execute_schedule(req, inputs), golden.collective(req, inputs),
                           f"schedule {kind} {req.op.name.lower()} int{width} N={req.chips} "
                           f"length={req.length}")


def test_schedule_subgroups_and_send_recv(rng):
    for kind, n, first in itertools.product(COLLECTIVE_KINDS + ("send_recv",), range(2, 9),
                                            range(8)):
        if first >= n:
            continue
        for count in ([2] if kind == "send_recv" else range(1, n + 1)):
            req = CollectiveRequest(kind=kind, op="max", width=32, length=count + 5, chips=n,
                                    first=first, count=count)
            inputs = collective_inputs(rng, req)
            assert_chips_equal(_execute_schedule(req, inputs), golden.collective(req, inputs),
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
    ("chips", 1025, r"chips must be 1\.\.1024, not 1025: a system holds at most 1024"),
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


def test_pack_unpack_roundtrip(rng):
    for width, wbytes, length, n in itertools.product((32, 64), (8, 16, 32), (1, 7, 33), (1, 3)):
        req = CollectiveRequest(kind="reduce_scatter", op="sum", width=width, length=length,
                                chips=n)
        x = collective_inputs(rng, req)[0]
        blocks = list(range(n))[::-1]
        parts = unpack_blocks(pack_blocks(x, req, blocks, wbytes), req, blocks, wbytes)
        assert np.array_equal(np.concatenate([parts[b] for b in range(n)]), x), \
            f"int{width} word {wbytes} B length {length} N={n}"
