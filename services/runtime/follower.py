"""A service's view of the cluster: the fold of the log, kept current.

Every service starts by replaying the log into a `ClusterState` and then applies the live
tail. The last applied stream sequence is the only progress marker: each event is applied
exactly once, in log order, whatever the consumer redelivers. With a snapshot store, replay
starts from the newest snapshot instead of the first event; with a snapshotter, this follower
also takes snapshots as it goes.

A service's follower (given the service's name) survives an event it cannot handle: one that
cannot be read (`events.Undecodable`), or whose fold or handling (`on_event`) raises. It sets
the event aside on the record (`EventSetAside` on `fl.aside.<service>`, which `fairlane status`
lists, with the reason), counts it as applied and goes on, where it used to stop or crash-loop
with every later event stuck behind it. Every service on the same code sets the same events
aside, so their folds still agree, and the record says which ones they left out. Passing
trouble (the server away) is never set aside: it is raised, and waited out by the service. A
follower without a service (tools, the audit, tests) stops at such an event, as the log's
readers do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from events import EventSetAside, set_aside_id, subject_for
from policy.state import APPLIED, ClusterState, Verdict
from services.runtime.eventlog import EventLog, Stored, UnreadableEvent
from services.runtime.retry import is_transient
from services.runtime.snapshots import SnapshotStore, Snapshotter

OnEvent = Callable[[Stored], Awaitable[None]]
log = structlog.get_logger("fairlane.follower")


class Follower:
    def __init__(  # noqa: PLR0913 (the state it starts from, and what a service adds)
        self,
        log: EventLog,
        state: ClusterState | None = None,
        applied_seq: int = 0,
        *,
        snapshots: SnapshotStore | None = None,
        snapshotter: Snapshotter | None = None,
        service: str | None = None,
    ):
        self.log = log
        self.state = state or ClusterState()
        self.applied_seq = applied_seq
        self.snapshots = snapshots
        self.snapshotter = snapshotter
        #: who sets aside what it cannot handle (None: stop there)
        self.service = service
        self.set_aside = 0  # events this follower set aside
        #: set aside while replaying, recorded once replay shows no record of it yet
        self._unrecorded: dict[str, EventSetAside] = {}  # by id
        self._replaying = False
        self.restored_from: int | None = None  # the snapshot's sequence, if one was used
        self.changed = asyncio.Event()  # set whenever events were applied
        #: the fold's verdict on the last event applied (for `on_event` callbacks)
        self.last_verdict: Verdict = APPLIED
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    async def catch_up(self, on_event: OnEvent | None = None) -> int:
        """Replay what is stored now (from the newest snapshot, where there is one and nothing
        was applied yet); returns how many events were applied."""
        if self.snapshots is not None and self.applied_seq == 0:
            restored = await self.snapshots.load()
            if restored is not None and restored[1] > await self.log.last_seq():
                restored = None  # taken from another stream (it was made again since)
            if restored is not None:
                self.state, self.applied_seq = restored
                self.restored_from = self.applied_seq
                if self.snapshotter is not None:
                    self.snapshotter.last_seq = self.applied_seq
        self._replaying = True
        try:
            applied = await self._replay(on_event)
        finally:
            self._replaying = False
        for aside in list(self._unrecorded.values()):  # nobody recorded these before: now
            await self.log.publish_durably(aside)
        self._unrecorded.clear()
        return applied

    async def _replay(self, on_event: OnEvent | None) -> int:
        applied = 0
        while True:
            try:
                async for stored in self.log.read(self.applied_seq + 1):
                    await self._handle(stored, on_event)
                    applied += 1
                return applied
            except UnreadableEvent as e:
                await self._unreadable(e)

    async def run(self, on_event: OnEvent | None = None) -> None:
        """Follow the tail forever (cancel to stop)."""
        while True:
            try:
                async for stored in self.log.follow(self.applied_seq + 1):
                    if stored.seq > self.applied_seq:
                        await self._handle(stored, on_event)
            except UnreadableEvent as e:
                await self._unreadable(e)

    async def wait_for(self, seq: int, within: float = 10.0) -> None:
        """Until the event at `seq` (or later) has been applied."""
        if self.applied_seq >= seq:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((seq, future))
        async with asyncio.timeout(within):  # not wait_for: it can swallow a cancellation (3.11)
            await future

    async def _handle(self, stored: Stored, on_event: OnEvent | None) -> None:
        try:
            self._apply(stored)
            if on_event is not None:
                await on_event(stored)
        except Exception as e:
            if self.service is None or is_transient(e):
                raise
            self._applied(stored.seq)  # whatever the fold made of it stands: it is past
            event = stored.event
            reason = f"{type(e).__name__}: {e}"
            await self._put_aside(stored.seq, subject_for(event), reason, event.time, event.id)
        if isinstance(stored.event, EventSetAside):
            self._unrecorded.pop(stored.event.id, None)  # recorded before: not again

    async def _unreadable(self, error: UnreadableEvent) -> None:
        if self.service is None:
            raise error
        self._applied(error.seq)
        await self._put_aside(error.seq, error.subject, error.reason, self.state.last_time)

    async def _put_aside(
        self, seq: int, subject: str, reason: str, time: float, cause: str | None = None
    ) -> None:
        """Record that this service went on without the event at `seq`; while replaying, only
        once replay is over (a restarted service finds its earlier record further on)."""
        assert self.service is not None
        log.error("event set aside", service=self.service, seq=seq, subject=subject, reason=reason)
        self.set_aside += 1
        aside = EventSetAside(
            id=set_aside_id(self.service, seq, subject),
            time=time,
            actor=self.service,
            causation=cause,
            service=self.service,
            seq=seq,
            subject=subject,
            reason=reason,
        )
        if self._replaying:
            self._unrecorded[aside.id] = aside
        else:
            await self.log.publish_durably(aside)

    def _apply(self, stored: Stored) -> None:
        self.last_verdict = self.state.apply(stored.event, stored.seq)
        self._applied(stored.seq)
        if self.snapshotter is not None:
            self.snapshotter.after_apply(self.state, stored.seq)

    def _applied(self, seq: int) -> None:
        self.applied_seq = seq
        self.changed.set()
        if self._waiters:
            ready = [w for w in self._waiters if w[0] <= seq]
            self._waiters = [w for w in self._waiters if w[0] > seq]
            for _, future in ready:
                if not future.done():
                    future.set_result(None)
