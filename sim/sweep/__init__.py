"""Design-space sweeps (``npu sweep SPEC.toml``): many points, each one simulation or plan, on a
Dask cluster or in this process; results as Parquet, CSV and JSON, and plots.

- :mod:`sim.sweep.spec` the spec file and its points;
- :mod:`sim.sweep.runner` one point, a small dispatch per backend (plan, iss, pysim, verilator);
- :mod:`sim.sweep.engine` the points on Dask, resumable (:func:`run_sweep`);
- :mod:`sim.sweep.results` the result rows on disk; :mod:`sim.sweep.plots` the pictures;
- :mod:`sim.sweep.builds` one Verilator build per hardware configuration, shared by workers.

Dask, pyarrow and tqdm are the optional ``sweep`` extra (``pip install -e '.[sweep]'``); they are
loaded only when a sweep runs, so the rest of the API does not need them.
"""

from .builds import SharedBuild, shared_build
from .engine import STATUSES, SweepResult, default_workers, run_sweep
from .plots import pareto_front, write_plots
from .results import read_rows, write_rows
from .runner import BACKENDS, run_point
from .spec import AXES, Point, SweepSpec, load_spec, parse_spec

__all__ = ["load_spec", "parse_spec", "SweepSpec", "Point", "AXES", "BACKENDS", "run_point",
           "run_sweep", "SweepResult", "STATUSES", "default_workers", "read_rows", "write_rows",
           "write_plots", "pareto_front", "shared_build", "SharedBuild"]
