"""API tokens: who may act on which projects. Only a SHA-256 of each token is stored: tokens
are 256 random bits, so a plain hash is as good as a slow one and checks in microseconds."""

from __future__ import annotations

import hashlib
import os
import secrets
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


async def lookup(conn: asyncpg.Connection, token: str) -> Caller | None:
    row = await conn.fetchrow(
        "SELECT name, admin, projects FROM api_tokens WHERE token_sha256 = $1", hash_token(token)
    )
    if row is None:
        return None
    return Caller(row["name"], row["admin"], frozenset(row["projects"]))


async def create(conn: asyncpg.Connection, name: str, projects: list[str], admin: bool) -> str:
    """A new token (returned once); raises asyncpg.UniqueViolationError if the name is taken."""
    token = new_token()
    await conn.execute(
        "INSERT INTO api_tokens (name, token_sha256, admin, projects) VALUES ($1, $2, $3, $4)",
        name,
        hash_token(token),
        admin,
        sorted(set(projects)),
    )
    return token


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
