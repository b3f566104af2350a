"""Admission on a real nats-server: a submission is created once, and a job left `submitted`
by a crash between admission's two writes is admitted when admission comes back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import msgspec
import pytest

from cluster.servers import NatsServer
from events import JobAdmitted, JobRejected, JobSpec, JobSubmitted, NodeRegistered
from events.commands import SetProject, SubmitJob
from policy.state import ClusterState
from services.admission.service import Admission, job_subjects
from services.ledger.service import Ledger
from services.runtime.client import send
from services.runtime.eventlog import Conflict, JetStreamLog, connect
from services.runtime.tasks import cancel_and_wait


@pytest.fixture
async def log(nats_server: NatsServer) -> AsyncIterator[JetStreamLog]:
    """A stream with one node and project `a`, configured through a ledger."""
    client = JetStreamLog(await connect(nats_server.url, "client"))
    await client.ensure_stream()
    await client.publish(
        NodeRegistered(id="n0/registered", time=0.0, actor="t", node="n0", pool="gpu", gpus=4)
    )
    ledger_log = JetStreamLog(await connect(nats_server.url, "ledger"))
    ledger = asyncio.create_task(Ledger(ledger_log).run())
    try:
        reply = await send(client.nc, SetProject(project="a", pool="gpu", quota=2))
        assert reply.ok, reply.error
        yield client
    finally:
        await cancel_and_wait(ledger)
        await ledger_log.nc.close()
        await client.nc.close()


@contextlib.asynccontextmanager
async def admission(url: str, name: str = "admission") -> AsyncIterator[Admission]:
    service_log = JetStreamLog(await connect(url, name))
    service = Admission(service_log)
    task = asyncio.create_task(service.run())
    try:
        yield service
    finally:
        await cancel_and_wait(task)
        await service_log.nc.close()


async def events_of(log: JetStreamLog, job_id: str) -> list[object]:
    return [s.event async for s in log.read(1) if getattr(s.event, "job_id", "") == job_id]


async def state_of(log: JetStreamLog) -> ClusterState:
    state = ClusterState()
    async for stored in log.read(1):
        state.apply(stored.event)
    return state


def stranded(job_id: str, key: str | None = None) -> JobSubmitted:
    """What admission stores first; a crash right after leaves the job without a verdict."""
    return JobSubmitted(
        id=f"{job_id}/submitted",
        time=1.0,
        actor="user",
        job_id=job_id,
        spec=JobSpec(project="a", gpus=2),
        idempotency_key=key,
    )


async def until_verdict(log: JetStreamLog, job_id: str) -> list[object]:
    for _ in range(200):
        events = await events_of(log, job_id)
        if any(isinstance(e, JobAdmitted | JobRejected) for e in events):
            return events
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job_id} got no verdict: {await events_of(log, job_id)}")


async def test_a_job_left_submitted_is_admitted_when_admission_starts(
    log: JetStreamLog, nats_server: NatsServer
) -> None:
    await log.publish(stranded("j1"))
    async with admission(nats_server.url):
        events = await until_verdict(log, "j1")
    assert [type(e).__name__ for e in events] == ["JobSubmitted", "JobAdmitted"]
    assert (await state_of(log)).jobs["j1"].phase == "pending"


async def test_a_retry_of_a_stranded_submission_gets_its_verdict(
    log: JetStreamLog, nats_server: NatsServer
) -> None:
    async with admission(nats_server.url) as service:
        seq = await log.publish(stranded("j2", key="k"))
        await service.follower.wait_for(seq)
        retry = SubmitJob(job_id="j2", spec=JobSpec(project="a", gpus=2), idempotency_key="k")
        reply = await send(log.nc, retry)
        assert reply.ok, reply.error
        assert isinstance(reply.event, JobAdmitted) and reply.event.job_id == "j2"
        # the same retry again is answered with the same verdict, and nothing more is stored
        assert (await send(log.nc, retry)).event == reply.event
        other = SubmitJob(job_id="j2", spec=JobSpec(project="a"), idempotency_key="other")
        refused = await send(log.nc, other)
        assert not refused.ok and "job id 'j2' already exists" in refused.error
    kinds = [type(e).__name__ for e in await events_of(log, "j2")]
    assert kinds == ["JobSubmitted", "JobAdmitted"]


async def test_a_submission_is_stored_once_whatever_its_message_id(log: JetStreamLog) -> None:
    """The expectation on the job's subjects, not only the duplicate window: a second
    `JobSubmitted` with another message id (a retry after the window) is refused."""
    first = stranded("j3")
    seq = await log.publish(first, fence=(job_subjects("j3"), 0))
    late_copy = msgspec.structs.replace(first, id="j3/submitted/late")
    with pytest.raises(Conflict):
        await log.publish(late_copy, fence=(job_subjects("j3"), 0))
    with pytest.raises(Conflict):  # a verdict expects the submission to be the last word
        await log.publish(
            JobRejected(id="j3/x", time=2.0, actor="t", job_id="j3", reason="r"),
            fence=(job_subjects("j3"), seq - 1),
        )
    assert len(await events_of(log, "j3")) == 1


async def test_two_admissions_racing_make_one_job(
    log: JetStreamLog, nats_server: NatsServer
) -> None:
    """The same id submitted twice at once with different keys, through two admissions: one
    submission wins, the other is refused (the duplicate window alone would answer both)."""
    async with admission(nats_server.url, "adm-1"), admission(nats_server.url, "adm-2"):
        await asyncio.sleep(0.3)  # both are serving
        commands = [
            SubmitJob(job_id=f"race{i}", spec=JobSpec(project="a"), idempotency_key=f"{k}{i}")
            for k in ("x", "y")
            for i in range(20)
        ]
        replies = await asyncio.gather(*(send(log.nc, c) for c in commands))
    state = await state_of(log)
    for i in range(20):
        answered = [r for r in replies if getattr(r.event, "job_id", None) == f"race{i}"]
        assert len(answered) == 1, [r.error for r in replies]
        kinds = [type(e).__name__ for e in await events_of(log, f"race{i}")]
        assert kinds == ["JobSubmitted", "JobAdmitted"], kinds
        assert state.jobs[f"race{i}"].phase == "pending"
    refusals = [r.error for r in replies if not r.ok]
    assert len(refusals) == 20 and all("already exists" in e for e in refusals), refusals
