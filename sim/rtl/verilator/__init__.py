"""``--backend verilator``: :class:`hw.system.ChipSystem`'s chips and links as one Verilated
:class:`hw.system.ChipNode` per chip under a C++ host, with no Python per cycle
(``docs/architecture.md``, "The Verilator backend").

- ``build.py``: the node's export, the ``rst`` wrapper, ``ports.h``, the cached and locked build
  (:func:`~sim.rtl.verilator.build.ensure_build`), one per hardware configuration for every
  chip count.
- ``harness.cpp``: the C++ host (N models in lockstep on a ring; load, start, clock, counters,
  traces, read back).
- ``runner.py``: :func:`~sim.rtl.verilator.runner.run_system_verilator`, the contract of
  :func:`sim.rtl.system_runner.run_system_pysim`; :func:`~sim.rtl.verilator.runner.run_bare_loop`,
  the speed limit.
"""
