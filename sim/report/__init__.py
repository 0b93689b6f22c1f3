"""The report of a run (:mod:`sim.report.core`) and its views: busy intervals
(:mod:`sim.report.timeline`), the timeline picture (:mod:`sim.report.plot`) and the
Chrome / Perfetto trace (:mod:`sim.report.chrome_trace`).
"""

from .core import UNITS, ChipStats, SimReport

__all__ = [
    "UNITS",
    "ChipStats",
    "SimReport",
]
