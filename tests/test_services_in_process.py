"""The services in one process on the in-memory log, on a virtual clock moved by hand.

Admission, the ledger, the scheduler, the preemptor, the node watcher and the node executor
are the services' own code; only the clock, the log and the way commands reach them differ
from a cluster. A rule that counts time
(a preemption_delay) acts when the clock is moved past it, not before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from events import JobPreempted, JobPreemptionRequested, JobSpec
from events.commands import ConfigureCluster, SetPool, SetProject, SubmitJob
from simulation.scenario.in_process import InProcessCluster


@pytest.fixture
async def cluster() -> AsyncIterator[InProcessCluster]:
    cluster = InProcessCluster(start=1000.0)
    await cluster.start()
    try:
        for command in (
            ConfigureCluster(default_compute_pool="gpu"),
            SetPool(pool="gpu"),
            SetProject(project="a", quota=2),
            SetProject(project="b", quota=2),
        ):
            assert (await cluster.command(command)).ok
        await cluster.add_node("n1", "gpu", 4)
        await cluster.settle()
        yield cluster
    finally:
        await cluster.stop()


def phase(cluster: InProcessCluster, job_id: str) -> str:
    return cluster.observer.state.jobs[job_id].phase


async def test_jobs_run_through_the_services(cluster: InProcessCluster) -> None:
    for i in range(4):
        reply = await cluster.command(SubmitJob(job_id=f"a{i}", spec=JobSpec(project="a")))
        assert reply.ok, reply.error
    assert [phase(cluster, f"a{i}") for i in range(4)] == ["running"] * 4
    assert cluster.clock.now() == 1000.0  # nothing moved the clock


async def test_a_preemption_delay_runs_out_only_when_the_clock_is_moved(
    cluster: InProcessCluster,
) -> None:
    for i in range(4):  # project a takes the whole node, 2 GPUs over its quota
        await cluster.command(SubmitJob(job_id=f"a{i}", spec=JobSpec(project="a")))
    spec = JobSpec(project="b", preemption_delay_s=600.0)
    assert (await cluster.command(SubmitJob(job_id="b0", spec=spec))).ok
    await cluster.advance(599.0)
    assert phase(cluster, "b0") == "pending"
    events = [s.event async for s in cluster.log.read()]
    assert not any(isinstance(e, JobPreemptionRequested) for e in events)
    await cluster.advance(1.0)
    assert phase(cluster, "b0") == "running"
    stopped = [s.event async for s in cluster.log.read() if isinstance(s.event, JobPreempted)]
    assert [e.job_id for e in stopped] == ["a3"]  # the newest of the project over its quota
    assert stopped[0].time == 1600.0  # decided, and answered, at the virtual moment
