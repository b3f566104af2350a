"""Durations on the simulator's command line and in its files (`events.units` is the grammar)."""

from __future__ import annotations

from events.units import parse_duration as seconds_of
from simulation.trace.errors import SimulationError


def parse_duration(value: str | float, what: str) -> float:
    """Seconds from `value`; `what` names the option or field in errors."""
    try:
        return seconds_of(value)
    except ValueError as e:
        raise SimulationError(f"{what}: {e}") from None
