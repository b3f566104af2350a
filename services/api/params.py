"""The request parameters several routes share, each declared and bounded once."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from litestar.params import PathParameter, QueryParameter

from policy.commands.names import PATTERN as NAME_PATTERN

#: The most items one page of a list holds.
PAGE_MAX: Final = 500
JobState = Literal[
    "submitted", "pending", "starting", "running", "stopping", "paused",
    "completed", "failed", "cancelled", "rejected",
]  # fmt: skip

PathName = Annotated[str, PathParameter(pattern=NAME_PATTERN, max_length=128)]
QueryName = Annotated[str | None, QueryParameter(pattern=NAME_PATTERN, max_length=128)]
After = Annotated[
    int | None, QueryParameter(ge=0, le=1 << 62, description="the `next` of the page before")
]
Limit = Annotated[int, QueryParameter(ge=1, le=PAGE_MAX)]
Types = Annotated[
    list[str] | None,
    QueryParameter(name="type", max_items=30, description="event types (repeat for several)"),
]
Since = Annotated[float | None, QueryParameter(ge=0, le=1e12, description="from this time")]
Until = Annotated[float | None, QueryParameter(ge=0, le=1e12, description="before this time")]
