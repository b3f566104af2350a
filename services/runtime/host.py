"""What a service needs besides the event log: where commands reach it, leadership, snapshots.

On a cluster that is NATS (`NatsHost`: request/reply subjects, a KV lease, the snapshot object
store, all on the JetStream log's connection). In one process on the in-memory log
(`InProcessHost`) commands are handed to the services' handlers directly, each decision kind
has one leader for good, and there are no snapshots: the services are the same code either way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from events.commands import AnyCommand, Reply
from services.runtime.commands import Handler, answer, serve
from services.runtime.eventlog import EventLog, JetStreamLog
from services.runtime.lease import Lease
from services.runtime.snapshots import SnapshotStore


class Leadership(Protocol):
    """One writer per decision kind: wait to lead, keep leading, give it up."""

    @property
    def revision(self) -> int | None: ...

    async def acquire(self) -> None: ...

    async def keep(self, lost: asyncio.Event) -> None:
        """Until leadership is lost (then set `lost`), or cancelled."""
        ...

    async def release(self) -> None: ...


class Host(Protocol):
    async def serve(self, subject: str, handler: Handler, concurrency: int = 1) -> None:
        """Answer the commands sent to `subject` with `handler`."""
        ...

    def leadership(self, kind: str, holder: str, ttl_s: float) -> Leadership: ...

    def snapshots(self) -> SnapshotStore | None: ...


@dataclass
class _KvLeadership:
    lease: Lease
    log: JetStreamLog

    @property
    def revision(self) -> int | None:
        return self.lease.revision

    async def acquire(self) -> None:
        await self.lease.acquire(self.log.js)

    async def keep(self, lost: asyncio.Event) -> None:
        await self.lease.keep(self.log.js, lost)

    async def release(self) -> None:
        await self.lease.release(self.log.js)


@dataclass
class NatsHost:
    log: JetStreamLog

    async def serve(self, subject: str, handler: Handler, concurrency: int = 1) -> None:
        await serve(self.log.nc, subject, handler, concurrency)

    def leadership(self, kind: str, holder: str, ttl_s: float) -> Leadership:
        return _KvLeadership(Lease(kind, holder, ttl_s=ttl_s), self.log)

    def snapshots(self) -> SnapshotStore | None:
        return SnapshotStore(self.log.js)


def nats_host(log: EventLog) -> Host:
    """The host a service on `log` has when none is given: NATS, which needs the JetStream log."""
    if not isinstance(log, JetStreamLog):
        raise TypeError(f"a service on {type(log).__name__} needs a host (InProcessHost)")
    return NatsHost(log)


class _SoleLeadership:
    """The only candidate: leads from the start, never deposed."""

    revision: int | None = 1

    async def acquire(self) -> None:
        return None

    async def keep(self, lost: asyncio.Event) -> None:
        await asyncio.Event().wait()  # until cancelled

    async def release(self) -> None:
        return None


@dataclass
class InProcessHost:
    """Services in one process: `send` hands a command to the handler serving its subject,
    one at a time per subject when it was served with concurrency 1, as NATS serving does."""

    handlers: dict[str, tuple[Handler, asyncio.Semaphore]] = field(default_factory=dict)
    _served: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, subject: str, handler: Handler, concurrency: int = 1) -> None:
        self.handlers[subject] = (handler, asyncio.Semaphore(concurrency))
        self._served.set()

    async def until_served(self, *subjects: str) -> None:
        """Until something serves each of these subjects (services serve once caught up)."""
        while not set(subjects) <= set(self.handlers):
            self._served.clear()
            await self._served.wait()

    def leadership(self, kind: str, holder: str, ttl_s: float) -> Leadership:
        return _SoleLeadership()

    def snapshots(self) -> SnapshotStore | None:
        return None

    async def send(self, subject: str, command: AnyCommand) -> Reply:
        if subject not in self.handlers:
            raise LookupError(f"nothing serves {subject!r} (yet)")
        handler, slots = self.handlers[subject]
        async with slots:
            return await answer(handler, command)
