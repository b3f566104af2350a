"""The one pattern for names that travel in stream subjects: jobs, projects, pools, nodes."""

from __future__ import annotations

import re
from typing import Final

from policy.commands.outcome import Refused, refuse

#: 1-128 letters, digits, '-' or '_', starting with a letter or digit: no '.', '*' or '>',
#: which would change the subject an event is stored under. `$(?!\n)`, not `$`: a Python `$`
#: also matches before a trailing newline, and "job\n" passed here and then failed as a
#: subject (the same pattern serves JSON Schema, which has no `\Z`).
PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$(?!\n)"
NAME: Final = re.compile(PATTERN)
RULE: Final = "use 1-128 letters, digits, '-' or '_', starting with a letter or digit"


def is_name(value: str) -> bool:
    return NAME.match(value) is not None


def name_problem(what: str, field: str, value: str) -> Refused | None:
    """Why `value` is not a valid name for a `what` (job id, project name, ...) given as
    `field`, or None."""
    return None if is_name(value) else refuse("invalid_name", field, value, what=what, rule=RULE)
