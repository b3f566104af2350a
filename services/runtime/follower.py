"""A service's view of the cluster: the fold of the log, kept current.

Every service starts by replaying the log into a `ClusterState` and then applies the live
tail. The last applied stream sequence is the only progress marker: each event is applied
exactly once, in log order, whatever the consumer redelivers. With a snapshot store, replay
starts from the newest snapshot instead of the first event; with a snapshotter, this follower
also takes snapshots as it goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from policy.state import APPLIED, ClusterState, Verdict
from services.runtime.eventlog import EventLog, Stored
from services.runtime.snapshots import SnapshotStore, Snapshotter

OnEvent = Callable[[Stored], Awaitable[None]]


class Follower:
    def __init__(
        self,
        log: EventLog,
        state: ClusterState | None = None,
        applied_seq: int = 0,
        *,
        snapshots: SnapshotStore | None = None,
        snapshotter: Snapshotter | None = None,
    ):
        self.log = log
        self.state = state or ClusterState()
        self.applied_seq = applied_seq
        self.snapshots = snapshots
        self.snapshotter = snapshotter
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
        applied = 0
        async for stored in self.log.read(self.applied_seq + 1):
            self._apply(stored)
            applied += 1
            if on_event is not None:
                await on_event(stored)
        return applied

    async def run(self, on_event: OnEvent | None = None) -> None:
        """Follow the tail forever (cancel to stop)."""
        async for stored in self.log.follow(self.applied_seq + 1):
            if stored.seq <= self.applied_seq:
                continue
            self._apply(stored)
            if on_event is not None:
                await on_event(stored)

    async def wait_for(self, seq: int, within: float = 10.0) -> None:
        """Until the event at `seq` (or later) has been applied."""
        if self.applied_seq >= seq:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((seq, future))
        async with asyncio.timeout(within):  # not wait_for: it can swallow a cancellation (3.11)
            await future

    def _apply(self, stored: Stored) -> None:
        self.last_verdict = self.state.apply(stored.event, stored.seq)
        self.applied_seq = stored.seq
        if self.snapshotter is not None:
            self.snapshotter.after_apply(self.state, stored.seq)
        self.changed.set()
        if self._waiters:
            ready = [w for w in self._waiters if w[0] <= stored.seq]
            self._waiters = [w for w in self._waiters if w[0] > stored.seq]
            for _, future in ready:
                if not future.done():
                    future.set_result(None)
