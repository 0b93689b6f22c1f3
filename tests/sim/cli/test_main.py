"""The ``npu`` entry point (sim.cli.main, ``python -m sim``): help and the exit-status contract."""

import pytest

from sim import errors
from tests.helpers import TINY_MODEL, TINY_NPU, run, run_process

COMMANDS = ["sim", "collective", "plan", "sweep", "export", "fpga", "bench"]


def test_help_lists_every_command(capsys):
    status, out, err = run(capsys, "--help")
    assert status == errors.EXIT_OK and err == ""
    assert out.startswith("usage: npu ")
    for command in COMMANDS:
        assert f"\n    {command} " in out or f"\n    {command}\n" in out, \
            f"{command} missing from --help:\n{out}"


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help(capsys, command):
    status, out, err = run(capsys, command, "-h")
    assert status == errors.EXIT_OK and err == ""
    assert out.startswith(f"usage: npu {command} ")


def test_process_help():
    result = run_process("--help")
    assert result.returncode == 0 and result.stderr == ""
    for command in COMMANDS:
        assert command in result.stdout


@pytest.mark.parametrize("argv, fragment", [
    (["sim", "--npu", "no/such/npu.toml", "--model", TINY_MODEL], "no/such/npu.toml"),
    (["sim", "--chips", "0", "--npu", TINY_NPU, "--model", TINY_MODEL], "--chips"),
    (["export", "--top", "nosuch", "--npu", TINY_NPU, "-o", "build/never"], "'nosuch'"),
])
def test_process_exit_status_and_one_line(argv, fragment):
    result = run_process(*argv)
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr
    assert "Traceback" not in result.stderr and fragment in result.stderr, result.stderr
