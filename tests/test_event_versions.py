"""Event versions: always written, newer events read without loss, older ones upcast, and a
known event that cannot be read stops a reader instead of being skipped."""

from __future__ import annotations

import msgspec
import pytest

from cluster.servers import NatsServer
from events import (
    SCHEMA_VERSION,
    ClusterConfigured,
    ClusterSettings,
    JobAdmitted,
    JobCancelled,
    JobSpec,
    JobSubmitted,
    NotAnEvent,
    PriorityClass,
    SchedulerSettings,
    Undecodable,
    decode_event,
    encode_event,
)
from events.model import DEFAULT_PRIORITY_CLASSES
from events.versions import upcast
from policy.state import ClusterState
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.follower import Follower

ADMITTED = JobAdmitted(
    id="j1/admission",
    time=5.0,
    actor="admission",
    job_id="j1",
    project="a",
    priority=50,
    preemptible=True,
    gpus=2,
    replicas=1,
    min_replicas=1,
    pools=("gpu",),
)

#: ClusterConfigured as version 1 wrote it: no version field, the settings as its own fields.
CLUSTER_V1 = (
    b'{"type":"ClusterConfigured","id":"cluster","time":0.0,"actor":"user",'
    b'"scheduler":{"type":"priority","fitting":"worst","victim_order":"cost"},'
    b'"preemption_grace_s":12.0,"priority_classes":[],'
    b'"default_compute_pool":"gpu","default_aux_pool":"cpu"}'
)


def fields_of(data: bytes) -> dict[str, object]:
    decoded = msgspec.json.decode(data)
    assert isinstance(decoded, dict)
    return decoded


def from_the_next_version(event: JobAdmitted | JobSubmitted) -> bytes:
    """`event` as the next schema version would write it: one field more, here and inside."""
    fields = fields_of(encode_event(event))
    fields |= {"version": SCHEMA_VERSION + 1, "deadline_s": 3600.0}
    if isinstance(event, JobSubmitted):
        assert isinstance(fields["spec"], dict)
        fields["spec"] = {**fields["spec"], "accelerator": "h100"}
    return msgspec.json.encode(fields)


def test_the_version_is_always_written() -> None:
    for event in (ADMITTED, JobCancelled(id="c", time=1.0, actor="u", job_id="j1")):
        assert fields_of(encode_event(event))["version"] == SCHEMA_VERSION


def test_an_event_of_the_next_version_is_read_without_loss() -> None:
    newer = decode_event(from_the_next_version(ADMITTED))
    assert newer == msgspec.structs.replace(ADMITTED, version=SCHEMA_VERSION + 1)
    submitted = JobSubmitted(
        id="j2/submitted", time=1.0, actor="u", job_id="j2", spec=JobSpec(project="a", gpus=4)
    )
    assert decode_event(from_the_next_version(submitted)).spec == submitted.spec  # type: ignore[union-attr]


def test_a_version_1_event_is_upcast() -> None:
    event = decode_event(CLUSTER_V1)
    assert isinstance(event, ClusterConfigured)
    assert event.version == SCHEMA_VERSION
    assert event.settings == ClusterSettings(
        scheduler=SchedulerSettings(type="priority", fitting="worst", victim_order="cost"),
        preemption_grace_s=12.0,
        priority_classes=DEFAULT_PRIORITY_CLASSES,  # version 1's empty list meant these
        default_compute_pool="gpu",
        default_aux_pool="cpu",
    )
    # classes that were given stay; the current version's own encoding reads back as is
    given = upcast({**fields_of(CLUSTER_V1), "priority_classes": [["x", 1, True]]})
    assert given["settings"]["priority_classes"] == [["x", 1, True]]
    again = ClusterConfigured(
        id="c2",
        time=1.0,
        actor="u",
        settings=ClusterSettings(priority_classes=(PriorityClass("x", 1, True),)),
    )
    assert decode_event(encode_event(again)) == again


def test_a_known_type_that_cannot_be_read_is_not_garbage() -> None:
    broken = fields_of(encode_event(ADMITTED)) | {"gpus": "two"}
    with pytest.raises(Undecodable, match="JobAdmitted version 2 cannot be read"):
        decode_event(msgspec.json.encode(broken))
    for garbage in (b"\x00not json", b"[1, 2]", b'{"type":"Nope","id":"x"}', b'{"id":"x"}'):
        with pytest.raises(NotAnEvent):
            decode_event(garbage)


async def test_services_fold_newer_and_older_events_and_stop_at_unreadable_ones(
    nats_server: NatsServer,
) -> None:
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    submitted = JobSubmitted(
        id="j1/submitted", time=1.0, actor="u", job_id="j1", spec=JobSpec(project="a", gpus=2)
    )
    await log.publish_raw("fl.cluster.cluster_configured", CLUSTER_V1)
    await log.publish_raw("fl.job.j1.job_submitted", from_the_next_version(submitted))
    await log.publish_raw("fl.job.j1.job_admitted", from_the_next_version(ADMITTED))
    await log.publish_raw("fl.job.j1.junk", b"\x00not json")
    follower = Follower(log)
    assert await follower.catch_up() == 3
    state: ClusterState = follower.state
    assert state.settings.scheduler.type == "priority" and state.settings.preemption_grace_s == 12
    job = state.jobs["j1"]
    assert (job.phase, job.gpus, job.pools, job.spec) == ("pending", 2, ("gpu",), submitted.spec)
    assert log.skipped == 1
    broken = fields_of(encode_event(JobCancelled(id="c", time=2.0, actor="u", job_id="j1")))
    await log.publish_raw("fl.job.j1.job_cancelled", msgspec.json.encode(broken | {"job_id": 7}))
    with pytest.raises(Undecodable, match="at sequence 5"):
        await follower.catch_up()
    assert follower.applied_seq == 3 and state.jobs["j1"].phase == "pending"
    await log.nc.close()
