"""RingTestbed and StreamDma (hw.ring.testbed): bad parameters are rejected."""

import dataclasses

import pytest

from hw.ring.testbed import RingTestbed, StreamDma
from hw.spec import npu_preset

TINY = npu_preset("tiny")


@pytest.mark.parametrize("build, error, match", [
    (lambda: RingTestbed(npu=TINY, chips=0), ValueError, r"chips must be 1\.\.1024, not 0"),
    (lambda: RingTestbed(npu=TINY, chips=1025), ValueError, r"chips must be 1\.\.1024, not 1025"),
    (lambda: RingTestbed(npu="tiny", chips=2), TypeError, r"npu must be an NpuConfig"),
    (lambda: RingTestbed(npu=TINY, chips=2, buffer_words=0), ValueError,
     r"buffer_words must be a positive integer, not 0"),
    (lambda: RingTestbed(npu=dataclasses.replace(TINY, link_bytes_per_cycle=6), chips=2),
     ValueError, r"link_bytes_per_cycle=6 is not a power of two"),
    (lambda: StreamDma(word_bytes=8, depth=0), ValueError, r"depth must be a positive integer"),
])
def test_bad_parameters_rejected(build, error, match):
    with pytest.raises(error, match=match):
        build()
