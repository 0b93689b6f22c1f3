"""The errors of the ``npu`` tools and the exit status each maps to (``docs/formats.md``).

Defined once, below both the typed API (:mod:`sim.api`) and the command line (:mod:`sim.cli`):
the API raises them, the CLI prints their one-line message and exits with their status.
A golden mismatch is not an error: the report says ``golden_match: false`` and the CLI exits
with :data:`EXIT_MISMATCH`. Configuration files that break a limit raise
:class:`hw.spec.ConfigError`, which the CLI treats as bad input.
"""

from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_MISMATCH", "EXIT_BAD_INPUT", "EXIT_WATCHDOG", "EXIT_TOOL_FAILED",
           "NpuError", "BadInput", "Watchdog", "ToolFailure", "TransportTimeout"]

#: Every output equals the golden model bit for bit (``npu fpga``: the design fits).
EXIT_OK = 0
#: Some output differs from the golden model (``npu fpga``: the design does not fit).
EXIT_MISMATCH = 1
#: Bad input: a missing or malformed file, an impossible value, an incompatible model.
EXIT_BAD_INPUT = 2
#: A simulation ran past its cycle budget (``--max-cycles``): a deadlock never hangs.
EXIT_WATCHDOG = 3
#: An external tool (Yosys, nextpnr, Verilator) failed.
EXIT_TOOL_FAILED = 4


class NpuError(Exception):
    """Base of the tools' errors; ``exit_code`` is the CLI's exit status for it. The message
    is one line."""

    exit_code = EXIT_BAD_INPUT


class BadInput(NpuError, ValueError):
    """Bad input: the message names the file or option, the key, the value and the limit."""

    exit_code = EXIT_BAD_INPUT


class Watchdog(NpuError):
    """A simulation exceeded its cycle budget; the message says which chips were waiting."""

    exit_code = EXIT_WATCHDOG


class ToolFailure(NpuError):
    """An external tool failed; the message names the tool, its first error and its log."""

    exit_code = EXIT_TOOL_FAILED


class TransportTimeout(OSError):
    """A board (``npu board``) sent fewer bytes than a reply needs within the transport's
    timeout. Not an :class:`NpuError`: :func:`sim.flows.board.run_board` turns it into bad input."""
