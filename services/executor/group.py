"""Driving one or many executors on one log connection.

One executor for a real node, or a hundred hollow ones for a benchmark. Each executor reads
only its node's relayed work from the relay stream beside the log (services/runtime/relays.py:
`fl-work.<node>`, or every node's `fl-work.*` for a group of many, where the connection's user
may read it all): the replay folds each relay into its node's `NodeWork`,
then each live relay is noted and handed to its node's executor only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import structlog

from events import WorkRelayed, work_subject
from services.executor.nodework import NodeWork
from services.runtime.eventlog import EventLog, Stored
from services.runtime.tasks import cancel_and_wait

logger = structlog.get_logger("fairlane.executor")


class Member(Protocol):
    """What the group needs of an executor (`executor.Executor`), so neither module imports
    the other both ways."""

    @property
    def node(self) -> str: ...

    def relays(self) -> EventLog:
        """The relay stream its host gives, where each node's work is."""
        ...

    def on_event(self, relay: WorkRelayed) -> None: ...

    async def reconcile(self, work: NodeWork) -> None: ...

    async def register(self) -> None: ...

    async def heartbeat(self) -> None: ...

    async def sample(self) -> None: ...

    async def close(self) -> None: ...


class ExecutorGroup:
    """Runs executors on one log connection, each on its own node's work."""

    def __init__(self, log: EventLog, executors: Sequence[Member]) -> None:
        self.log = log
        self.executors = list(executors)
        # where its work is (the relay stream beside the log, on a cluster or in one process):
        # it reads nothing of the log itself
        self.relays = self.executors[0].relays()
        self.by_node = {ex.node: ex for ex in executors}
        if len(self.by_node) != len(executors):
            raise ValueError("two executors for the same node")
        self.work = {ex.node: NodeWork(ex.node) for ex in executors}
        only = executors[0].node if len(executors) == 1 else None
        # every node's, not the terms the node watcher records there (`fl-work.leader.<kind>`)
        self.subject = work_subject(only) if only is not None else work_subject("*")
        self.applied_seq = 0
        self.delivered = 0  # messages the log delivered to this group (bench/pipeline counts)
        self._stop = asyncio.Event()

    def stop(self) -> None:
        """Ask `run()` to return (after closing the executors)."""
        self._stop.set()

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Replay, reconcile, register, then follow the log until `stop()` or cancelled.

        The following runs in a task of its own that is cancelled from here: nats-py waits
        with `asyncio.wait_for`, which on Python 3.11 can swallow a cancellation that arrives
        together with a message, so that task is cancelled until it is done."""
        follower = asyncio.create_task(self._follow(ready))
        stopped = asyncio.create_task(self._stop.wait())
        beats = [asyncio.create_task(ex.heartbeat()) for ex in self.executors]
        beats += [asyncio.create_task(ex.sample()) for ex in self.executors]
        try:
            await asyncio.wait({follower, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if follower.done():
                follower.result()  # it only ends by failing
        finally:
            stopped.cancel()
            await cancel_and_wait(follower)
            # The heartbeats go on while the executors close: one that stops its workloads on
            # the way out (a shut down) is not declared lost by the node watcher meanwhile.
            await asyncio.gather(
                *(asyncio.shield(ex.close()) for ex in self.executors), return_exceptions=True
            )
            for beat in beats:
                await cancel_and_wait(beat)

    async def _follow(self, ready: asyncio.Event | None) -> None:
        await self.relays.ensure_stream()
        async for stored in self.relays.read(1, subject=self.subject):
            self._note(stored)
        for ex in self.executors:
            await ex.reconcile(self.work[ex.node])
        # Only a node that knows what runs on it offers itself for work.
        await asyncio.gather(*(ex.register() for ex in self.executors))
        logger.info("replayed and reconciled", seq=self.applied_seq, executors=len(self.executors))
        if ready is not None:
            ready.set()
        async for stored in self.relays.follow(self.applied_seq + 1, subject=self.subject):
            relay = self._note(stored)
            if relay is not None:
                self._dispatch(relay)

    def _note(self, stored: Stored) -> WorkRelayed | None:
        """Fold one relay into its node's work; the relay if it is for one of these nodes."""
        if stored.seq <= self.applied_seq:
            return None
        self.applied_seq = stored.seq
        self.delivered += 1
        relay = stored.event
        if not isinstance(relay, WorkRelayed):
            logger.warning("not relayed work: skipped", seq=stored.seq, id=relay.id)
            return None
        if relay.node not in self.work:
            return None  # another group's node, where a group reads `fl-work.*`
        return relay if self.work[relay.node].note(relay) else None

    def _dispatch(self, relay: WorkRelayed) -> None:
        ex = self.by_node[relay.node]
        try:
            ex.on_event(relay)
        except Exception:
            logger.exception("executor failed on an event", node=ex.node, id=relay.id)
