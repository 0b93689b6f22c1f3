"""SerialShell (hw.fpga.shell): what it wraps and how many port bits it shifts."""

import pytest

import hw.spec
import hw.tops
from hw.fpga.shell import SerialShell


def test_shell_rejects_a_non_component():
    with pytest.raises(TypeError, match=r"design must be a wiring.Component, not 42"):
        SerialShell(42)


def test_shell_counts_port_bits():
    unit = hw.tops.build_top("matmul", hw.spec.npu_preset("tiny"))
    shell = SerialShell(unit)
    # i_a: 4 bytes + unsigned + last + valid; i_b: 4 bytes + valid; i_param: 4 x (32 + 16 + 6)
    # + mode + valid; o.ready: inputs. Outputs: three readies, o: 4 x 32 + last + valid.
    assert shell.in_bits == (32 + 3) + (32 + 1) + (4 * (32 + 16 + 6) + 2 + 1) + 1
    assert shell.out_bits == 3 + (4 * 32 + 2)
