"""The options every benchmark takes alike."""

from __future__ import annotations

import sys
from typing import Annotated, Literal

import cyclopts

#: `-o json`: the figures as one JSON document, for scripts; text (tables) by default.
Output = Annotated[Literal["text", "json"], cyclopts.Parameter(name=["--output", "-o"])]


class BadOption(ValueError):
    """An option's value is out of its range or unreadable: the message names the option and
    the value."""


def run_command(app: cyclopts.App) -> None:
    """Run a benchmark's command line: a bad option ends it with its message and exit status
    2, as cyclopts ends one it cannot parse, rather than with a traceback."""
    try:
        app()
    except BadOption as e:
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(2) from None
