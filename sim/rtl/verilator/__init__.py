"""``--backend verilator``: :class:`hw.system.ChipSystem` as a Verilated model under a C++ host,
with no Python per cycle (``docs/architecture.md``, "The Verilator backend").

- ``build.py``: the export, the ``rst`` wrapper, ``ports.h``, the cached and locked build
  (:func:`~sim.rtl.verilator.build.ensure_build`).
- ``harness.cpp``: the C++ host (load, start, clock, counters, traces, read back).
- ``runner.py``: :func:`~sim.rtl.verilator.runner.run_system_verilator`, the contract of
  :func:`sim.rtl.system_runner.run_system_pysim`; :func:`~sim.rtl.verilator.runner.run_bare_loop`,
  the speed limit.
"""
