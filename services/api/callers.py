"""Who calls: the bearer token each request carries, and what it may read or act on (any token
reads; acting on a job needs a token for its project; projects, pools and tokens an admin).
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.di import NamedDependency
from litestar.exceptions import NotAuthorizedException, PermissionDeniedException

from services.api import queries, tokens
from services.api.context import Context, Ctx
from services.api.errors import fail
from services.api.tokens import Caller

Who = NamedDependency[Caller]


async def get_caller(request: Request[Any, Any, Any], ctx: Ctx) -> Caller:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise NotAuthorizedException(
            detail="an API token is needed: Authorization: Bearer <token>",
            extra={"field": "Authorization"},
        )
    async with ctx.db.acquire() as conn:
        try:
            caller = await tokens.lookup(conn, token.strip())
        except tokens.Expired as e:
            raise NotAuthorizedException(
                detail=f"API token {e} has expired (an admin makes a new one: fairlane token "
                "create)",
                extra={"field": "Authorization"},
            ) from None
    if caller is None:
        raise NotAuthorizedException(detail="unknown API token", extra={"field": "Authorization"})
    return caller


def may_act(caller: Caller, project: str) -> None:
    if not caller.may_act_on(project):
        raise PermissionDeniedException(
            detail=f"token {caller.name!r} may not act on project {project!r}",
            extra={"field": "project"},
        )


def may_read(caller: Caller, project: str) -> None:
    if not caller.may_act_on(project):
        raise PermissionDeniedException(
            detail=f"token {caller.name!r} may not read project {project!r}",
            extra={"field": "project"},
        )


async def readable_job(ctx: Context, caller: Caller, job_id: str) -> None:
    """404 for a job nobody knows, 403 for another project's."""
    if caller.admin:
        return
    async with ctx.db.acquire() as conn:
        project = await queries.job_project(conn, job_id)
    if project is None:
        raise fail(404, f"unknown job id {job_id!r}", "job_id")
    may_read(caller, project)


def need_admin(caller: Caller, what: str) -> None:
    if not caller.admin:
        raise PermissionDeniedException(
            detail=f"an admin token is needed to {what}", extra={"field": "Authorization"}
        )
