"""PostgreSQL for the read side: connecting with retries, and the schema's migrations.

Migrations are the plain SQL files in projections/migrations/, applied in name order, each
once, in its own transaction, under an advisory lock: several processes starting together
(the projector, the API) apply them once between them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Final

import asyncpg
import structlog

#: Where the projector and the API take their DSN from when no --postgres is given: the
#: environment, which only the process's own user (and root) can read, not the argv.
DSN_ENV: Final = "FAIRLANE_POSTGRES_DSN"
MIGRATIONS: Final = Path(__file__).resolve().parents[2] / "projections" / "migrations"
#: The advisory lock key that serializes migrations (any fixed 64-bit number).
MIGRATION_LOCK: Final = 0x46414952_4C4E4531
#: Errors that pass when the server is back.
PG_TRANSIENT: Final = (
    OSError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.InterfaceError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.ConnectionFailureError,
    # a pooled connection whose server went away mid-operation, found when it is released
    # ("cannot switch to state 15; another operation (2) is in progress")
    asyncpg.exceptions.InternalClientError,
    TimeoutError,
)
log = structlog.get_logger("fairlane.postgres")


async def connect_pool(
    dsn: str, retry_for: float = 30.0, min_size: int = 1, max_size: int = 4
) -> asyncpg.Pool:
    """A connection pool, retrying while the server starts."""
    deadline = asyncio.get_running_loop().time() + retry_for
    while True:
        try:
            pool: asyncpg.Pool = await asyncpg.create_pool(
                dsn, min_size=min_size, max_size=max_size, command_timeout=60
            )
            return pool
        except PG_TRANSIENT as e:
            if asyncio.get_running_loop().time() > deadline:
                raise
            log.warning("postgres not reachable yet", error=str(e) or repr(e))
            await asyncio.sleep(0.3)


async def migrate(conn: asyncpg.Connection, folder: Path = MIGRATIONS) -> list[str]:
    """Apply the migrations not applied yet; returns their names."""
    applied: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations"
            " (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")}
        for path in sorted(folder.glob("*.sql")):
            if path.name in done:
                continue
            async with conn.transaction():
                await conn.execute(path.read_text())
                await conn.execute("INSERT INTO schema_migrations (name) VALUES ($1)", path.name)
            applied.append(path.name)
            log.info("migration applied", name=path.name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
    return applied
