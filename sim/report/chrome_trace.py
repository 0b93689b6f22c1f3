"""A run as Chrome / Perfetto trace events (``npu sim --trace``): a track per chip and unit.

The file is the Trace Event Format's JSON object: one process per chip (named ``chip i``), one
thread per unit, a complete event (``"ph": "X"``) per launch with its busy interval, and the
collectives and transfers of the program as spans on their units with their bytes. Times are
in microseconds at the NPU's ``clock_mhz``; every event also carries its cycles.
"""

from __future__ import annotations

import json
from pathlib import Path

from hw.spec.isa import UNIT_NAMES

__all__ = ["trace_events", "write_trace"]


def trace_events(report) -> dict:
    """The events of a timed :class:`~sim.report.core.SimReport`."""
    if report.spans is None:
        raise ValueError("the run has no timing (the ISS does not time programs)")
    mhz = report.npu.clock_mhz
    events = []
    comms = {"collective": [c for c in report.collectives if c["kind"] == "all_reduce"],
             "send": [c for c in report.collectives if c["kind"] == "send"]}
    for c, span in enumerate(report.spans):
        events.append({"ph": "M", "name": "process_name", "pid": c, "args": {"name": f"chip {c}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": c,
                       "args": {"sort_index": c}})
        for t, unit in enumerate(UNIT_NAMES):
            events.append({"ph": "M", "name": "thread_name", "pid": c, "tid": t,
                           "args": {"name": unit}})
            own = [x for x in comms.get(unit, [])
                   if unit != "send" or x["from"] == c]
            for k, (start, end) in enumerate(span[unit]):
                args = {"cycles": end - start, "start_cycle": start, "launch": k}
                name = f"{unit} {k}"
                if unit == "collective" and k < len(own):
                    args.update(bytes=own[k]["bytes"], layer=own[k].get("layer"))
                    name = f"all-reduce {own[k]['bytes']} B ({own[k].get('what', '')})"
                elif unit == "send" and k < len(own):
                    args.update(bytes=own[k]["bytes"], to=own[k]["to"],
                                microbatch=own[k].get("microbatch"))
                    if "microbatch" in own[k]:
                        name = f"send mb {own[k]['microbatch']} to chip {own[k]['to']}"
                    else:      # sequence parallelism: K/V rows of a layer
                        name = f"{own[k]['what']} L{own[k]['layer']} to chip {own[k]['to']}"
                        args.update(layer=own[k]["layer"], tokens=own[k]["tokens"])
                events.append({"ph": "X", "name": name, "cat": unit, "pid": c, "tid": t,
                               "ts": start / mhz, "dur": (end - start) / mhz, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"strategy": report.strategy, "chips": report.chips,
                          "backend": report.backend, "cycles": report.cycles,
                          "clock_mhz": mhz}}


def write_trace(report, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(trace_events(report)) + "\n")
    return path
