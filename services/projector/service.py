"""The projector service: the log in, PostgreSQL read models out.

One loop: a reader task puts the log's events on a bounded queue; the writer takes what is
there (up to `batch_max`), projects it and writes the rows with the new position in one
transaction. Busy, the batches grow; quiet, each event is written as it comes.

On start, and after any failure (PostgreSQL gone, a write refused), it starts over from what
PostgreSQL holds: the stored position says how far the rows go; the events up to it are folded
again without writing (the projection needs the fold's state), and writing resumes after it.

Any text the log holds is stored (`projections.storable`: a NUL becomes U+FFFD). An event
whose rows PostgreSQL still refuses for good (a data error: a number out of a column's range, a
value too large to index) is set aside rather than retried for ever, which froze every read
model: the writer starts over once, writing the failed batch one event at a time, records the
event that fails alone as `EventSetAside` on `fl.aside.projector`, moves the position past it
and goes on. Its rows are not written; later events about the same job write them again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Final

import asyncpg
import structlog

from events import EventSetAside, set_aside_id, subject_for
from projections import VERSION, Batch, Projection
from projections.storable import storable
from services.projector import store
from services.runtime.eventlog import EventLog, Stored
from services.runtime.postgres import PG_TRANSIENT, connect_pool, migrate
from services.runtime.tasks import cancel_and_wait

DEFAULT_NAME: Final = "main"
SERVICE: Final = "projector"
BATCH_MAX: Final = 2000
QUEUE_MAX: Final = 20_000
log = structlog.get_logger("fairlane.projector")


class Projector:
    def __init__(
        self, log: EventLog, dsn: str, *, name: str = DEFAULT_NAME, batch_max: int = BATCH_MAX
    ) -> None:
        self.log = log
        self.dsn = dsn
        self.name = name
        self.batch_max = batch_max
        self.position = 0  # the last sequence written (as far as this process knows)
        self.written = asyncio.Event()  # set after each write
        self.restarts = 0  # times it started over after a failure
        #: after a batch PostgreSQL refused for good: write the events up to here one by one,
        #: to find the one to set aside
        self.one_by_one_until = 0
        self.set_aside = 0  # events set aside by this process

    async def run(self) -> None:
        """Follow the log forever, starting over after any failure."""
        await self.log.ensure_stream()
        wait = 0.2
        while True:
            try:
                await self._project(until=None)
            except (store.PositionMoved, asyncpg.PostgresError, *PG_TRANSIENT) as e:
                self.restarts += 1
                log.warning("projector starts over", error=str(e) or repr(e))
                await asyncio.sleep(wait)
                wait = min(wait * 2, 2.0)

    async def rebuild(self) -> int:
        """Empty the read models and project the whole log as it is now; returns the last
        sequence written. A projector running beside it notices and starts over."""
        await self.log.ensure_stream()
        pool = await connect_pool(self.dsn)
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
                await store.reset(conn, self.name)
        finally:
            await _close(pool)
        until = await self.log.last_seq()
        while True:
            try:
                await self._project(until=until)
                return self.position
            except asyncpg.PostgresError as e:
                if not store.permanent(e) or self.one_by_one_until <= self.position:
                    raise
                # a batch refused for good: again, one event at a time up to its end

    async def _project(self, until: int | None) -> None:
        pool = await connect_pool(self.dsn, retry_for=3600.0)
        reader: asyncio.Task[None] | None = None
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
                written = await store.position(conn, self.name)
                if written > await self.log.last_seq():
                    log.warning("the log is shorter than the read models: rebuilding")
                    await store.reset(conn, self.name)
                    written = 0
                elif written and (found := await store.version(conn, self.name)) != VERSION:
                    log.warning("read models of another projection version: rebuilding",
                                found=found, version=VERSION)  # fmt: skip
                    await store.reset(conn, self.name)
                    written = 0
            self.position = written
            if until is not None and until <= written:
                return
            projection = Projection()
            queue: asyncio.Queue[Stored] = asyncio.Queue(QUEUE_MAX)
            source = self.log.read(1) if until is not None else self.log.follow(1)
            reader = asyncio.create_task(_pump(source, queue))
            log.info("projecting", from_seq=written + 1, replaying_to=written)
            while until is None or self.position < until:
                batch = await _next_items(queue, reader, self.batch_max)
                if not batch:
                    break  # the log as it was (a rebuild) is all read
                stored_already = [s for s in batch if s.seq <= written]
                for stored in stored_already:  # folded again, not written again
                    projection.apply(stored.seq, stored.event)
                if stored_already:
                    projection.discard()
                if len(stored_already) == len(batch):
                    continue
                for chunk in self._chunks(batch[len(stored_already) :]):
                    for stored in chunk:
                        projection.apply(stored.seq, stored.event)
                    await self._write(pool, storable(projection.take()), chunk)
                self.written.set()
                self.written.clear()
        finally:
            if reader is not None:
                await cancel_and_wait(reader)
            await _close(pool)

    def _chunks(self, fresh: list[Stored]) -> list[list[Stored]]:
        """The events to write, each alone up to `one_by_one_until`, the rest together."""
        alone = [[s] for s in fresh if s.seq <= self.one_by_one_until]
        rest = fresh[len(alone) :]
        return [*alone, rest] if rest else alone

    async def _write(self, pool: asyncpg.Pool, rows: Batch, chunk: list[Stored]) -> None:
        try:
            async with pool.acquire() as conn:
                await store.write(conn, self.name, self.position, rows)
        except asyncpg.PostgresError as e:
            if not store.permanent(e):
                raise
            if len(chunk) > 1:  # which of them: start over, writing these one by one
                self.one_by_one_until = rows.last_seq
                log.warning(
                    "PostgreSQL refused a batch: writing it one event at a time",
                    from_seq=chunk[0].seq,
                    to_seq=rows.last_seq,
                    error=str(e),
                )
                raise
            await self._set_aside(chunk[0], e)
            async with pool.acquire() as conn:
                await store.write(conn, self.name, self.position, _nothing(rows.last_seq))
        self.position = rows.last_seq

    async def _set_aside(self, stored: Stored, error: asyncpg.PostgresError) -> None:
        subject = subject_for(stored.event)
        reason = f"PostgreSQL refused its rows: {type(error).__name__}: {error}"
        log.error("event set aside", seq=stored.seq, subject=subject, reason=reason)
        await self.log.publish_durably(
            EventSetAside(
                id=set_aside_id(SERVICE, stored.seq, subject),
                time=stored.event.time,
                actor=SERVICE,
                causation=stored.event.id,
                service=SERVICE,
                seq=stored.seq,
                subject=subject,
                reason=reason,
            )
        )
        self.set_aside += 1


def _nothing(last_seq: int) -> Batch:
    """No rows, only the position: past an event set aside."""
    return Batch(last_seq, [], [], [], [], [], [])


async def _close(pool: asyncpg.Pool) -> None:
    """Close gracefully if the server answers; a pool whose server went away can wait on its
    connections for ever (seen when PostgreSQL stopped mid-write), so then just drop them."""
    try:
        async with asyncio.timeout(5.0):
            await pool.close()
    except (TimeoutError, asyncpg.PostgresError, *PG_TRANSIENT):
        pool.terminate()


async def _pump(source: AsyncIterator[Stored], queue: asyncio.Queue[Stored]) -> None:
    try:
        async for stored in source:
            await queue.put(stored)
    finally:  # close the reader now (its consumer with it), not when it is collected
        close = getattr(source, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()


async def _next_items(
    queue: asyncio.Queue[Stored], reader: asyncio.Task[None], most: int
) -> list[Stored]:
    """At least one event (waiting for it) and whatever else is queued, up to `most`; none
    once the source has ended and everything is taken."""
    while True:
        if not queue.empty():
            items = [queue.get_nowait()]
            break
        if reader.done():
            reader.result()  # the reader's failure is the projector's
            return []
        getting = asyncio.ensure_future(queue.get())
        await asyncio.wait({getting, reader}, return_when=asyncio.FIRST_COMPLETED)
        if getting.done():
            items = [getting.result()]
            break
        getting.cancel()
    while len(items) < most and not queue.empty():
        items.append(queue.get_nowait())
    return items
