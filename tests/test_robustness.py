"""Crashes, failover and a server restart, with real service processes and a real nats-server.

Executors run hollow (the executor's full event handling, starting no process: each replica
"runs" for a short while and completes), so a few hundred jobs flow in seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster.servers import NatsServer
from events import JobScheduled, JobSpec, LeaderElected
from events.commands import SetPool, SetProject
from services.nodewatch.service import TIMEOUT_ENV
from tests.process_cluster import (
    ProcessCluster,
    audit,
    command,
    open_log,
    replay,
    submit,
    wait_until_done,
)

pytestmark = pytest.mark.slow
NODES = 4
GPUS = 8


@pytest.fixture
async def cluster(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[ProcessCluster]:
    pc = ProcessCluster(nats_server.url, tmp_path)
    for name in ("admission", "ledger", "scheduler", "preemptor"):
        await pc.start(name, name)
    # relays the executors' work; hollow nodes send no heartbeats: never lost
    await pc.start("nodewatch", "nodewatch", env={TIMEOUT_ENV: "3600"})
    for i in range(NODES):
        await pc.start(
            f"executor-{i}",
            "executor",
            "--node",
            f"n{i}",
            "--pool",
            "default",
            "--gpus",
            str(GPUS),
            "--hollow",
            "--hollow-runtime",
            "0.4",
            "--data-dir",
            str(tmp_path / f"executor-{i}"),
        )
    log = await open_log(nats_server.url)
    assert (await command(log, SetPool(pool="default"))).ok
    for _ in range(100):
        state, _ = await replay(log)
        if len(state.nodes) == NODES:
            break
        await asyncio.sleep(0.1)
    for project in ("a", "b"):
        reply = await command(log, SetProject(project=project, pool="default", quota=16))
        assert reply.ok, reply.error
    await log.nc.close()
    try:
        yield pc
    finally:
        await pc.stop_all()


async def submit_many(url: str, count: int, prefix: str = "j") -> None:
    log = await open_log(url, "submitter")
    for i in range(count):
        spec = JobSpec(project="a" if i % 2 else "b", gpus=1 + (i % 3 == 0), priority_class="train")
        reply = await submit(log, f"{prefix}{i}", spec)
        assert reply.ok, reply.error
    await log.nc.close()


async def test_kill_9_each_service_in_turn(
    cluster: ProcessCluster, nats_server: NatsServer
) -> None:
    jobs = 200
    submitting = asyncio.create_task(submit_many(nats_server.url, jobs))
    for name in ("scheduler", "preemptor", "admission", "ledger", "executor-1"):
        await asyncio.sleep(0.8)
        await cluster.kill(name)
        await asyncio.sleep(0.3)
        await cluster.restart(name)
    await submitting
    log = await open_log(nats_server.url)
    state = await wait_until_done(log, jobs, within=120)
    _, stored = await replay(log)
    assert audit(stored) == []
    assert sorted(state.jobs) == sorted(f"j{i}" for i in range(jobs))
    await log.nc.close()


async def leader_terms(url: str, kind: str) -> list[int]:
    """Stream sequences of the `LeaderElected` terms of one kind, in log order."""
    log = await open_log(url, "terms")
    _, stored = await replay(log)
    await log.nc.close()
    return [s.seq for s in stored if isinstance(s.event, LeaderElected) and s.event.kind == kind]


@pytest.mark.parametrize("kind", ["scheduler", "preemptor"])
async def test_the_standby_takes_over(
    cluster: ProcessCluster, nats_server: NatsServer, kind: str
) -> None:
    await cluster.start(f"{kind}-2", kind, "--instance", "1")  # its own consumer
    leader = await cluster.leader(kind, f"{kind}-2")
    await submit_many(nats_server.url, 30, prefix="before")
    log = await open_log(nats_server.url)
    await wait_until_done(log, 30, within=60)
    assert len(await leader_terms(nats_server.url, kind)) == 1

    await cluster.kill(leader)
    killed_at = asyncio.get_running_loop().time()
    while len(terms := await leader_terms(nats_server.url, kind)) < 2:
        assert asyncio.get_running_loop().time() - killed_at < 30, "no standby took over"
        await asyncio.sleep(0.1)
    took_over_s = asyncio.get_running_loop().time() - killed_at
    # the lease lasts 3 s: the standby takes it once it expires, and not long after
    assert took_over_s < 15, f"the standby took over after {took_over_s:.1f} s"

    await submit_many(nats_server.url, 30, prefix="after")
    await wait_until_done(log, 60, within=60)
    _, stored = await replay(log)
    assert len(await leader_terms(nats_server.url, kind)) == 2
    if kind == "scheduler":
        placed_after = [
            s.event for s in stored if isinstance(s.event, JobScheduled) and s.seq > terms[1]
        ]
        assert {e.job_id for e in placed_after} >= {f"after{i}" for i in range(30)}
    assert audit(stored) == []
    await log.nc.close()


async def test_nats_server_restart_under_load(
    cluster: ProcessCluster, nats_server: NatsServer
) -> None:
    submitting = asyncio.create_task(submit_many(nats_server.url, 120))
    await asyncio.sleep(1.5)
    await nats_server.stop()
    await asyncio.sleep(1.0)
    await nats_server.start()
    await submitting
    log = await open_log(nats_server.url)
    await wait_until_done(log, 120, within=90)
    _, stored = await replay(log)
    assert audit(stored) == []
    await log.nc.close()
