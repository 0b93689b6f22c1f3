"""Timing models: the cycles of chip programs, without their data.

:mod:`sim.timing.cycle` walks the programs cycle by cycle, equal to the RTL (with the
units' handshakes in :mod:`sim.timing.engines` and :mod:`sim.timing.ring`);
:mod:`sim.timing.launch` times them launch by launch (:class:`~sim.timing.launch.LaunchTimer`), for
programs far too long for the cycle model. They import the functional ISS (:mod:`sim.iss`),
never the other way round.
"""
