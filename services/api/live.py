"""The live log as server-sent events: followed from a sequence, filtered to what the caller may
see, with a comment while it is quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Final

from litestar import get
from litestar.params import HeaderParameter
from litestar.response.sse import ServerSentEvent, ServerSentEventMessage

from events import Event, JobSubmitted, WorkRelayed, encode_event
from services.api import queries
from services.api.callers import Who, readable_job
from services.api.context import Context, Ctx
from services.api.errors import FOUND_ERRORS, fail
from services.api.params import After, QueryName
from services.api.streams import Place
from services.runtime.eventlog import EventLog, Stored
from services.runtime.tasks import cancel_and_wait

#: A live stream quiet this long gets a comment line.
KEEP_ALIVE_S: Final = 15.0


@get("/v1/events", responses=FOUND_ERRORS, tags=["timeline"])
async def event_stream(
    ctx: Ctx,
    caller: Who,
    last_event_id: Annotated[
        str | None, HeaderParameter(name="Last-Event-ID", max_length=24)
    ] = None,
    after: After = None,
    job: QueryName = None,
) -> ServerSentEvent:
    """The live log as server-sent events (id: the stream sequence; event: the type). Resumes
    after `Last-Event-ID` (or `after`); without either, starts at the next event."""
    if last_event_id is not None:
        # ASCII digits and no more than a sequence can be (`isdigit` took "²", and a number
        # past the stream's 64-bit sequences had the reader retry five times a second)
        if re.fullmatch(r"[0-9]{1,19}", last_event_id) is None or int(last_event_id) > 1 << 62:
            raise fail(400, "Last-Event-ID must be a sequence number from 0 to 2^62, got "
                        f"{last_event_id!r}", "Last-Event-ID")  # fmt: skip
        after = int(last_event_id)
    if job is not None:
        await readable_job(ctx, caller, job)
    log_ = ctx.host.log
    start = (after + 1) if after is not None else (await log_.last_seq()) + 1
    # `>`: a node's report has its node after the event (`fl.job.<job>.<event>.<node>`)
    subject = f"fl.job.{job}.>" if job is not None else None
    seen = _Visibility(ctx, caller.visible)
    return ServerSentEvent(_stream(ctx.streams.take(), log_, start, subject, seen))


class _Visibility:
    """Whether a caller may see an event: every event for an admin; otherwise those of its
    projects and of their jobs, and those of no project (nodes, pools, the cluster). A job's
    project is learnt from its submission when the stream shows it, else read once."""

    def __init__(self, ctx: Context, visible: frozenset[str] | None) -> None:
        self.ctx = ctx
        self.visible = visible
        self.projects: dict[str, str | None] = {}  # job -> project

    async def shows(self, event: Event) -> bool:
        if isinstance(event, WorkRelayed):
            return False  # a copy of an event already shown, for one node's executor
        if self.visible is None:
            return True
        project = getattr(event, "project", None)
        job_id = getattr(event, "job_id", None)
        if isinstance(event, JobSubmitted):
            project = event.spec.project
        if job_id is not None:
            if project is not None:
                self.projects[job_id] = project
            elif job_id not in self.projects:
                if len(self.projects) > 100_000:  # bounded: a long stream forgets and asks again
                    self.projects.clear()
                async with self.ctx.db.acquire() as conn:
                    self.projects[job_id] = await queries.job_project(conn, job_id)
            project = self.projects[job_id]
            return project is not None and project in self.visible
        return project is None or project in self.visible


async def _stream(
    place: Place,
    log_: EventLog,
    start: int,
    subject: str | None,
    seen: _Visibility,
) -> AsyncGenerator[ServerSentEventMessage, None]:
    """The log from `start`, with a comment whenever it has been quiet for KEEP_ALIVE_S: it
    keeps proxies from closing the stream, and a client that has gone is noticed (the write
    fails) and its consumer closed, quiet log or not."""
    queue: asyncio.Queue[Stored] = asyncio.Queue(1000)
    reader = asyncio.create_task(_read_into(log_.follow(start, batch=500, subject=subject), queue))
    try:
        while True:
            try:
                async with asyncio.timeout(KEEP_ALIVE_S):
                    stored = await queue.get()
            except TimeoutError:
                if reader.done():
                    reader.result()  # its failure ends the stream
                yield ServerSentEventMessage(comment="keep-alive")
                continue
            if not await seen.shows(stored.event):
                continue
            yield ServerSentEventMessage(
                data=encode_event(stored.event).decode(),
                event=type(stored.event).__name__,
                id=stored.seq,
            )
    finally:
        place.give_back()
        await cancel_and_wait(reader)


async def _read_into(source: AsyncIterator[Stored], queue: asyncio.Queue[Stored]) -> None:
    try:
        async for stored in source:
            await queue.put(stored)
    finally:  # close the reader now (its consumer with it), not when it is collected
        close = getattr(source, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
