"""The instruction-set simulator: chip programs in NumPy with the hardware's integer semantics.

:class:`Iss` runs one chip (``chip.py``), :class:`IssSystem` N chips on the ring with their
collectives (``system.py``); one module per unit executes that unit's launches. The ISS never
imports the compiler: word formats and encodings come from :mod:`hw.spec`.

It is also the timing model: :func:`time_programs` (``timing.py``, with the units' handshakes
in ``engines.py`` and ``ring.py``) runs the same programs cycle by cycle without their data and
gives the RTL's cycles, busy counters and traces; :func:`time_programs_fast` (``fast.py``)
times them launch by launch, for programs far too long to walk cycle by cycle.
"""

from .chip import Iss
from .errors import IssError
from .fast import time_programs_fast
from .system import IssSystem
from .timing import time_programs

__all__ = ["Iss", "IssSystem", "IssError", "time_programs", "time_programs_fast"]
