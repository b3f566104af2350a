"""The services on a real nats-server: the Run:AI preemption exercise, for real.

Admission, the ledger, the scheduler and the preemptor run as asyncio tasks, each on its own
connection, exactly as their processes run them. A minimal responder plays the node executor's
part of the protocol (the executor itself is tested on its own).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from cluster.servers import NatsServer
from events import (
    JobPreempted,
    JobPreemptionRequested,
    JobScheduled,
    JobSpec,
    JobStarted,
    NodeRegistered,
)
from events.commands import CancelJob, SetProject, SubmitJob
from policy.state import ClusterState
from services.admission.service import Admission
from services.ledger.service import Ledger
from services.runtime.client import send
from services.runtime.decider import Decider
from services.runtime.eventlog import JetStreamLog, Stored, connect
from services.runtime.tasks import cancel_and_wait


def places(e: object) -> bool:
    return isinstance(e, JobScheduled)


def preempts(e: object) -> bool:
    return type(e).__name__ in ("JobPreemptionRequested", "JobNominated")


async def responder(log: JetStreamLog) -> None:
    """Answers placements with starts and stop requests with stops, at once."""
    async for stored in log.follow(1):
        e = stored.event
        if isinstance(e, JobScheduled) and not e.scale_up:
            await log.publish(
                JobStarted(
                    id=f"{e.job_id}/{e.attempt}/started",
                    time=e.time,
                    actor="executor",
                    job_id=e.job_id,
                    attempt=e.attempt,
                )
            )
        elif isinstance(e, JobPreemptionRequested):
            await log.publish(
                JobPreempted(
                    id=f"{e.id}/done",
                    time=e.time,
                    actor="executor",
                    job_id=e.job_id,
                    attempt=e.attempt,
                    reason=e.reason,
                    replicas=e.replicas,
                )
            )


@pytest.fixture
async def cluster(nats_server: NatsServer) -> AsyncIterator[JetStreamLog]:
    logs = [JetStreamLog(await connect(nats_server.url, f"svc{i}")) for i in range(6)]
    await logs[0].ensure_stream()
    await logs[0].publish(
        NodeRegistered(
            id="node-1/registered",
            time=0.0,
            actor="executor",
            node="node-1",
            pool="single-node-pool",
            gpus=8,
        )
    )
    tasks = [
        asyncio.create_task(Admission(logs[1]).run()),
        asyncio.create_task(Ledger(logs[2]).run()),
        asyncio.create_task(Decider(logs[3], "scheduler", places).run()),
        asyncio.create_task(Decider(logs[4], "preemptor", preempts).run()),
        asyncio.create_task(responder(logs[5])),
    ]
    await asyncio.sleep(0.3)
    try:
        yield logs[0]
    finally:
        for task in tasks:
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)
        for log in logs:
            await log.nc.close()


async def state_of(log: JetStreamLog) -> ClusterState:
    state = ClusterState()
    async for stored in log.read(1):
        state.apply(stored.event)
    return state


def running(job: str, attempt: int = 1) -> Callable[[ClusterState], bool]:
    def check(state: ClusterState) -> bool:
        found = state.jobs.get(job)
        return found is not None and found.phase == "running" and found.attempt == attempt

    return check


async def until(
    log: JetStreamLog, check: Callable[[ClusterState], bool], within: float = 10.0
) -> ClusterState:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        state = await state_of(log)
        if check(state):
            return state
        if asyncio.get_running_loop().time() > deadline:
            phases = {j.id: (j.phase, j.attempt) for j in state.jobs.values()}
            raise AssertionError(f"not reached; jobs: {phases}")
        await asyncio.sleep(0.05)


async def test_the_runai_exercise_on_the_log(cluster: JetStreamLog) -> None:
    nc = cluster.nc
    for name in ("project-a", "project-b"):
        reply = await send(nc, SetProject(project=name, pool="single-node-pool", quota=4))
        assert reply.ok, reply.error
    reply = await send(
        nc,
        SubmitJob(
            job_id="large-training-job",
            spec=JobSpec(project="project-a", priority_class="train", gpus=8),
        ),
    )
    assert reply.ok, reply.error
    await until(cluster, running("large-training-job"))
    reply = await send(
        nc,
        SubmitJob(
            job_id="jupyter-workspace",
            spec=JobSpec(project="project-b", priority_class="interactive", gpus=4),
        ),
    )
    assert reply.ok, reply.error
    state = await until(cluster, running("jupyter-workspace"))
    assert state.jobs["large-training-job"].phase == "pending"
    assert state.jobs["large-training-job"].preemptions == 1
    assert (await send(nc, CancelJob(job_id="jupyter-workspace"))).ok
    await until(cluster, running("large-training-job", attempt=2))
    timeline: list[Stored] = [s async for s in cluster.read(1)]
    kinds = [
        type(s.event).__name__
        for s in timeline
        if getattr(s.event, "job_id", "") == "large-training-job"
    ]
    wanted = [
        "JobSubmitted",
        "JobScheduled",
        "JobStarted",
        "JobPreemptionRequested",
        "JobPreempted",
        "JobScheduled",
        "JobStarted",
    ]
    it = iter(kinds)
    assert all(any(k == w for k in it) for w in wanted), kinds
    reason = next(
        s.event
        for s in timeline
        if isinstance(s.event, JobPreemptionRequested) and s.event.job_id == "large-training-job"
    )
    assert reason.reason == "reclaim" and reason.for_job == "jupyter-workspace"


async def test_bad_commands_get_clear_errors(cluster: JetStreamLog) -> None:
    nc = cluster.nc
    reply = await send(nc, CancelJob(job_id="ghost"))
    assert not reply.ok and "unknown job id 'ghost'" in reply.error
    raw = await nc.request("fl-cmd.admission", b"{not json", timeout=5)
    assert b"malformed command" in raw.data
    reply = await send(nc, SubmitJob(job_id="j1", spec=JobSpec(project="nobody")))
    assert not reply.ok and "unknown project 'nobody'" in reply.error
    assert (await send(nc, SetProject(project="a", pool="single-node-pool", quota=1))).ok
    once = SubmitJob(job_id="j2", spec=JobSpec(project="a"), idempotency_key="k1")
    first, second = await send(nc, once), await send(nc, once)
    assert first.ok and second.ok and first.event == second.event
    other = await send(nc, SubmitJob(job_id="j2", spec=JobSpec(project="a"), idempotency_key="k2"))
    assert not other.ok and "already exists" in other.error
    state = await state_of(cluster)
    assert sum(1 for j in state.jobs if j == "j2") == 1
