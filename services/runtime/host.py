"""Everything a service reaches outside its own code: the event log, the relay stream beside
it (services/runtime/relays.py), where commands reach it, leadership, snapshots, the nodes'
heartbeats and GPU samples, the workloads' output, the checkpoint store and the bus's message
limit.

On a cluster that is NATS (`NatsHost`: the JetStream log and the relay stream, request/reply
subjects, a KV lease, the snapshot object store, the heartbeat and GPU sample buckets, the
output stream, the checkpoint object store, all on the log's connection). In one process on the
in-memory log (`InProcessHost`) commands are handed to the services' handlers directly, each
decision kind has one leader for good, heartbeats, samples, output, relays and checkpoints are
kept in memory and there are no snapshots: the services, the node executor among them, are the
same code either way, and none of them touches NATS itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from events.commands import AnyCommand, Reply, service_subject
from services.runtime.checkpoint_bucket import (
    CheckpointStore,
    JetStreamCheckpoints,
    MemoryCheckpoints,
)
from services.runtime.client import send
from services.runtime.commands import Handler, answer, serve
from services.runtime.eventlog import EventLog, JetStreamLog
from services.runtime.gpu_samples import GpuSamples, KvGpuSamples, MemoryGpuSamples
from services.runtime.heartbeats import TIMEOUT_S, Heartbeats, KvHeartbeats, MemoryHeartbeats
from services.runtime.lease import Lease
from services.runtime.memory_log import MemoryLog
from services.runtime.output import JetStreamOutput, MemoryOutput, Output
from services.runtime.relays import relay_log, relay_subject
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
    @property
    def log(self) -> EventLog: ...

    async def serve(self, subject: str, handler: Handler, concurrency: int = 1) -> None:
        """Answer the commands sent to `subject` with `handler`."""
        ...

    async def request(self, command: AnyCommand) -> Reply:
        """Send `command` to the service that serves it; its answer."""
        ...

    def leadership(self, kind: str, holder: str, ttl_s: float) -> Leadership: ...

    def relays(self) -> EventLog:
        """The relay stream: each node's work, apart from the log."""
        ...

    def snapshots(self) -> SnapshotStore | None: ...

    def heartbeats(self, ttl_s: float = TIMEOUT_S) -> Heartbeats:
        """The nodes' heartbeats (`ttl_s`: how long one counts, where the store is made)."""
        ...

    def gpu_samples(self) -> GpuSamples:
        """Each node's latest GPU samples."""
        ...

    def output(self) -> Output:
        """The workloads' output: executors ship it, readers read it back."""
        ...

    def checkpoints(self) -> CheckpointStore:
        """The cluster's checkpoint store: each replica's archive."""
        ...

    def message_limit(self) -> int | None:
        """The most bytes one message may carry (headers included); None: no limit."""
        ...


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

    async def request(self, command: AnyCommand) -> Reply:
        return await send(self.log.nc, command)

    def leadership(self, kind: str, holder: str, ttl_s: float) -> Leadership:
        return _KvLeadership(Lease(kind, holder, ttl_s=ttl_s), self.log)

    def relays(self) -> EventLog:
        return relay_log(self.log)

    def snapshots(self) -> SnapshotStore | None:
        return SnapshotStore(self.log.js)

    def heartbeats(self, ttl_s: float = TIMEOUT_S) -> Heartbeats:
        return KvHeartbeats(self.log.js, ttl_s)

    def gpu_samples(self) -> GpuSamples:
        return KvGpuSamples(self.log.js)

    def output(self) -> Output:
        return JetStreamOutput(self.log.js)

    def checkpoints(self) -> CheckpointStore:
        return JetStreamCheckpoints(self.log.js)

    def message_limit(self) -> int | None:
        return int(self.log.nc.max_payload)


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

    log: EventLog = field(default_factory=MemoryLog)
    handlers: dict[str, tuple[Handler, asyncio.Semaphore]] = field(default_factory=dict)
    _served: asyncio.Event = field(default_factory=asyncio.Event)
    _heartbeats: MemoryHeartbeats = field(default_factory=MemoryHeartbeats)
    _samples: MemoryGpuSamples = field(default_factory=MemoryGpuSamples)
    _output: MemoryOutput = field(default_factory=MemoryOutput)
    _checkpoints: MemoryCheckpoints = field(default_factory=MemoryCheckpoints)
    _relays: MemoryLog = field(default_factory=lambda: MemoryLog(subject_of=relay_subject))

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

    def relays(self) -> EventLog:
        return self._relays

    def snapshots(self) -> SnapshotStore | None:
        return None

    def heartbeats(self, ttl_s: float = TIMEOUT_S) -> Heartbeats:
        return self._heartbeats

    def gpu_samples(self) -> GpuSamples:
        return self._samples

    def output(self) -> Output:
        return self._output

    def checkpoints(self) -> CheckpointStore:
        return self._checkpoints

    def message_limit(self) -> int | None:
        return None

    async def request(self, command: AnyCommand) -> Reply:
        return await self.send(service_subject(command), command)

    async def send(self, subject: str, command: AnyCommand) -> Reply:
        if subject not in self.handlers:
            raise LookupError(f"nothing serves {subject!r} (yet)")
        handler, slots = self.handlers[subject]
        async with slots:
            return await answer(handler, command)
