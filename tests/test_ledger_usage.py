"""The ledger's usage, kept by delta, equals a count of every live job after every event of
every scenario log (gangs, elastic jobs shrinking and growing, preemptions, lost nodes,
pauses); and the ledger records quota crossings on a real nats-server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cluster.servers import NatsServer
from events import (
    Event,
    JobAdmitted,
    JobCompleted,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
    ProjectConfigured,
    ProjectQuotaCrossed,
    ProjectTerms,
    Replica,
)
from policy.state import ClusterState
from policy.usage import Usage, counted_usage
from services.ledger.service import Ledger
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.tasks import cancel_and_wait
from tests.test_snapshot import SCENARIOS, scenario_log


def scanned(state: ClusterState) -> dict[tuple[str, str], int]:
    usage: dict[tuple[str, str], int] = {}
    for job in state.live.values():
        part = counted_usage(job)
        if part is not None:
            usage[part[:2]] = usage.get(part[:2], 0) + part[2]
    return usage


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_usage_by_delta_is_the_scan(path: Path) -> None:
    log, _ = scenario_log(path)
    state, usage = ClusterState(), Usage()
    for i, event in enumerate(log):
        state.apply(event)
        job = state.jobs.get(getattr(event, "job_id", None) or "")
        if job is not None:
            usage.job_changed(job)
        elif isinstance(event, NodeLost):
            usage.recount(state)
        kept = {k: v for k, v in usage.by_pool.items() if v}
        assert kept == {k: v for k, v in scanned(state).items() if v}, f"after event {i}: {event}"


def job_events(job: str, gpus: int, t: float) -> list[Event]:
    replica = Replica("n1", tuple(range(gpus)))
    return [
        JobSubmitted(id=f"{job}/s", time=t, actor="t", job_id=job, spec=JobSpec(project="a")),
        JobAdmitted(
            id=f"{job}/a",
            time=t,
            actor="t",
            job_id=job,
            project="a",
            priority=50,
            preemptible=True,
            gpus=gpus,
            replicas=1,
            min_replicas=1,
            pools=("default",),
        ),
        JobScheduled(
            id=f"{job}/sc",
            time=t,
            actor="t",
            job_id=job,
            attempt=1,
            pool="default",
            replicas=(replica,),
        ),
        JobStarted(id=f"{job}/st", time=t, actor="t", job_id=job, attempt=1),
    ]


@pytest.mark.nats
async def test_the_ledger_records_crossing_the_quota_and_back(nats_server: NatsServer) -> None:
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    ledger = Ledger(log)
    running = asyncio.create_task(ledger.run())
    try:
        for event in (
            NodeRegistered(id="n1", time=0.0, actor="t", node="n1", pool="default", gpus=4),
            ProjectConfigured(
                id="a", time=0.0, actor="t", project="a", terms={"default": ProjectTerms(quota=1)}
            ),
            *job_events("j1", 2, 1.0),
            JobCompleted(id="j1/c", time=2.0, actor="t", job_id="j1", attempt=1),
        ):
            await log.publish(event)
        crossings: list[ProjectQuotaCrossed] = []
        for _ in range(100):
            crossings = [
                s.event async for s in log.read(1) if isinstance(s.event, ProjectQuotaCrossed)
            ]
            if len(crossings) >= 2:
                break
            await asyncio.sleep(0.05)
        assert [(c.over, c.usage, c.quota) for c in crossings] == [(True, 2, 1), (False, 0, 1)]
        assert crossings[0].causation == "j1/sc"  # placed: starting counts as in use
    finally:
        await cancel_and_wait(running)
        await log.nc.close()
