"""Closed-form collective cycle models (hw.spec.timing.collective) against each other."""

import itertools

from hw.spec.collective import CollectiveRequest
from hw.spec.timing.collective import (
    pipelined_bound_cycles,
    predicted_cycles,
    ring_bound_cycles,
    system_cycles,
)
from tests.helpers import COLLECTIVE_KINDS


def test_bound_and_model_agree_for_large_messages():
    """The engine's model cost stays within 1% of the step-synchronous bound at 16 KiB."""
    for n, kind in itertools.product((2, 4, 8), COLLECTIVE_KINDS):
        length = 4096 if kind != "all_gather" else 4096
        req = CollectiveRequest(kind=kind, op="sum", width=32, length=length, chips=n)
        bound = ring_bound_cycles(req.kind, 4 * length, n, 4, 2)
        model = predicted_cycles(req, 4, 2)
        assert model <= 1.01 * bound, f"{kind} N={n}: model {model} vs bound {bound}"


def test_bidirectional_halves_the_bandwidth_term():
    req = CollectiveRequest(kind="all_reduce", op="sum", width=32, length=1024, chips=4)
    one = predicted_cycles(req, 4, 2)
    two = system_cycles(req, 4, 2, bidirectional=True)
    assert two <= 0.51 * one, f"bidirectional {two} cycles vs unidirectional {one}"


def test_the_pipelined_bound_is_a_lower_bound_where_the_step_synchronous_is_not():
    """``max(S w + a, S a + w)`` never exceeds the engines' cost (one direction and both, rings
    of 2 to 16, 1 to 2,048 elements, latencies of 2 to 200 cycles); with 200-cycle links the
    step-synchronous ``S (w + a)`` does (it charges every step a whole block and a hop)."""
    over = 0
    for kind, n, length, (width, latency), both in itertools.product(
            ("all_reduce", "reduce_scatter"), (2, 5, 16), (1, 60, 2048),
            ((4, 2), (8, 30), (64, 200)), (False, True)):
        req = CollectiveRequest(kind=kind, op="sum", width=32, length=length, chips=n)
        cost = system_cycles(req, width, latency, bidirectional=both)
        bound = pipelined_bound_cycles(req.kind, 4 * length, n, width, latency,
                                       2 if both and kind == "all_reduce" else 1)
        assert bound <= cost, (kind, n, length, width, latency, both, bound, cost)
        over += ring_bound_cycles(req.kind, 4 * length, n, width, latency) > cost
    assert over > 0
