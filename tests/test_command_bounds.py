"""Every number and name in a command is bounded, checked before anything is stored."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import msgspec
import nats.errors
import pytest
from nats.aio.msg import Msg

from cluster.servers import NatsServer
from events import (
    JobAdmitted,
    JobSpec,
    JobSubmitted,
    NodeRegistered,
    ProjectConfigured,
    ProjectTerms,
    encode_event,
)
from events.commands import (
    ADMISSION_SUBJECT,
    LEDGER_SUBJECT,
    MAX_GPUS_TOTAL,
    MAX_SPEC_BYTES,
    MAX_WEIGHT,
    SetProject,
    SubmitJob,
    check_bounds,
    decode_command,
    decode_reply,
)
from policy.commands.names import name_problem
from services.admission.service import Admission
from services.api.types import ProjectRequest
from services.ledger.service import Ledger
from services.runtime.client import send
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.retry import RetryPolicy
from services.runtime.tasks import cancel_and_wait

HUGE = 10**20
LONG = "x" * 129


def submit(**spec: object) -> dict[str, object]:
    return {"type": "SubmitJob", "job_id": "j1", "spec": {"project": "a", **spec}}


def project(**fields: object) -> dict[str, object]:
    return {"type": "SetProject", "project": "a", **fields}


BAD = [
    (submit(gpus=HUGE), "$.spec.gpus"),
    (submit(gpus=-1), "$.spec.gpus"),
    (submit(replicas=HUGE), "$.spec.replicas"),
    (submit(replicas=0), "$.spec.replicas"),
    (submit(min_replicas=HUGE), "$.spec.min_replicas"),
    (submit(priority=HUGE), "$.spec.priority"),
    (submit(priority=-HUGE), "$.spec.priority"),
    (submit(min_runtime_s=1e15), "$.spec.min_runtime_s"),
    (submit(preemption_delay_s=-1.0), "$.spec.preemption_delay_s"),
    (submit(duration_s=1e300), "$.spec.duration_s"),
    (submit(checkpoint={"every_s": -5.0}), "$.spec.checkpoint.every_s"),
    (submit(pools=[LONG]), "$.spec.pools[0]"),
    (submit(node=LONG), "$.spec.node"),
    (submit(project=LONG), "$.spec.project"),
    (submit(working_dir="relative/path"), "$.spec.working_dir"),
    (submit(working_dir="/" + "x" * 5000), "$.spec.working_dir"),
    ({**submit(), "job_id": LONG}, "$.job_id"),
    ({**submit(), "job_id": ""}, "$.job_id"),
    ({**submit(), "actor": LONG}, "$.actor"),
    (project(quota=HUGE), "$.quota"),
    (project(quota=-1), "$.quota"),
    (project(limit=HUGE), "$.limit"),
    (project(priority=HUGE), "$.priority"),
    (project(over_quota_weight=HUGE), "$.over_quota_weight"),
    ({**project(), "project": LONG}, "$.project"),
    ({"type": "SetPool", "pool": LONG}, "$.pool"),
    ({"type": "ConfigureCluster", "preemption_grace_s": 1e12}, "$.preemption_grace_s"),
    (
        {
            "type": "ConfigureCluster",
            "priority_classes": [{"name": "x", "priority": HUGE, "preemptible": True}],
        },
        "$.priority_classes[0].priority",
    ),
    # NUL in any text: PostgreSQL (the read models) and a process's arguments refuse it
    (submit(command=["ok", "a\u0000b"]), "$.spec.command[1]"),
    (submit(env=["A=\u0000"]), "$.spec.env[0]"),
    (submit(image="img\u0000"), "$.spec.image"),
    ({**submit(), "idempotency_key": "k\u0000"}, "$.idempotency_key"),
    ({"type": "HoldScheduling", "held": True, "reason": "\u0000"}, "$.reason"),
    # a spec as large as the bus carries: its relay to a node could never be written
    (submit(command=["x" * 4000] * 250), "$.spec.command"),
]


@pytest.mark.parametrize(("command", "field"), BAD, ids=[f for _, f in BAD])
def test_a_value_out_of_bounds_is_refused_naming_its_field(
    command: dict[str, object], field: str
) -> None:
    with pytest.raises(msgspec.ValidationError, match=re.escape(f"`{field}`")):
        decode_command(msgspec.json.encode(command))


def test_refusals_say_what_is_wrong_in_words() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"without the NUL character"):
        decode_command(msgspec.json.encode(submit(command=["a\u0000"])))
    big = submit(command=["x" * 4000] * 250)
    with pytest.raises(msgspec.ValidationError) as refused:
        decode_command(msgspec.json.encode(big))
    said = str(refused.value)
    assert f"at most {MAX_SPEC_BYTES} bytes" in said and "got 1000" in said, said
    assert "its largest field, `command`" in said


def test_names_are_matched_whole() -> None:
    assert name_problem("job id", "job_id", "j1") is None
    assert name_problem("job id", "job_id", "j1\n") is not None  # Python's `$` matched before it


def test_values_within_bounds_pass() -> None:
    decode_command(msgspec.json.encode(submit(gpus=8, replicas=64, priority=-5, duration_s=60)))
    decode_command(msgspec.json.encode(project(quota=100, limit=100, priority=200)))
    # a limit below the quota caps the project (as in Run:AI): the engines all accept it
    decode_command(msgspec.json.encode(project(quota=8, limit=4)))
    check_bounds(SetProject(project="a", quota=8, limit=4))


def test_commands_built_in_python_are_checked_before_sending() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\.spec\.gpus"):
        check_bounds(SubmitJob(job_id="j1", spec=JobSpec(project="a", gpus=HUGE)))
    with pytest.raises(msgspec.ValidationError, match=r"\$\.quota"):
        check_bounds(SetProject(project="a", quota=HUGE))
    with pytest.raises(msgspec.ValidationError, match=r"\$\.job_id"):
        check_bounds(SubmitJob(job_id=LONG, spec=JobSpec(project="a")))


@pytest.fixture
async def log(nats_server: NatsServer) -> AsyncIterator[JetStreamLog]:
    event_log = JetStreamLog(await connect(nats_server.url, "test"))
    await event_log.ensure_stream()
    yield event_log
    await event_log.nc.close()


async def raw_request(log: JetStreamLog, subject: str, command: dict[str, object]) -> str:
    """As a hostile client would: bytes on the wire, no client-side check (sent again while
    the service is not serving yet)."""

    async def attempt() -> Msg:
        return await log.nc.request(subject, msgspec.json.encode(command), timeout=10)

    def undelivered(e: BaseException) -> bool:
        return isinstance(e, nats.errors.NoRespondersError)

    msg = await RetryPolicy(give_up_after_s=10).run(attempt, "request", retry_if=undelivered)
    reply = decode_reply(msg.data)
    assert not reply.ok
    return reply.error


@pytest.mark.nats
async def test_admission_refuses_before_storing_and_the_name_stays_free(
    log: JetStreamLog, nats_server: NatsServer
) -> None:
    await log.publish(NodeRegistered(id="n", time=0, actor="t", node="n", pool="default", gpus=4))
    await log.publish(
        ProjectConfigured(
            id="p", time=0, actor="t", project="a", terms={"default": ProjectTerms(quota=4)}
        )
    )
    admission_log = JetStreamLog(await connect(nats_server.url, "admission"))
    admission = Admission(admission_log)
    running = asyncio.create_task(admission.run())
    try:
        before = await log.last_seq()
        for field, value in (("gpus", HUGE), ("priority", HUGE), ("replicas", HUGE)):
            error = await raw_request(log, ADMISSION_SUBJECT, submit(**{field: value}))
            assert f"$.spec.{field}" in error, error
        assert await log.last_seq() == before  # nothing stored
        reply = await send(log.nc, SubmitJob(job_id="j1", spec=JobSpec(project="a", gpus=2)))
        assert reply.ok and isinstance(reply.event, JobAdmitted), reply.error
    finally:
        await cancel_and_wait(running)
        await admission_log.nc.close()


@pytest.mark.nats
async def test_the_ledger_survives_a_huge_value_already_in_the_log(
    log: JetStreamLog, nats_server: NatsServer
) -> None:
    """An old log may hold what the bounds now refuse: the ledger's snapshot of it fails (the
    encoder holds 64-bit integers), and the ledger carries on without it."""
    await log.publish(NodeRegistered(id="n", time=0, actor="t", node="n", pool="default", gpus=4))
    huge = JobSubmitted(
        id="old/submitted", time=0, actor="t", job_id="old", spec=JobSpec(project="a", gpus=HUGE)
    )
    await log.publish_raw("fl.job.old.job_submitted", encode_event(huge))
    ledger_log = JetStreamLog(await connect(nats_server.url, "ledger"))
    ledger = Ledger(ledger_log, snapshot_every=1)
    running = asyncio.create_task(ledger.run())
    try:
        error = await raw_request(log, LEDGER_SUBJECT, project(quota=HUGE))
        assert "$.quota" in error
        for i in range(3):  # each event applied would take a snapshot
            reply = await send(log.nc, SetProject(project=f"p{i}", quota=1))
            assert reply.ok, reply.error
        assert not running.done()
    finally:
        await cancel_and_wait(running)
        await ledger_log.nc.close()


@pytest.mark.nats
async def test_a_job_rejected_by_admission_can_be_submitted_again(
    log: JetStreamLog, nats_server: NatsServer
) -> None:
    await log.publish(NodeRegistered(id="n", time=0, actor="t", node="n", pool="default", gpus=4))
    admission_log = JetStreamLog(await connect(nats_server.url, "admission"))
    admission = Admission(admission_log)
    running = asyncio.create_task(admission.run())
    try:
        first = await send(log.nc, SubmitJob(job_id="j1", spec=JobSpec(project="a")))
        assert not first.ok and "unknown project" in first.error
        await log.publish(
            ProjectConfigured(
                id="p", time=0, actor="t", project="a", terms={"default": ProjectTerms(quota=4)}
            )
        )
        again = await send(log.nc, SubmitJob(job_id="j1", spec=JobSpec(project="a")))
        assert again.ok, again.error
    finally:
        await cancel_and_wait(running)
        await admission_log.nc.close()


@pytest.mark.nats
async def test_admission_refuses_an_unknown_project_only_on_the_whole_log(
    log: JetStreamLog, nats_server: NatsServer
) -> None:
    """A project configured a moment ago, not yet read by admission (its reader lags): the
    submission waits for the log instead of being refused."""
    await log.publish(NodeRegistered(id="n", time=0, actor="t", node="n", pool="default", gpus=4))
    admission_log = JetStreamLog(await connect(nats_server.url, "admission"))
    admission = Admission(admission_log)
    await admission.follower.catch_up()
    await log.publish(
        ProjectConfigured(
            id="p", time=0, actor="t", project="a", terms={"default": ProjectTerms(quota=4)}
        )
    )

    async def read_late() -> None:
        await asyncio.sleep(0.1)
        await admission.follower.run()

    reader = asyncio.create_task(read_late())
    try:
        reply = await admission.handle(SubmitJob(job_id="j1", spec=JobSpec(project="a")))
        assert reply.ok and isinstance(reply.event, JobAdmitted), reply.error
    finally:
        await cancel_and_wait(reader)
        await admission_log.nc.close()


def test_the_api_takes_what_the_commands_take() -> None:
    """The job spec's bounds are said once (`events/commands.py`): the API's request type
    takes every value at a bound and refuses one past it, as the commands do."""
    from events.commands import MAX_GPUS, MAX_REPLICAS  # noqa: PLC0415
    from services.api.types import SubmitRequest  # noqa: PLC0415

    base = {"job_id": "j", "project": "p"}
    for field, most in (("gpus", MAX_GPUS), ("replicas", MAX_REPLICAS)):
        taken = msgspec.json.decode(msgspec.json.encode({**base, field: most}), type=SubmitRequest)
        assert getattr(taken, field) == most
        with pytest.raises(msgspec.ValidationError, match=field):
            msgspec.json.decode(msgspec.json.encode({**base, field: most + 1}), type=SubmitRequest)
    year = 366 * 86_400.0
    taken = msgspec.json.decode(
        msgspec.json.encode({**base, "preemption_delay_s": year}), type=SubmitRequest
    )
    assert taken.preemption_delay_s == year  # a year and a day, as the commands allow


def test_the_api_takes_a_projects_terms_within_the_commands_bounds() -> None:
    # a quota the command takes is one the API takes: the bounds are said once
    assert msgspec.convert({"quota": MAX_GPUS_TOTAL}, ProjectRequest).quota == MAX_GPUS_TOTAL
    for field, too_many in (("quota", MAX_GPUS_TOTAL + 1), ("over_quota_weight", MAX_WEIGHT + 1)):
        with pytest.raises(msgspec.ValidationError, match=field):
            msgspec.convert({field: too_many}, ProjectRequest)
