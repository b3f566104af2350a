"""How quantities are written and summed up, said once for every input and report: durations
as people write them (`90s`, `10m`, `1h30m`, `1d`, or a number of seconds) and nearest-rank
percentiles."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Final

_DURATION: Final = re.compile(
    r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$"
)
_NUMBER: Final = re.compile(r"^\d+(?:\.\d+)?$")
_SECONDS_PER: Final = (86400.0, 3600.0, 60.0, 1.0)
FORMS: Final = "45, 90s, 30m, 2h, 1h30m or 1d"


def parse_duration(value: object) -> float:
    """Seconds from a duration: a number (seconds), or a string of days, hours, minutes and
    seconds in that order. Raises ValueError naming the value; negative is not a duration."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"{value!r} is not a duration (write it like {FORMS})")
        return float(value)
    text = value.strip() if isinstance(value, str) else ""
    if _NUMBER.match(text):
        return float(text)
    match = _DURATION.match(text)
    if not text or match is None:
        raise ValueError(f"{value!r} is not a duration (write it like {FORMS})")
    return sum(float(g) * unit for g, unit in zip(match.groups(), _SECONDS_PER, strict=True) if g)


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest rank: the smallest value with at least `fraction` of the values at or below it
    (p99 of 30 samples is the slowest but none); 0.0 when there are none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]
