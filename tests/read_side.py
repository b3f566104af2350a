"""Helpers for the read side's tests: writing a log fast, reading the read models back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable

import asyncpg
import uvicorn
from litestar import Litestar

from cluster.servers import free_port
from events import Event, encode_event, subject_for
from services.projector.store import TABLES
from services.runtime.eventlog import JetStreamLog
from services.runtime.postgres import PG_TRANSIENT


async def publish_all(log: JetStreamLog, events: Iterable[Event], chunk: int = 2000) -> int:
    """Store events as the services would (ids as `Nats-Msg-Id`), a chunk at a time; returns
    the stream's last sequence once all are stored (the events are new: none is a repeat)."""
    pending, sent = 0, 0
    first = await log.last_seq()
    for event in events:
        sent += 1
        await log.nc.publish(
            subject_for(event), encode_event(event), headers={"Nats-Msg-Id": event.id}
        )
        pending += 1
        if pending == chunk:
            await log.nc.flush(timeout=30)
            pending = 0
    await log.nc.flush(timeout=30)
    while (last := await log.last_seq()) < first + sent:  # noqa: ASYNC110 (polled)
        await asyncio.sleep(0.02)
    return last


async def wait_position(
    dsn: str,
    seq: int,
    within: float = 60.0,
    name: str = "main",
    projector: asyncio.Task[None] | None = None,
) -> None:
    """Until the projector has written up to `seq` or past it (PostgreSQL may be starting or
    the schema not there yet: asked again until `within`). A `projector` task that ends
    meanwhile fails the wait at once, with what ended it."""
    deadline = asyncio.get_running_loop().time() + within
    found = None
    while True:
        if projector is not None and projector.done():
            raise AssertionError(f"the projector ended at {found}") from projector.exception()
        try:
            conn = await asyncpg.connect(dsn)
            try:
                found = await conn.fetchval(
                    "SELECT seq FROM projector_position WHERE name=$1", name
                )
            finally:
                await conn.close()
        except (asyncpg.UndefinedTableError, *PG_TRANSIENT):
            pass
        if found is not None and found >= seq:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"projector at {found}, expected {seq}")
        await asyncio.sleep(0.1)


async def dump(dsn: str) -> dict[str, list[tuple[object, ...]]]:
    """Every read model's rows, in key order."""
    conn = await asyncpg.connect(dsn)
    try:
        tables = {}
        for table, (_, key) in TABLES.items():
            order = ", ".join(f'"{k}"' for k in key)
            rows = await conn.fetch(f"SELECT * FROM {table} ORDER BY {order}")
            tables[table] = [tuple(r.values()) for r in rows]
        return tables
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def serve(app: Litestar) -> AsyncIterator[str]:
    """The app served by uvicorn on a free loopback port, as `python -m services.api` serves
    it (a real server: the live stream needs one that streams); yields its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the API server stopped while starting")
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        done, _ = await asyncio.wait({task}, timeout=5.0)
        if not done:
            server.force_exit = True  # a live stream still open would hold it
            await task
