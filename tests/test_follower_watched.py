"""A leader decides on its follower's fold: if the follower dies, the service stops (and its
supervisor starts it again) instead of deciding on a fold that no longer moves."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import nats.errors
import pytest

from events import JobScheduled, PoolConfigured
from services.nodewatch.service import NodeWatch
from services.runtime.decider import Decider
from services.runtime.eventlog import Stored
from services.runtime.host import InProcessHost
from services.runtime.memory_log import MemoryLog
from services.runtime.tasks import Stopped, cancel_and_wait, while_alive


class ClosingLog(MemoryLog):
    """The in-memory log, whose live tail fails once `close` is called, as a JetStream log's
    does when its connection is closed for good."""

    closed = False

    async def follow(
        self, from_seq: int = 1, batch: int = 5000, subject: str | None = None
    ) -> AsyncIterator[Stored]:
        async for stored in super().follow(from_seq, batch, subject):
            if self.closed:
                raise nats.errors.ConnectionClosedError
            yield stored

    async def close(self) -> None:
        self.closed = True  # the next event wakes the follower, which then fails
        await self.publish(PoolConfigured(id="wake", time=0.0, actor="test", pool="p"))


def scheduler(log: MemoryLog) -> Decider:
    return Decider(log, "scheduler", lambda e: isinstance(e, JobScheduled), host=InProcessHost(log))


def nodewatch(log: MemoryLog) -> NodeWatch:
    return NodeWatch(log, timeout_s=3600, host=InProcessHost(log))


@pytest.mark.parametrize("make", [scheduler, nodewatch], ids=["decider", "nodewatch"])
async def test_a_dead_follower_stops_the_leading_service(
    make: Callable[[MemoryLog], Decider | NodeWatch],
) -> None:
    log = ClosingLog()
    service = make(log)
    running = asyncio.create_task(service.run())
    try:
        await asyncio.wait_for(service.leader.is_leader.wait(), 5)
        await log.close()
        with pytest.raises(nats.errors.ConnectionClosedError):
            await asyncio.wait_for(running, 5)
        assert not service.leader.is_leader.is_set()  # it stepped down on the way out
    finally:
        await cancel_and_wait(running)


async def test_a_needed_task_that_ends_quietly_stops_the_work_too() -> None:
    work = asyncio.Event()

    async def working() -> None:  # until the event is set: never
        await work.wait()

    with pytest.raises(Stopped, match="the follower stopped"):
        await while_alive(asyncio.sleep(0), working(), "the follower")
