"""Closed-form collective cycle models (hw.spec.timing.collective) against each other."""

import itertools

from hw.spec.collective import CollectiveRequest
from hw.spec.timing.collective import predicted_cycles, ring_bound_cycles, system_cycles
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
