"""The services in one process on the in-memory log, deciding on a virtual clock.

Admission, the quota ledger, the scheduler and the preemptor are the services' own code
(`services/`), given a `MemoryLog`, an `InProcessHost` (commands handed to their handlers, one
leader per kind) and a `VirtualClock` that only moves when the driver moves it, so rules that
count time (preemption_delay, min_runtime) act when a scenario's `advance` says, as they do on
the core engine. Node executors are simulated on the log as the virtual cluster simulates them
(`simulation/virtual_cluster.py`): a start is reported at once, a victim stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from events import (
    Event,
    JobNominated,
    JobPreempted,
    JobPreemptionRequested,
    JobScheduled,
    JobStarted,
    NodeRegistered,
)
from events.commands import ADMISSION_SUBJECT, LEDGER_SUBJECT, AnyCommand, Reply, service_subject
from policy.commands import ids
from policy.cycle import decide
from services.admission.service import Admission
from services.ledger.service import Ledger
from services.runtime.clock import VirtualClock
from services.runtime.decider import Decider
from services.runtime.eventlog import Stored
from services.runtime.follower import Follower
from services.runtime.host import InProcessHost
from services.runtime.memory_log import MemoryLog
from services.runtime.tasks import cancel_and_wait

EXECUTOR = "executor"


def _places(e: Event) -> bool:
    return isinstance(e, JobScheduled)


def _preempts(e: Event) -> bool:
    return isinstance(e, JobPreemptionRequested | JobNominated)


class SimulatedExecutors:
    """Every node's executor, answering the decisions on the log at once (a start reported, a
    victim stopped), with the ids the real executor and the virtual cluster use."""

    def __init__(self, log: MemoryLog, clock: VirtualClock) -> None:
        self.log = log
        self.clock = clock
        self.follower = Follower(log)

    async def run(self) -> None:
        await self.follower.run(self._answer)

    async def register(self, node: str, pool: str, gpus: int) -> None:
        await self.log.publish(
            NodeRegistered(
                id=ids.node_registered(node, self.follower.applied_seq),
                time=self.clock.now(),
                actor=EXECUTOR,
                node=node,
                pool=pool,
                gpus=gpus,
            )
        )

    async def _answer(self, stored: Stored) -> None:
        event = stored.event
        if isinstance(event, JobScheduled) and not event.scale_up:
            job = self.follower.state.jobs.get(event.job_id)
            if job is None or job.attempt != event.attempt or job.phase != "starting":
                return  # not applied (refused by the fold), or moved on since
            await self.log.publish(
                JobStarted(
                    id=ids.started(event.job_id, event.attempt),
                    time=self.clock.now(),
                    actor=EXECUTOR,
                    causation=event.id,
                    job_id=event.job_id,
                    attempt=event.attempt,
                    resumed=event.attempt > 1,
                )
            )
        elif isinstance(event, JobPreemptionRequested):
            job = self.follower.state.jobs.get(event.job_id)
            if job is None or job.stop_id != event.id:
                return  # the fold did not apply it
            await self.log.publish(
                JobPreempted(
                    id=ids.stopped(event.id),
                    time=self.clock.now(),
                    actor=EXECUTOR,
                    causation=event.id,
                    job_id=event.job_id,
                    attempt=event.attempt,
                    reason=event.reason,
                    replicas=event.replicas,
                )
            )


class InProcessCluster:
    """The services on one `MemoryLog` and one `VirtualClock`; `settle` waits until nothing
    more happens at the clock's present moment, `advance` moves the clock through every moment
    a service is waiting for."""

    def __init__(self, start: float = 0.0) -> None:
        self.log = MemoryLog()
        self.clock = VirtualClock(start)
        self.host = InProcessHost()
        self.observer = Follower(self.log)
        self.executors = SimulatedExecutors(self.log, self.clock)
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        log, clock, host = self.log, self.clock, self.host
        self._spawn(self.observer.run())
        self._spawn(self.executors.run())
        self._spawn(Admission(log, clock, host).run())
        self._spawn(Ledger(log, clock=clock, host=host).run())
        self._spawn(Decider(log, "scheduler", _places, clock, host=host).run())
        self._spawn(Decider(log, "preemptor", _preempts, clock, host=host).run())
        await self.host.until_served(ADMISSION_SUBJECT, LEDGER_SUBJECT)

    async def stop(self) -> None:
        for task in self.tasks:
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)

    def _spawn(self, body: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.create_task(body))

    async def command(self, command: AnyCommand) -> Reply:
        reply = await self.host.send(service_subject(command), command)
        await self.settle()
        return reply

    async def settle(self, limit_s: float = 30.0) -> None:
        """Until every service has read the whole log, no start or stop is outstanding and
        the policy has nothing more to decide at this moment (the services pace themselves on
        the event loop's clock, so this takes real milliseconds, not virtual time)."""
        async with asyncio.timeout(limit_s):
            while True:
                await asyncio.sleep(0.01)
                last = await self.log.last_seq()
                if self.observer.applied_seq < last or self._outstanding():
                    continue
                await asyncio.sleep(0.05)  # a pause for a service that is about to write
                if await self.log.last_seq() == last:
                    return

    def _outstanding(self) -> bool:
        state = self.observer.state
        if any(j.phase == "starting" or j.stop_replicas for j in state.live.values()):
            return True
        return bool(decide(state, self.clock.now()))

    async def advance(self, seconds: float) -> None:
        """Move the clock on, stopping at each moment a service sleeps until, and settling."""
        end = self.clock.now() + seconds
        await self.settle()
        while (due := self.clock.next_due()) is not None and due <= end:
            self.clock.move_to(due)
            await self.settle()
        self.clock.move_to(end)
        await self.settle()
