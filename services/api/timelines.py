"""The timeline routes: each job's, project's and node's events and the whole log's, in one window
of query parameters; re-deriving decisions (the audit); the preemptions that made room.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Annotated, Any, Final

import msgspec
from litestar import get
from litestar.di import NamedDependency
from litestar.params import QueryParameter

from events.catalogue import AnyEvent
from policy.audit import Scope
from services.api import audit as api_audit
from services.api import queries
from services.api.callers import Who, may_read, need_admin, readable_job
from services.api.context import Context, Ctx
from services.api.errors import AUDIT_ERRORS, ERRORS, FOUND_ERRORS, fail
from services.api.params import After, Limit, PathName, QueryName, Since, Types, Until
from services.api.tokens import Caller
from services.api.types import Preemption, TimelinePage

#: The event types a timeline may be filtered by.
EVENT_TYPES: Final = frozenset(t.__name__ for t in typing.get_args(AnyEvent))


@dataclass(frozen=True, slots=True)
class Window:
    """Which events of a timeline a request asks for: the same query parameters on every
    timeline route (a dependency, so they are declared, documented and checked once)."""

    types: list[str] | None
    since: float | None
    until: float | None
    after: int | None
    limit: int
    before: int | None = None
    newest: bool = False


Before = Annotated[
    int | None,
    QueryParameter(ge=1, le=1 << 62, description="only events before this log position"),
]
Newest = Annotated[
    bool,
    QueryParameter(
        description="the last `limit` events that match (still in log order) instead of the "
        "first; `next` is then the position to pass as `before` for the earlier ones"
    ),
]


def get_window(
    types: Types = None,
    since: Since = None,
    until: Until = None,
    after: After = None,
    limit: Limit = 100,
    before: Before = None,
    newest: Newest = False,
) -> Window:
    for name in types or ():
        if name not in EVENT_TYPES:
            raise fail(400, f"unknown event type {name!r}", "type")
    return Window(types, since, until, after, limit, before, newest)


Span = NamedDependency[Window]


async def _timeline(ctx: Context, caller: Caller, window: Window, **about: str) -> TimelinePage:
    async with ctx.db.acquire() as conn:
        items, next_after = await queries.timeline(
            conn,
            **about,
            visible=caller.visible,
            types=window.types,
            since=window.since,
            until=window.until,
            after=window.after,
            limit=window.limit,
            before=window.before,
            newest=window.newest,
        )
    return TimelinePage(items=items, next=next_after)


@get("/v1/jobs/{job_id:str}/timeline", responses=AUDIT_ERRORS, tags=["timeline"])
async def job_timeline(
    ctx: Ctx,
    caller: Who,
    window: Span,
    job_id: PathName,
    rederive: Annotated[
        bool, QueryParameter(description="say of each decision whether the policy gives it")
    ] = False,
) -> TimelinePage:
    """A job's events in log order, each with its reason and the facts the policy used; with
    `rederive`, each decision also says what the policy, re-run on the state it was made
    from, gives (`rederived: matches`, or how it differs)."""
    await readable_job(ctx, caller, job_id)
    page = await _timeline(ctx, caller, window, job=job_id)
    if not rederive:
        return page
    try:
        outcomes = await api_audit.outcomes_for_job(ctx.host.log, ctx.audits, job_id)
    except api_audit.TooLong as e:
        raise fail(422, str(e), "rederive") from None
    items = [msgspec.structs.replace(e, rederived=outcomes.get(e.seq)) for e in page.items]
    return TimelinePage(items=items, next=page.next)


@get("/v1/audit", responses=AUDIT_ERRORS, tags=["timeline"])
async def audit_log(
    ctx: Ctx,
    caller: Who,
    first: Annotated[int, QueryParameter(name="from", ge=1, le=1 << 62)] = 1,
    last: Annotated[int | None, QueryParameter(name="to", ge=1, le=1 << 62)] = None,
    job: QueryName = None,
) -> dict[str, Any]:
    """Re-derive the decisions on the log (between positions `from` and `to`, about `job`):
    how many matched what the policy gives, and for each that did not, what the policy gives
    instead; as `fairlane audit -o json` prints it. The whole log needs an admin token; one
    job's decisions, a token covering its project."""
    if last is not None and last < first:
        raise fail(400, f"to={last} is before from={first}: not a range of log positions", "to")
    if job is None:
        need_admin(caller, "audit the whole log")
    else:
        await readable_job(ctx, caller, job)
    try:
        return await api_audit.audit_log(ctx.host.log, ctx.audits, Scope(first, last, job))
    except api_audit.TooLong as e:
        raise fail(422, str(e), "to") from None


@get("/v1/projects/{name:str}/timeline", responses=FOUND_ERRORS, tags=["timeline"])
async def project_timeline(ctx: Ctx, caller: Who, window: Span, name: PathName) -> TimelinePage:
    """The events of a project and of its jobs."""
    may_read(caller, name)
    return await _timeline(ctx, caller, window, project=name)


@get("/v1/nodes/{name:str}/timeline", responses=ERRORS, tags=["timeline"])
async def node_timeline(ctx: Ctx, caller: Who, window: Span, name: PathName) -> TimelinePage:
    """The events of a node and of the jobs placed on it."""
    return await _timeline(ctx, caller, window, node=name)


@get("/v1/timeline", responses=ERRORS, tags=["timeline"])
async def whole_timeline(ctx: Ctx, caller: Who, window: Span) -> TimelinePage:
    """Every event, by type and between times."""
    return await _timeline(ctx, caller, window)


@get("/v1/preemptions", responses=ERRORS, tags=["timeline"])
async def list_preemptions(
    ctx: Ctx,
    caller: Who,
    victim: QueryName = None,
    beneficiary: QueryName = None,
    after: After = None,
    limit: Limit = 100,
) -> list[Preemption]:
    """Preemptions that made room: victim, for whom, why, and the work lost."""
    async with ctx.db.acquire() as conn:
        items, _ = await queries.preemptions(
            conn,
            victim=victim,
            beneficiary=beneficiary,
            after=after,
            limit=limit,
            visible=caller.visible,
        )
    return items
