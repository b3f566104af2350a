"""Driving one or many executors on one log connection and one fold.

One executor for a real node, or a hundred hollow ones for a benchmark. The shared `Follower`
replays the log and follows its tail; each event, once folded, is noted by the `LogView` and
handed only to the executors of the nodes it concerns.

The executors follow the whole stream (`fl.>`). DESIGN wants work for one executor on subjects
it can filter on; the fold needs every placement to referee them, so narrowing needs either
per-node subjects written after the referee or a trusted single writer.
"""

from __future__ import annotations

import asyncio

import structlog

from events import Event, JobScheduled, NodeLost
from services.executor.executor import Executor
from services.executor.logview import LogView
from services.runtime.eventlog import EventLog, Stored
from services.runtime.follower import Follower
from services.runtime.tasks import cancel_and_wait

logger = structlog.get_logger("fairlane.executor")


class ExecutorGroup:
    """Runs executors on one log connection and one fold."""

    def __init__(self, log: EventLog, executors: list[Executor]) -> None:
        self.log = log
        self.executors = executors
        self.by_node = {ex.node: ex for ex in executors}
        if len(self.by_node) != len(executors):
            raise ValueError("two executors for the same node")
        # No snapshots: the view keeps facts (requests in progress, checkpoints reported) that
        # a snapshot of the fold does not hold.
        self.follower = Follower(log)
        self.view = LogView(self.follower.state)
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
        try:
            await asyncio.wait({follower, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if follower.done():
                follower.result()  # it only ends by failing
        finally:
            stopped.cancel()
            await cancel_and_wait(follower)
            for beat in beats:
                await cancel_and_wait(beat)
            await asyncio.gather(
                *(asyncio.shield(ex.close()) for ex in self.executors), return_exceptions=True
            )

    async def _follow(self, ready: asyncio.Event | None) -> None:
        await self.log.ensure_stream()
        await self.follower.catch_up(self._note)
        for ex in self.executors:
            await ex.reconcile(self.view)
        # Only a node that knows what runs on it offers itself for work.
        await asyncio.gather(*(ex.register() for ex in self.executors))
        logger.info(
            "replayed and reconciled",
            seq=self.follower.applied_seq,
            executors=len(self.executors),
        )
        if ready is not None:
            ready.set()
        await self.follower.run(self._on_live)

    async def _note(self, stored: Stored) -> None:
        self.view.note(stored.event)

    async def _on_live(self, stored: Stored) -> None:
        self.view.note(stored.event)
        self._dispatch(stored.event)

    def _dispatch(self, event: Event) -> None:
        for ex in self._concerned(event):
            try:
                ex.on_event(event)
            except Exception:
                logger.exception("executor failed on an event", node=ex.node, id=event.id)

    def _concerned(self, event: Event) -> list[Executor]:
        if isinstance(event, NodeLost):
            ex = self.by_node.get(event.node)
            return [ex] if ex is not None else []
        job_id = getattr(event, "job_id", None)
        if job_id is None:
            return []
        nodes: set[str] = set(self.view.holders.get(job_id, ()))
        job = self.view.state.jobs.get(job_id)
        if job is not None:
            nodes.update(r.node for r in job.held)
        if isinstance(event, JobScheduled):
            nodes.update(r.node for r in event.replicas)
        return [self.by_node[n] for n in nodes if n in self.by_node]
