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
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobNominated,
    JobPreemptionRequested,
    JobScheduled,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
    ids,
)
from events.commands import ADMISSION_SUBJECT, LEDGER_SUBJECT, AnyCommand, Reply, service_subject
from policy.cycle import decide
from services.admission.service import Admission
from services.ledger.service import Ledger
from services.runtime.clock import VirtualClock
from services.runtime.decider import Decider
from services.runtime.eventlog import EventLog, Stored
from services.runtime.follower import Follower, OnEvent
from services.runtime.host import InProcessHost
from services.runtime.memory_log import MemoryLog
from services.runtime.tasks import cancel_and_wait
from simulation.virtual_cluster import Work, preempted, started

EXECUTOR = "executor"


def _places(e: Event) -> bool:
    return isinstance(e, JobScheduled)


def _preempts(e: Event) -> bool:
    return isinstance(e, JobPreemptionRequested | JobNominated)


class SimulatedExecutors:
    """Every node's executor, answering the decisions on the log at once (a start reported, a
    victim stopped) with the ids the real executor and the virtual cluster use, and doing a
    job's simulated work (`duration`, `checkpoint`) on the virtual clock as the virtual
    cluster does (`simulation/virtual_cluster.py`'s `Work`). On any event log: the in-memory
    one here, the NATS stream on the live engine's virtual clock."""

    def __init__(self, log: EventLog, clock: VirtualClock) -> None:
        self.log = log
        self.clock = clock
        self.follower = Follower(log)
        self.work: dict[str, Work] = {}
        self._doing: dict[str, asyncio.Task[None]] = {}  # job -> its attempt's work

    async def run(self) -> None:
        try:
            await self.follower.run(self._answer)
        finally:
            for task in self._doing.values():
                task.cancel()

    async def register(self, node: str, pool: str, gpus: int) -> None:
        await self._publish(
            NodeRegistered(
                id=ids.node_registered(node, self.follower.applied_seq),
                time=self.clock.now(),
                actor=EXECUTOR,
                node=node,
                pool=pool,
                gpus=gpus,
            )
        )

    async def lose(self, node: str) -> None:
        await self._publish(
            NodeLost(
                id=ids.node_lost(node, self.follower.applied_seq),
                time=self.clock.now(),
                actor=EXECUTOR,
                node=node,
                reason="lost",
            )
        )

    async def finish(self, job_id: str, ok: bool) -> None:
        """The job's workload exits (0 or 1) and its executor says so."""
        job = self.follower.state.jobs.get(job_id)
        if job is None or job.phase not in ("starting", "running", "stopping"):
            return
        self._stop_work(job_id)
        self.work.pop(job_id, None)
        now, attempt = self.clock.now(), job.attempt
        await self._publish(
            JobCompleted(
                id=ids.completed(job_id, attempt),
                time=now,
                actor=EXECUTOR,
                job_id=job_id,
                attempt=attempt,
            )
            if ok
            else JobFailed(
                id=ids.failed(job_id, attempt),
                time=now,
                actor=EXECUTOR,
                job_id=job_id,
                attempt=attempt,
                exit_code=1,
            )
        )

    async def _publish(self, event: Event) -> None:
        await self.follower.wait_for(await self.log.publish(event))

    async def _answer(self, stored: Stored) -> None:
        event = stored.event
        if isinstance(event, JobSubmitted) and event.spec.duration_s is not None:
            cp = event.spec.checkpoint
            self.work[event.job_id] = Work(
                duration=event.spec.duration_s,
                every=cp.every_s if cp else None,
                restore=cp.restore_s if cp else 0.0,
            )
        elif isinstance(event, JobScheduled) and not event.scale_up:
            await self._start(event)
        elif isinstance(event, JobPreemptionRequested):
            await self._stop(event)

    async def _start(self, event: JobScheduled) -> None:
        job = self.follower.state.jobs.get(event.job_id)
        if job is None or job.attempt != event.attempt or job.phase != "starting":
            return  # not applied (refused by the fold), or moved on since
        await self.log.publish(started(event, self.clock.now()))
        work = self.work.get(job.id)
        if work is not None:
            work.start(self.clock.now(), resumed=event.attempt > 1)
            self._doing[job.id] = asyncio.create_task(self._do(job.id, event.attempt, work))

    async def _stop(self, event: JobPreemptionRequested) -> None:
        job = self.follower.state.jobs.get(event.job_id)
        if job is None or job.stop_id != event.id:
            return  # the fold did not apply it
        whole = job.phase != "running" or job.stop_replicas >= len(job.held)
        work = self.work.get(job.id)
        checkpointed = False
        if whole and work is not None:
            self._stop_work(job.id)
            checkpointed = work.stop(self.clock.now())
        await self.log.publish(preempted(event, self.clock.now(), checkpointed))

    def _stop_work(self, job_id: str) -> None:
        task = self._doing.pop(job_id, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _do(self, job_id: str, attempt: int, work: Work) -> None:
        """The attempt's work: checkpoints as they fall due, then the finish."""
        while True:
            finish, save = work.finishes_at(), work.next_checkpoint_at()
            assert finish is not None
            due = finish if save is None else min(finish, save)
            await self.clock.sleep(due - self.clock.now())
            job = self.follower.state.jobs.get(job_id)
            if job is None or job.attempt != attempt or job.phase != "running":
                return
            if due == finish:  # a finish wins over a checkpoint at the same moment
                await self.finish(job_id, ok=True)
                return
            done = work.progress(self.clock.now())
            assert work.every is not None
            kept = int(done / work.every) * work.every
            work.run_from, work.saved = self.clock.now() - (done - kept), kept
            await self._publish(
                JobCheckpointed(
                    id=ids.checkpointed(job_id, attempt, int(kept)),
                    time=self.clock.now(),
                    actor=EXECUTOR,
                    job_id=job_id,
                    attempt=attempt,
                    save_s=job.save_s,
                )
            )


class InProcessCluster:
    """The services on one `MemoryLog` and one `VirtualClock`; `settle` waits until nothing
    more happens at the clock's present moment, `advance` moves the clock through every moment
    a service is waiting for."""

    def __init__(self, start: float = 0.0) -> None:
        self.log = MemoryLog()
        self.clock = VirtualClock(start)
        self.host = InProcessHost(self.log)
        self.observer = Follower(self.log)
        self.executors = SimulatedExecutors(self.log, self.clock)
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, on_event: OnEvent | None = None) -> None:
        """Start the services; `on_event` sees every event as the observer applies it."""
        log, clock, host = self.log, self.clock, self.host
        self._spawn(self.observer.run(on_event))
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
        """Until the observer has read the whole log, no start or stop is outstanding, the
        policy has nothing more to decide at this moment, and the log has stayed quiet for a
        moment (the services pace themselves on the event loop's clock, so this takes real
        milliseconds, not virtual time). A service that stopped is an error, not a wait."""
        async with asyncio.timeout(limit_s):
            while True:
                await asyncio.sleep(0.01)
                self._raise_if_one_stopped()
                due = self.clock.next_due()
                if due is not None and due <= self.clock.now():
                    self.clock.move_to(self.clock.now())  # wake who slept until now
                    continue
                last = await self.log.last_seq()
                if self.observer.applied_seq < last or self._outstanding():
                    continue
                await asyncio.sleep(0.05)  # a pause for a service that is about to write
                if await self.log.last_seq() == last:
                    return

    def _raise_if_one_stopped(self) -> None:
        for task in self.tasks:
            if task.done():
                raise RuntimeError(f"a service stopped: {task.exception() or 'it returned'}")

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
