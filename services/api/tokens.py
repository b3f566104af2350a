"""API tokens: who may act on which projects. Only a SHA-256 of each token is stored: tokens
are 256 random bits, so a plain hash is as good as a slow one and checks in microseconds."""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import asyncpg

PREFIX: Final = "fl_"
ADMIN_NAME: Final = "admin"


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    admin: bool
    projects: frozenset[str]
    #: Unix seconds after which the token is refused (None: never)
    expires_at: float | None = None

    def may_act_on(self, project: str) -> bool:
        return self.admin or project in self.projects

    @property
    def visible(self) -> frozenset[str] | None:
        """The projects whose jobs this caller may read (None: every project). Acting and
        reading go together: a team sees its own jobs, their timelines and their logs."""
        return None if self.admin else self.projects


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


class Expired(Exception):
    """The token is known, but its time is over."""


async def lookup(conn: asyncpg.Connection, token: str, now: float | None = None) -> Caller | None:
    """The token's holder; None for an unknown token; Expired for one whose time is over."""
    row = await conn.fetchrow(
        "SELECT name, admin, projects, expires_at FROM api_tokens WHERE token_sha256 = $1",
        hash_token(token),
    )
    if row is None:
        return None
    caller = Caller(row["name"], row["admin"], frozenset(row["projects"]), row["expires_at"])
    if caller.expires_at is not None and caller.expires_at <= (now or time.time()):
        raise Expired(caller.name)
    return caller


async def create(
    conn: asyncpg.Connection,
    name: str,
    projects: list[str],
    admin: bool,
    expires_at: float | None = None,
) -> str:
    """A new token (returned once); raises asyncpg.UniqueViolationError if the name is taken."""
    token = new_token()
    await conn.execute(
        "INSERT INTO api_tokens (name, token_sha256, admin, projects, expires_at)"
        " VALUES ($1, $2, $3, $4, $5)",
        name,
        hash_token(token),
        admin,
        sorted(set(projects)),
        expires_at,
    )
    return token


async def revoke(conn: asyncpg.Connection, name: str) -> Caller | None:
    """Delete the token named `name`: whom it was; None if there is none."""
    row = await conn.fetchrow(
        "DELETE FROM api_tokens WHERE name = $1 RETURNING name, admin, projects, expires_at", name
    )
    if row is None:
        return None
    return Caller(row["name"], row["admin"], frozenset(row["projects"]), row["expires_at"])


def admin_token_file(path: Path) -> str:
    """The admin token kept in `path`, made (readable by its owner only) if it is not there."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    token = new_token()
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token


async def install_admin(conn: asyncpg.Connection, token: str) -> None:
    """Make `token` the admin token (replacing an earlier one of that name)."""
    await conn.execute(
        "INSERT INTO api_tokens (name, token_sha256, admin, projects) VALUES ($1, $2, true, '{}')"
        " ON CONFLICT (name) DO UPDATE SET token_sha256 = EXCLUDED.token_sha256, admin = true",
        ADMIN_NAME,
        hash_token(token),
    )
