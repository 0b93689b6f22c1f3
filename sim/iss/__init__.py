"""The instruction-set simulator: chip programs in NumPy with the hardware's integer semantics.

:class:`Iss` runs one chip (``chip.py``), :class:`IssSystem` N chips on the ring with their
collectives (``system.py``); one module per unit executes that unit's launches. The ISS never
imports the compiler: word formats and encodings come from :mod:`hw.spec`.
"""

from .chip import Iss
from .errors import IssError
from .system import IssSystem

__all__ = ["Iss", "IssSystem", "IssError"]
