"""What `fairlane status` says of the log itself: how far behind the read models are, and
every event a service set aside (`EventSetAside`) because it could not handle it.

A service that cannot handle one event sets it aside and goes on (it used to crash-loop or
retry for ever on it, every other event stuck behind it); the record of it is on the log, on
`fl.aside.<service>`, and this is where a person sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Final

import asyncpg
import msgspec

from cluster.cluster_file import ClusterFile
from events import EventSetAside
from services.runtime.auth import ADMIN, load_credentials
from services.runtime.eventlog import JetStreamLog, connect

ASIDE_SUBJECTS: Final = "fl.aside.>"
#: Events set aside that status lists (the newest; it says how many there are in all).
SHOWN: Final = 20
#: How long status waits on the bus and PostgreSQL before saying it could not look.
LOOK_S: Final = 10.0


class LogHealth(msgspec.Struct, frozen=True):
    log_seq: int
    #: the last event the read models hold; None where PostgreSQL could not be read
    projected_seq: int | None
    set_aside: tuple[EventSetAside, ...] = ()
    #: False for a cluster started without PostgreSQL (no projector, nothing to be behind)
    read_models: bool = True


def describe(health: LogHealth) -> tuple[list[str], list[str]]:
    """Lines to print, and warnings: the projector's lag and each event set aside."""
    lines: list[str] = []
    warnings: list[str] = []
    if not health.read_models:
        pass
    elif health.projected_seq is None:
        warnings.append("could not read the read models' position from PostgreSQL")
    else:
        behind = max(0, health.log_seq - health.projected_seq)
        lines.append(
            f"read models at event {health.projected_seq} of the log's {health.log_seq}"
            f" ({behind} behind)"
        )
    shown = health.set_aside[-SHOWN:]
    if len(health.set_aside) > len(shown):
        warnings.append(f"{len(health.set_aside)} events set aside; the last {SHOWN}:")
    for aside in shown:
        warnings.append(
            f"{aside.service} set aside event {aside.seq} ({aside.subject}): {aside.reason}"
        )
    return lines, warnings


async def look(info: ClusterFile) -> LogHealth:
    """Read the log's end, the events set aside and the read models' position."""
    creds = load_credentials(Path(info.credentials_dir) / f"{ADMIN}.json")
    nc = await connect(info.nats_url, "fairlane-status", retry_for=LOOK_S, credentials=creds)
    try:
        log = JetStreamLog(nc)
        log_seq = await log.last_seq()
        aside = [s.event async for s in log.read(1, subject=ASIDE_SUBJECTS)]
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    return LogHealth(
        log_seq=log_seq,
        projected_seq=await _projected(info.postgres_uri) if info.postgres_uri else None,
        set_aside=tuple(e for e in aside if isinstance(e, EventSetAside)),
        read_models=bool(info.postgres_uri),
    )


async def _projected(dsn: str) -> int | None:
    try:
        conn = await asyncpg.connect(dsn, timeout=LOOK_S)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return None
    try:
        seq = await conn.fetchval("SELECT max(seq) FROM projector_position")
        return int(seq or 0)
    except asyncpg.PostgresError:
        return None
    finally:
        await conn.close()


def look_now(info: ClusterFile) -> LogHealth | str:
    """`look`, or why it could not: status prints the programs' states whatever happens."""
    if not info.credentials_dir:
        return "the log is not looked at: the cluster runs on a NATS server it did not start"
    try:
        return asyncio.run(asyncio.wait_for(look(info), 3 * LOOK_S))
    except Exception as e:  # a server down is one of the things status is run to find
        return f"could not read the event log: {e!r}"
