"""One build per key under concurrent workers (sim.sweep.builds): a fake build in 2 processes."""

import json
import os
import subprocess
import sys
import time

import pytest

from sim.sweep.builds import shared_build
from tests.helpers import ROOT

# Each process waits for a start signal, then builds: through shared_build, or directly.
_WORKER = """
import json, os, sys, time
from pathlib import Path
from sim.sweep.builds import shared_build

root, start, log, how = sys.argv[1:5]
Path(start + f".ready-{os.getpid()}").touch()
while not Path(start).exists():
    time.sleep(0.005)

def build(directory):
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(0.4)                      # long enough for the other process to arrive
    (directory / "harness").write_text(f"built by {os.getpid()}")
    return {"pid": os.getpid()}

if how == "shared":
    made = shared_build("npu-fake", build, root=root)
    print(json.dumps({"path": str(made.path), "made": made.made}))
else:
    directory = Path(root) / "npu-fake"
    directory.mkdir(parents=True, exist_ok=True)
    build(directory)
    print(json.dumps({"path": str(directory), "made": True}))
"""


def _race(tmp_path, how):
    """Two processes released at the same moment; their answers and the builds made."""
    root, start, log = tmp_path / "cache", tmp_path / "go", tmp_path / "builds.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(root), str(start), str(log),
                               how], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("go.ready-*"))) < 2:
            assert time.monotonic() < deadline, "the workers did not start"
            assert all(p.poll() is None for p in procs), procs[0].communicate()
            time.sleep(0.01)
        start.touch()
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            outs.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return outs, log.read_text().split()


def test_two_processes_share_one_build(tmp_path):
    outs, builds = _race(tmp_path, "shared")
    assert len(builds) == 1, f"built {len(builds)} times"
    assert sorted(o["made"] for o in outs) == [False, True]
    assert outs[0]["path"] == outs[1]["path"]
    final = tmp_path / "cache" / "npu-fake"
    assert (final / "harness").read_text() == f"built by {builds[0]}"
    assert json.loads((final / "build.json").read_text())["result"] == {"pid": int(builds[0])}
    # No temporary directory is left beside the build.
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["npu-fake",
                                                                      "npu-fake.lock"]


def test_without_the_lock_both_processes_build(tmp_path):
    """The race is real: the same two processes calling the build directly both build."""
    _, builds = _race(tmp_path, "direct")
    assert len(builds) == 2


def test_a_failed_build_leaves_nothing_and_the_next_call_builds(tmp_path):
    def broken(directory):
        (directory / "half").write_text("half a build")
        raise RuntimeError("compiler crashed")
    with pytest.raises(RuntimeError, match="compiler crashed"):
        shared_build("k", broken, root=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.lock"]
    calls = []

    def good(directory):
        calls.append(directory)
        return None
    first = shared_build("k", good, root=tmp_path)
    again = shared_build("k", good, root=tmp_path)
    assert (first.made, again.made, len(calls)) == (True, False, 1)
    assert first.path == again.path == tmp_path / "k"


@pytest.mark.parametrize("key", ["", "a/b", ".hidden"])
def test_keys_are_plain_names(tmp_path, key):
    with pytest.raises(ValueError, match="key must be a plain file name"):
        shared_build(key, lambda d: None, root=tmp_path)
