"""The ``npu`` command line (also ``python -m sim``): argument parsing over :mod:`sim.api`.

One module per command parses its arguments, reads and writes files, and calls the typed API;
:mod:`sim.cli.main` dispatches and turns errors into exit statuses (:mod:`sim.errors`). Nothing
outside this package imports it.
"""

from .main import main

__all__ = ["main"]
