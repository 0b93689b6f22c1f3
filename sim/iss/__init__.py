"""The instruction-set simulator: chip programs in NumPy with the hardware's integer semantics.

:class:`Iss` runs one chip (``chip.py``), :class:`IssSystem` N chips on the ring with their
collectives (``system.py``); one module per unit executes that unit's launches. The ISS never
imports the compiler: word formats and encodings come from :mod:`hw.spec`.

The timing models run the same programs without their data and import this package (for
:class:`IssError`), never the other way round: :func:`sim.timing.cycle.time_programs` (with the
units' handshakes in :mod:`sim.timing.engines` and :mod:`sim.timing.ring`) walks them cycle by cycle
and gives the RTL's cycles, busy counters and traces; :func:`sim.timing.launch.time_programs_fast`
times them launch by launch, for programs far too long to walk cycle by cycle.
"""

from .chip import Iss
from .errors import IssError
from .system import IssSystem

__all__ = ["Iss", "IssSystem", "IssError"]
