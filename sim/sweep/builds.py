"""One build per hardware configuration, shared by every worker of a sweep.

:func:`shared_build` wraps any build function: under a file lock on the build's key, the first
caller builds into a fresh temporary directory and renames it into place, so a build directory
either does not exist or is complete (a crashed or interrupted build leaves only its temporary
directory, removed when the build function raises); every other caller, in this process or
another, waits on the lock and then finds the build. The lock is ``fcntl.flock``: it is released
when its holder dies, so a killed worker never blocks the others.

Builds live under ``$NPU_SCALE_CACHE`` or ``~/.cache/npu-scale`` (the cache of
:mod:`sim.rtl.cocotb_tb`), in ``sweep/``: ``<key>/`` per build with the build function's record in
``build.json``, ``<key>.lock`` its lock.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..rtl.toolchain import cache_dir, file_lock

__all__ = ["SharedBuild", "shared_build", "builds_root"]

RECORD = "build.json"


@dataclass(frozen=True)
class SharedBuild:
    """A build directory, whether this call made it (``made``), and the build's record."""

    path: Path
    made: bool
    record: dict


def builds_root() -> Path:
    return cache_dir() / "sweep"


def _found(final: Path) -> SharedBuild | None:
    record = final / RECORD
    if record.exists():
        return SharedBuild(final, False, json.loads(record.read_text()))
    return None


def shared_build(key: str, build: Callable[[Path], dict | None], *,
                 root: str | Path | None = None) -> SharedBuild:
    """The build named ``key``: made now by ``build(directory)`` unless it exists.

    ``build`` fills the empty ``directory`` it is given and returns a JSON-able record (or
    None); the directory then becomes ``root/key`` atomically. ``key`` must be a file name.
    """
    if not key or "/" in key or key.startswith("."):
        raise ValueError(f"key must be a plain file name, not {key!r}")
    root = Path(root) if root is not None else builds_root()
    final = root / key
    found = _found(final)     # a complete build: no lock needed
    if found:
        return found
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / f"{key}.lock"):
        found = _found(final)
        if found:
            return found
        work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        try:
            start = time.perf_counter()
            result = build(work)
            record = {"key": key, "pid": os.getpid(), "when": time.time(),
                      "build_s": round(time.perf_counter() - start, 3), "result": result}
            (work / RECORD).write_text(json.dumps(record, indent=2) + "\n")
            work.rename(final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    return SharedBuild(final, True, record)
