"""What every ``npu`` command shares: the one-line argument parser, option types, file I/O."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from hw.spec import ConfigError, load_model, load_npu
from hw.spec.topology import Topology, parse_topology

from ..errors import BadInput

__all__ = ["Parser", "positive", "count", "probability", "load_config", "load_array", "write_json",
           "progress_bar", "add_topology", "system_of"]


class Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, not argparse's usage block: scripts read the first line of stderr.
        raise BadInput(f"{self.prog}: {message}")


def _at_least(text, low):
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
    return value


def positive(text):
    """A whole number, 1 or more."""
    return _at_least(text, 1)


def count(text):
    """A whole number, 0 or more."""
    return _at_least(text, 0)


def probability(text):
    """A probability per cycle in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{value} is outside [0, 1)")
    return value


def load_config(args, option: str):
    """The constraint file named by ``--npu`` or ``--model``; a bad one is bad input that names
    the command, the option, then the file, key, value and limit."""
    loader = load_npu if option == "npu" else load_model
    try:
        return loader(getattr(args, option))
    except ConfigError as exc:
        raise BadInput(f"npu {args.command}: argument --{option}: {exc}") from None


def add_topology(p):
    """``--topology N`` (a ring) or ``XxY`` (a torus) on a command that takes ``--chips``."""
    p.add_argument("--topology", help="N (a ring of N chips) or XxY (an X x Y torus); "
                                      "default: the NPU file's [topology], else a ring of "
                                      "--chips")


def system_of(args, npu, chips):
    """``(npu, chips)`` of the system ``--topology``, the NPU file's ``[topology]`` and
    ``--chips`` give: the topology set on the NPU (None for a plain ring of ``--chips``), the
    chip count from it when ``--chips`` is absent. Inconsistent ones are bad input (exit 2)."""
    text = getattr(args, "topology", None)
    if text is not None:
        try:
            topo = parse_topology(text)
        except ValueError as exc:
            raise BadInput(f"npu {args.command}: argument --topology: {exc}") from None
        old = npu.topology
        if old is not None and old.links and len(old.dims) == len(topo.dims):
            topo = Topology(topo.dims, old.links)     # the file's links per dimension
        source = f"--topology {text}"
    else:
        topo, source = npu.topology, f"the [topology] of {npu.path or npu.name}"
        if topo is None:
            return npu, chips
    if chips is not None and chips != topo.chips:
        raise BadInput(f"npu {args.command}: --chips {chips} is not the {topo.chips} chips of "
                       f"{source} ({topo})")
    return dataclasses.replace(npu, topology=topo), topo.chips


def load_array(path: str, option: str):
    """An ``.npy`` array or an ``.npz`` archive (still open: the caller reads it)."""
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise BadInput(f"{option} {path}: file not found") from None
    except (OSError, ValueError) as exc:
        raise BadInput(f"{option} {path}: not a NumPy file ({exc})") from None


def write_json(path: str | Path, data) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
    except OSError as exc:
        raise BadInput(f"cannot write {path}: {exc.strerror}") from None
    return path


class _Bar:
    """A progress line on a terminal (simulated cycles and their rate), silent elsewhere."""

    def __init__(self, stream):
        self.stream = stream
        self.start = time.monotonic()
        self.shown = False

    def __call__(self, cycles: int, what: str = "cycles"):
        elapsed = time.monotonic() - self.start
        if elapsed < 2.0:
            return
        rate = cycles / elapsed if elapsed else 0.0
        self.stream.write(f"\r  simulating: {cycles:,} {what} in {elapsed:.0f} s "
                          f"({rate:,.0f}/s)   ")
        self.stream.flush()
        self.shown = True

    def close(self):
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def progress_bar(stream=None):
    """A progress callback for a long simulation, or None when ``stream`` (stderr) is not a
    terminal (scripts and CI see no progress lines)."""
    stream = sys.stderr if stream is None else stream
    return _Bar(stream) if stream.isatty() else None
