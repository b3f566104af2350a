"""The options every benchmark takes alike."""

from __future__ import annotations

from typing import Annotated, Literal

import cyclopts

#: `-o json`: the figures as one JSON document, for scripts; text (tables) by default.
Output = Annotated[Literal["text", "json"], cyclopts.Parameter(name=["--output", "-o"])]
