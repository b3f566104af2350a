"""A full JetStream store: services wait instead of exiting, and carry on when space returns.

The stream refuses new events once it holds its byte limit (`discard: new`, so nothing stored
is dropped to make room). Admission answers "unavailable", and says whether the command may
still take effect; the scheduler and the executor keep retrying their writes; when the
operator raises the limit, the retried submissions get their answers and every admitted job
runs to completion, and a submission answered "nothing was written" is never created.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster.provision import check_limits, provision
from cluster.servers import NatsServer
from events import JobSpec, JobSubmitted, NodeRegistered, ProjectConfigured, ProjectTerms
from events.commands import SetPool, SetProject, SubmitJob
from services.admission.service import Admission
from services.nodewatch.service import TIMEOUT_ENV
from services.runtime.client import send
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.tasks import cancel_and_wait
from tests.process_cluster import (
    ProcessCluster,
    audit,
    command,
    node_registered,
    open_log,
    replay,
    wait_until_done,
)

SMALL = 40_000  # bytes: room for a few dozen jobs


@pytest.fixture
async def cluster(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[ProcessCluster]:
    log = await open_log(nats_server.url, "operator")
    await provision(log.js, max_bytes=SMALL)
    await log.nc.close()
    pc = ProcessCluster(nats_server.url, tmp_path)
    for name in ("admission", "ledger", "scheduler", "preemptor"):
        await pc.start(name, name)
    # relays the executors' work; hollow nodes send no heartbeats: never lost
    await pc.start("nodewatch", "nodewatch", env={TIMEOUT_ENV: "3600"})
    await pc.start(
        "executor",
        "executor",
        *("--node", "n0", "--gpus", "8", "--hollow", "--hollow-runtime", "0.2"),
        *("--data-dir", str(tmp_path / "executor")),
    )
    try:
        yield pc
    finally:
        await pc.stop_all()


def job(job_id: str) -> SubmitJob:
    spec = JobSpec(project="a", gpus=1, priority_class="train")
    return SubmitJob(job_id=job_id, spec=spec, idempotency_key=job_id)


async def fill(log: JetStreamLog) -> tuple[list[str], str, str]:
    """Submit until admission says the log is unavailable; returns the jobs admitted, the
    one refused and what it was told."""
    assert (await command(log, SetPool(pool="default"))).ok
    assert (await command(log, SetProject(project="a", pool="default", quota=8))).ok
    await node_registered(log, "n0")
    admitted: list[str] = []
    for i in range(300):
        reply = await send(log.nc, job(f"j{i}"), wait_s=30)
        if reply.retryable:
            return admitted, f"j{i}", reply.error
        assert reply.ok, reply.error
        admitted.append(f"j{i}")
    raise AssertionError("the store never filled")


@pytest.mark.slow
async def test_services_survive_a_full_store_and_recover(
    cluster: ProcessCluster, nats_server: NatsServer
) -> None:
    log = await open_log(nats_server.url, "operator")
    admitted, refused, told = await fill(log)
    warnings = await check_limits(log.js)
    assert warnings and "bytes" in warnings[0], warnings
    await asyncio.sleep(3)  # full for a while: nobody exits
    assert all(p.returncode is None for p in cluster.processes.values()), cluster.processes
    await provision(log.js, max_bytes=SMALL * 100)  # space returns
    after = await command(log, job("after"))
    assert after.ok, after.error
    await wait_until_done(log, len(admitted) + 1, within=60)
    _, stored = await replay(log)
    assert audit(stored) == []
    assert all(p.returncode is None for p in cluster.processes.values())
    if "nothing was written" in told:  # else it said it may still take effect, and how to see
        assert refused not in {s.event.job_id for s in stored if isinstance(s.event, JobSubmitted)}
    else:
        assert f"idempotency key {refused!r}" in told, told
    await log.nc.close()


async def test_a_submission_recorded_without_its_verdict_gets_one_on_retry(
    nats_server: NatsServer,
) -> None:
    """What a full store (room for the submission, not for its verdict) or a kill -9 between
    admission's two writes leaves behind: the retry with the same key must be answered."""
    log = await open_log(nats_server.url, "operator")
    await log.publish(NodeRegistered(id="n", time=0, actor="t", node="n", pool="default", gpus=8))
    await log.publish(
        ProjectConfigured(
            id="p", time=0, actor="t", project="a", terms={"default": ProjectTerms(quota=8)}
        )
    )
    pending = job("half")
    await log.publish(
        JobSubmitted(
            id="half/submitted",
            time=0,
            actor="user",
            job_id="half",
            spec=pending.spec,
            idempotency_key="half",
        )
    )
    admission_log = JetStreamLog(await connect(nats_server.url, "admission"))
    admission = Admission(admission_log)
    running = asyncio.create_task(admission.run())
    try:
        again = await command(log, pending)
        assert again.ok, again.error
    finally:
        await cancel_and_wait(running)
        await admission_log.nc.close()
        await log.nc.close()
