"""Durations as people write them on the command line and in files: `90s`, `30m`, `1h30m`, `45`."""

from __future__ import annotations

import re
from typing import Final

from fairlane.simulator.errors import SimulationError

_DURATION: Final = re.compile(
    r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$"
)
_SECONDS_PER: Final = (86400.0, 3600.0, 60.0, 1.0)


def parse_duration(value: str | float, what: str) -> float:
    """Seconds from `value` (a bare number is seconds); `what` names the option in errors."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip()
        match = _DURATION.match(text) if text else None
        if match is None or not any(match.groups()):
            raise SimulationError(
                f"{what}: {value!r} is not a duration (write it like 45, 90s, 30m, 2h or 1h30m)"
            )
        seconds = sum(
            float(g) * unit for g, unit in zip(match.groups(), _SECONDS_PER, strict=True) if g
        )
    if seconds < 0:
        raise SimulationError(f"{what}: {value!r} is negative")
    return seconds
