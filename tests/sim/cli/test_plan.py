"""``npu plan`` (sim.cli.plan): not built yet, and says so as one line."""

import pytest

from sim.cli.main import build_parser
from tests.helpers import TINY_MODEL, TINY_NPU, assert_one_line_error, run

# Commands still waiting for their issue (remove an entry when its command is built).
GOOD_ARGS = {
    "plan": ["--npu", TINY_NPU, "--model", TINY_MODEL, "--chips", "2"],
}


@pytest.mark.parametrize("command", sorted(GOOD_ARGS))
def test_not_built_commands_say_so(capsys, command):
    args = build_parser().parse_args([command, *GOOD_ARGS[command]])
    assert getattr(args.run, "not_built", False), f"npu {command} is built: drop it here"
    assert_one_line_error(*run(capsys, command, *GOOD_ARGS[command]),
                          f"npu {command}: not built yet (")
