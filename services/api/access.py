"""The token routes (admin: create, list, revoke) and `whoami`."""

from __future__ import annotations

import time
from typing import Any

import asyncpg
from litestar import Request, delete, get, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import JSONBody

from services.api import tokens
from services.api.callers import Who, need_admin
from services.api.context import Ctx
from services.api.errors import ADMIN_ERRORS, ERRORS, fail, strictly
from services.api.params import PathName
from services.api.types import Error, TokenCreated, TokenInfo, TokenRequest, Whoami


@post(
    "/v1/tokens",
    status_code=201,
    responses={**ADMIN_ERRORS, 409: ResponseSpec(Error, description="the name is taken")},
    tags=["access"],
)
async def create_token(
    ctx: Ctx, caller: Who, request: Request[Any, Any, Any], data: JSONBody[TokenRequest]
) -> TokenCreated:
    """A new API token for some projects (admin). The token is shown only here."""
    data = await strictly(request, TokenRequest)
    need_admin(caller, "create tokens")
    expires_at = None if data.expires_in_s is None else time.time() + data.expires_in_s
    async with ctx.db.acquire() as conn:
        try:
            token = await tokens.create(conn, data.name, data.projects, data.admin, expires_at)
        except asyncpg.UniqueViolationError:
            raise fail(409, f"a token named {data.name!r} exists", "name") from None
    return TokenCreated(data.name, token, sorted(set(data.projects)), data.admin, expires_at)


@get("/v1/tokens", responses=ADMIN_ERRORS, tags=["access"])
async def list_tokens(ctx: Ctx, caller: Who) -> list[TokenInfo]:
    """Every token's name, projects, expiry and creation time (admin); never the token."""
    need_admin(caller, "list tokens")
    async with ctx.db.acquire() as conn:
        rows = await conn.fetch(
            "SELECT name, projects, admin, expires_at, extract(epoch FROM created_at) AS created"
            " FROM api_tokens ORDER BY name"
        )
    return [
        TokenInfo(r["name"], list(r["projects"]), r["admin"], r["expires_at"], float(r["created"]))
        for r in rows
    ]


@delete(
    "/v1/tokens/{name:str}",
    status_code=200,
    responses={**ADMIN_ERRORS, 404: ResponseSpec(Error, description="no such token")},
    tags=["access"],
)
async def revoke_token(ctx: Ctx, caller: Who, name: PathName) -> TokenInfo:
    """Revoke a token (admin): it is refused from now on. The admin token is the cluster's
    own (kept in its file and installed again at each start): it is not revoked here."""
    need_admin(caller, "revoke tokens")
    if name == tokens.ADMIN_NAME:
        raise fail(422, "the admin token is the cluster's own: replace its file instead", "name")
    async with ctx.db.acquire() as conn:
        gone = await tokens.revoke(conn, name)
    if gone is None:
        raise fail(404, f"no token named {name!r}", "name")
    return TokenInfo(gone.name, sorted(gone.projects), gone.admin, gone.expires_at)


@get("/v1/whoami", responses=ERRORS, tags=["access"])
async def whoami(caller: Who) -> Whoami:
    """Who the token is: its name, whether it is an admin token, its projects, its expiry."""
    return Whoami(caller.name, caller.admin, sorted(caller.projects), caller.expires_at)
