"""Writing a batch of projected rows, and the position it brings the read models to, in one
transaction: a crash before the commit leaves the rows and the position as they were, a
crash after leaves both new, so an event is never applied twice nor skipped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import asyncpg
import msgspec

from projections import (
    VERSION,
    Batch,
    JobRow,
    NodeRow,
    OverQuotaRow,
    PreemptionRow,
    ProjectPoolRow,
    TimelineRow,
)

#: Tables the projector owns (what a rebuild empties), with their primary keys.
TABLES: Final[dict[str, tuple[type[msgspec.Struct], tuple[str, ...]]]] = {
    "timeline": (TimelineRow, ("seq",)),
    "jobs": (JobRow, ("job_id",)),
    "nodes": (NodeRow, ("node",)),
    "project_pools": (ProjectPoolRow, ("project", "pool")),
    "over_quota_periods": (OverQuotaRow, ("project", "pool", "started_seq")),
    "preemptions": (PreemptionRow, ("seq",)),
}


#: Longest a write may take before the projector gives up on the connection and starts over.
WRITE_TIMEOUT_S: Final = 60.0


#: SQLSTATE classes that the same rows meet again however often they are written: data
#: exceptions (22: a number out of range, bad text), integrity violations (23) and program
#: limits (54: a value too large to index). Anything else (a connection lost, a server
#: shutting down, a lock) may pass, and the projector starts over.
PERMANENT_CLASSES: Final = frozenset({"22", "23", "54"})


def permanent(error: asyncpg.PostgresError) -> bool:
    """Whether writing the same rows again would fail the same way."""
    return str(getattr(error, "sqlstate", "") or "")[:2] in PERMANENT_CLASSES


class PositionMoved(Exception):
    """The read models are not where this projector left them: someone else wrote (a rebuild,
    or a second projector). The writer starts again from what is stored."""


def _upsert_sql(table: str, row_type: type[msgspec.Struct], key: tuple[str, ...]) -> str:
    fields = row_type.__struct_fields__
    columns = ", ".join(f'"{f}"' for f in fields)
    values = ", ".join(f"${i}" for i in range(1, len(fields) + 1))
    updates = ", ".join(f'"{f}" = EXCLUDED."{f}"' for f in fields if f not in key)
    conflict = ", ".join(f'"{k}"' for k in key)
    return (
        f"INSERT INTO {table} ({columns}) VALUES ({values}) "
        f"ON CONFLICT ({conflict}) DO UPDATE SET {updates}"
    )


_UPSERTS: Final = {table: _upsert_sql(table, *spec) for table, spec in TABLES.items()}


async def position(conn: asyncpg.Connection, name: str) -> int:
    seq = await conn.fetchval("SELECT seq FROM projector_position WHERE name = $1", name)
    return int(seq or 0)


async def version(conn: asyncpg.Connection, name: str) -> int | None:
    """The projection version that wrote the read models (None: nothing written yet)."""
    found = await conn.fetchval("SELECT version FROM projector_position WHERE name = $1", name)
    return None if found is None else int(found)


async def write(conn: asyncpg.Connection, name: str, expected: int, batch: Batch) -> None:
    """Store `batch`, which follows position `expected`, and move the position to its end."""
    async with conn.transaction():
        found = await conn.fetchval(
            "SELECT seq FROM projector_position WHERE name = $1 FOR UPDATE", name
        )
        if int(found or 0) != expected:
            raise PositionMoved(f"read models at {found}, this projector at {expected}")
        if batch.timeline:
            await conn.copy_records_to_table(
                "timeline",
                records=[msgspec.structs.astuple(r) for r in batch.timeline],
                columns=list(TimelineRow.__struct_fields__),
                timeout=WRITE_TIMEOUT_S,
            )
        await _upsert(conn, "jobs", batch.jobs)
        await _upsert(conn, "nodes", batch.nodes)
        await _upsert(conn, "project_pools", batch.project_pools)
        await _upsert(conn, "over_quota_periods", batch.over_quota)
        await _upsert(conn, "preemptions", batch.preemptions)
        await conn.execute(
            "INSERT INTO projector_position (name, seq, version) VALUES ($1, $2, $3)"
            " ON CONFLICT (name) DO UPDATE SET seq = EXCLUDED.seq, version = EXCLUDED.version,"
            " updated_at = now()",
            name,
            batch.last_seq,
            VERSION,
        )


async def _upsert(conn: asyncpg.Connection, table: str, rows: Sequence[msgspec.Struct]) -> None:
    if rows:
        await conn.executemany(
            _UPSERTS[table], [msgspec.structs.astuple(r) for r in rows], timeout=WRITE_TIMEOUT_S
        )


async def reset(conn: asyncpg.Connection, name: str) -> None:
    """Empty every read model and set the position back to nothing, at once."""
    async with conn.transaction():
        await conn.execute(f"TRUNCATE {', '.join(TABLES)}")
        await conn.execute(
            "INSERT INTO projector_position (name, seq, version) VALUES ($1, 0, $2)"
            " ON CONFLICT (name) DO UPDATE SET seq = 0, version = EXCLUDED.version,"
            " updated_at = now()",
            name,
            VERSION,
        )
