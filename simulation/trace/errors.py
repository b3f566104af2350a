"""The one error a simulation input can raise: the message names the bad value."""

from __future__ import annotations


class SimulationError(ValueError):
    """Bad input (a trace, a date, a file, an option): shown to the user without a traceback."""
