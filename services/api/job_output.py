"""The output route: an attempt's output read back through the host (the pure handling of its
chunks: services/api/logs.py), whole or followed as a live stream.
"""

from __future__ import annotations

from typing import Annotated, Final

from litestar import Response, get
from litestar.params import QueryParameter
from litestar.response import Stream

from services.api import logs, queries
from services.api.callers import Who, readable_job
from services.api.context import Ctx
from services.api.errors import FOUND_ERRORS, fail
from services.api.params import PathName
from services.api.streams import held

#: A time the log stream can start from (a date, so before the year 10000).
LogSince = Annotated[
    float | None, QueryParameter(ge=0, le=253_402_300_799, description="from this time")
]
#: The states in which an attempt may still write output.
LIVE_STATES: Final = frozenset({"starting", "running", "stopping"})


@get(
    "/v1/jobs/{job_id:str}/logs",
    media_type="text/plain; charset=utf-8",
    responses=FOUND_ERRORS,
    tags=["jobs"],
)
async def job_logs(
    ctx: Ctx,
    caller: Who,
    job_id: PathName,
    attempt: Annotated[int | None, QueryParameter(ge=1, le=1_000_000)] = None,
    follow: Annotated[bool, QueryParameter(description="stream until the attempt ends")] = False,
    max_bytes: Annotated[int, QueryParameter(ge=1, le=64 << 20)] = logs.DEFAULT_MAX_BYTES,
    since: LogSince = None,
) -> Response[bytes] | Stream:
    """An attempt's output (default: the latest), every replica's, as the workload wrote it
    (lines prefixed `[replica N]` where there are several). `follow` streams it as it comes
    until the attempt ends; otherwise the last `max_bytes` of what there is. `since`: only
    what was shipped from that time on (the executor ships output every second or so)."""
    await readable_job(ctx, caller, job_id)
    async with ctx.db.acquire() as conn:
        job = await queries.job_detail(conn, job_id)
    if job is None:
        raise fail(404, f"unknown job id {job_id!r}", "job_id")
    if job.attempt == 0:
        raise fail(404, f"job {job_id!r} has not started yet ({job.state})", "attempt")
    wanted = attempt or job.attempt
    if wanted > job.attempt:
        raise fail(404, f"job {job_id!r} has had {job.attempt} attempt(s), not {wanted}",
                    "attempt")  # fmt: skip

    async def over() -> bool:
        async with ctx.db.acquire() as conn:
            now = await queries.job_detail(conn, job_id)
        return now is None or now.attempt != wanted or now.state not in LIVE_STATES

    lines = logs.Lines(prefixed=job.replicas > 1)
    reader = ctx.host.output()
    output = logs.read_output(
        reader, job_id, wanted, lines, follow=follow, attempt_over=over, since=since
    )
    if not follow:
        return Response(await logs.tail(output, max_bytes), media_type="text/plain")
    return Stream(held(ctx.streams.take(), output), media_type="text/plain")
