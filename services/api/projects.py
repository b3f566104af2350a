"""The project and pool routes: their terms (commands, admin), and the read models' projects,
pools and usage history.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any, Final

import msgspec
from litestar import Request, get, put
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody, PathParameter, QueryParameter

from events import SchedulerSettings
from events.commands import SetPool, SetProject
from events.versions import decode_event
from policy.commands.config import scheduler_problem
from services.api import history, queries
from services.api.callers import Who, may_read, need_admin
from services.api.commands import send_command
from services.api.context import Ctx
from services.api.errors import ADMIN_ERRORS, ERRORS, FOUND_ERRORS, fail, strictly
from services.api.params import PathName, Since, Until
from services.api.types import Accepted, Error, PoolRequest, Project, ProjectRequest, ProjectThen
from services.api.types import Pool as PoolView


@put("/v1/projects/{name:str}", responses=ADMIN_ERRORS, tags=["projects"])
async def set_project(
    ctx: Ctx,
    caller: Who,
    request: Request[Any, Any, Any],
    name: PathName,
    data: JSONBody[ProjectRequest],
) -> Accepted:
    """Create or change a project's terms in one pool (admin)."""
    data = await strictly(request, ProjectRequest)
    need_admin(caller, "change projects")
    command = SetProject(
        actor=caller.name,
        project=name,
        pool=data.pool,
        quota=data.quota,
        over_quota_weight=data.over_quota_weight,
        limit=data.limit,
        no_limit=data.no_limit,
        priority=data.priority,
    )
    return await send_command(ctx, command)


@put("/v1/pools/{name:str}", responses=ADMIN_ERRORS, tags=["pools"])
async def set_pool(
    ctx: Ctx,
    caller: Who,
    request: Request[Any, Any, Any],
    name: PathName,
    data: JSONBody[PoolRequest],
) -> Accepted:
    """Create a pool or set its own scheduler settings (admin)."""
    data = await strictly(request, PoolRequest)
    need_admin(caller, "change pools")
    settings = (
        SchedulerSettings(type=data.scheduler, fitting=data.fitting, victim_order=data.victim_order)
        if data.scheduler is not None
        else None
    )
    settings = _with_usage(settings, data)
    problem = scheduler_problem(settings)  # rule 11's bounds: said before anything is sent
    if problem is not None:
        raise fail(400, problem.reason, problem.field)
    return await send_command(ctx, SetPool(actor=caller.name, pool=name, scheduler=settings))


def _with_usage(settings: SchedulerSettings | None, data: PoolRequest) -> SchedulerSettings | None:
    """Rule 11's settings on the pool's own (a half-life alone gives it the default scheduler)."""
    if data.usage_half_life_s is None and data.usage_k == 1.0:
        return settings
    return msgspec.structs.replace(
        settings or SchedulerSettings(),
        usage_half_life_s=data.usage_half_life_s,
        usage_k=data.usage_k,
    )


@get("/v1/projects", responses=ERRORS, tags=["projects"])
async def list_projects(ctx: Ctx, caller: Who) -> list[Project]:
    """Projects with their quota, fair share and usage per pool, and over-quota periods."""
    async with ctx.db.acquire() as conn:
        return await queries.projects(conn)


@get("/v1/projects/{name:str}", responses=FOUND_ERRORS, tags=["projects"])
async def get_project(ctx: Ctx, caller: Who, name: PathName) -> Project:
    async with ctx.db.acquire() as conn:
        found = await queries.projects(conn, name)
    if not found:
        raise fail(404, f"unknown project {name!r}", "name")
    return found[0]


@get(
    "/v1/projects/{name:str}/as-of/{seq:int}",
    responses={**FOUND_ERRORS, 422: ResponseSpec(Error, description="too long a history")},
    tags=["timeline"],
)
async def project_as_of(
    ctx: Ctx,
    caller: Who,
    name: PathName,
    seq: Annotated[int, PathParameter(ge=1, le=1 << 62)],
) -> list[ProjectThen]:
    """A project's terms and usage per pool once the event at log position `seq` was applied."""
    may_read(caller, name)
    async with ctx.db.acquire() as conn:
        try:
            found = await queries.project_as_of(conn, name, seq)
        except queries.TooLong as e:
            raise fail(422, str(e), "seq") from None
    if not found:
        raise fail(404, f"project {name!r} had no terms or usage by position {seq}", "name")
    return found


@get("/v1/pools", responses=ERRORS, tags=["pools"])
async def list_pools(ctx: Ctx, caller: Who) -> list[PoolView]:
    """Pools with their GPUs, free and allocated, and their queue."""
    async with ctx.db.acquire() as conn:
        return await queries.pools(conn)


#: The most events the history route folds: it reads the whole timeline each time.
HISTORY_EVENTS_MAX: Final = 200_000


@get("/v1/history", responses=FOUND_ERRORS, tags=["projects"])
async def usage_history(
    ctx: Ctx,
    caller: Who,
    since: Since = None,
    until: Until = None,
    points: Annotated[int, QueryParameter(ge=2, le=history.POINTS_MAX)] = 60,
) -> history.History:
    """Each project's GPUs in use, quota and fair share per pool, and each pool's GPUs and
    GPUs allocated, at `points` evenly spaced times from `since` (default: the first event)
    to `until` (default: now), made again from the timeline."""
    async with ctx.db.acquire() as conn:
        rows = await conn.fetch(
            "SELECT seq, data::text AS data FROM timeline ORDER BY seq LIMIT $1",
            HISTORY_EVENTS_MAX + 1,
        )
    if len(rows) > HISTORY_EVENTS_MAX:
        raise fail(422, f"the log has more than {HISTORY_EVENTS_MAX} events: not yet drawn")
    events = [(r["seq"], decode_event(r["data"].encode())) for r in rows]
    first = events[0][1].time if events else time.time()
    start, end = since if since is not None else first, until if until is not None else time.time()
    if end <= start:
        raise fail(400, "until must be after since", "until")
    visible = caller.visible
    shows = None if visible is None else set(visible)
    at = history.times(start, end, points)
    async with ctx.audits:  # one whole-log fold at a time, in a worker thread
        return await asyncio.to_thread(history.history, events, at, shows)
