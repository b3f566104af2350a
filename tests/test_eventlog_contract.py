"""One contract, two logs: every test here runs on JetStream (a real nats-server) and on the
in-memory log, so code written against `EventLog` behaves the same on either."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from cluster.servers import NatsServer
from events import JobCancelled, JobSpec, JobSubmitted, Undecodable, encode_event
from services.runtime.eventlog import Conflict, EventLog, JetStreamLog, connect
from services.runtime.follower import Follower
from services.runtime.memory_log import MemoryLog, subject_matches


@pytest.fixture(params=["jetstream", "memory"])
async def log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EventLog]:
    if request.param == "memory":
        yield MemoryLog()
        return
    server = NatsServer(store_dir=tmp_path / "nats")
    await server.start()
    stream = JetStreamLog(await connect(server.url, "contract"))
    await stream.ensure_stream()
    try:
        yield stream
    finally:
        await stream.nc.close()
        await server.stop()


def submitted(job_id: str) -> JobSubmitted:
    return JobSubmitted(
        id=f"{job_id}/submitted", time=1.0, actor="t", job_id=job_id, spec=JobSpec(project="a")
    )


def cancelled(job_id: str, event_id: str | None = None) -> JobCancelled:
    return JobCancelled(id=event_id or f"{job_id}/cancelled", time=2.0, actor="t", job_id=job_id)


async def test_the_same_event_twice_is_stored_once(log: EventLog) -> None:
    assert await log.publish(submitted("j1")) == await log.publish(submitted("j1")) == 1
    assert await log.last_seq() == 1


async def test_a_write_expecting_an_older_log_is_refused(log: EventLog) -> None:
    seen = await log.publish(submitted("j1"))
    await log.publish(submitted("j2"))
    with pytest.raises(Conflict):
        await log.publish(cancelled("j1"), expect_last_seq=seen)
    assert await log.publish(cancelled("j1"), expect_last_seq=2) == 3


async def test_a_fence_on_a_subject_pattern(log: EventLog) -> None:
    """Nothing yet (0), then exactly the last sequence on any of the job's subjects."""
    job = "fl.job.j1.*"
    seq = await log.publish(submitted("j1"), fence=(job, 0))
    await log.publish(submitted("j2"))  # another job's subjects do not count
    with pytest.raises(Conflict):
        await log.publish(
            JobSubmitted(**{**msgspec.structs.asdict(submitted("j1")), "id": "again"}),
            fence=(job, 0),
        )
    with pytest.raises(Conflict):
        await log.publish(cancelled("j1"), fence=(job, seq + 1))
    assert await log.publish_durably(cancelled("j1"), fence=(job, seq)) == 3
    with pytest.raises(Conflict):
        await log.publish_durably(cancelled("j1", "c2"), fence=(job, seq))


async def test_replay_is_in_order_and_skips_and_counts_garbage(log: EventLog) -> None:
    await log.publish(submitted("j1"))
    await log.publish_raw("fl.job.j1.job_submitted", b"\x00not json")
    await log.publish_raw("fl.job.j1.unknown", b'{"type":"Nope","id":"x","time":1,"actor":"t"}')
    await log.publish(submitted("j2"))
    stored = [s async for s in log.read()]
    assert [(s.seq, getattr(s.event, "job_id", None)) for s in stored] == [(1, "j1"), (4, "j2")]
    assert [s.seq async for s in log.read(3)] == [4]
    assert log.skipped == 3


async def test_a_reader_stops_at_a_known_event_it_cannot_read(log: EventLog) -> None:
    await log.publish(submitted("j1"))
    data = msgspec.json.decode(encode_event(cancelled("j1")))
    await log.publish_raw("fl.job.j1.job_cancelled", msgspec.json.encode({**data, "job_id": 7}))
    await log.publish(submitted("j2"))
    follower = Follower(log)
    with pytest.raises(Undecodable, match="at sequence 2"):
        await follower.catch_up()
    assert follower.applied_seq == 1 and "j2" not in follower.state.jobs


async def test_last_on_a_subject(log: EventLog) -> None:
    assert await log.last_on("fl.job.j1.job_submitted") is None
    await log.publish(submitted("j1"))
    await log.publish(submitted("j2"))
    await log.publish(cancelled("j1"))
    found = await log.last_on("fl.job.j1.job_submitted")
    assert found is not None and found.seq == 1 and found.event == submitted("j1")


async def test_follow_replays_then_sees_the_tail(log: EventLog) -> None:
    await log.publish(submitted("j1"))
    seen: list[int] = []

    async def reader() -> None:
        async for stored in log.follow(1):
            seen.append(stored.seq)
            if len(seen) == 3:
                return

    task = asyncio.create_task(reader())
    await asyncio.sleep(0.2)
    await log.publish(submitted("j2"))
    await log.publish(submitted("j3"))
    await asyncio.wait_for(task, 10)
    assert seen == [1, 2, 3]


async def test_follow_with_a_subject_delivers_only_those_events(log: EventLog) -> None:
    await log.publish(submitted("j1"))
    await log.publish(cancelled("j1"))
    await log.publish(submitted("j2"))
    seen: list[tuple[int, str]] = []

    async def reader() -> None:
        async for stored in log.follow(1, subject="fl.job.*.job_submitted"):
            seen.append((stored.seq, type(stored.event).__name__))
            if len(seen) == 2:
                return

    await asyncio.wait_for(reader(), 10)
    assert seen == [(1, "JobSubmitted"), (3, "JobSubmitted")]


async def test_a_replay_with_a_subject_reads_only_those_events_up_to_now(log: EventLog) -> None:
    await log.publish(submitted("j1"))
    await log.publish(cancelled("j1"))
    await log.publish(submitted("j2"))
    await log.publish(cancelled("j3"))  # the end of the log matches nothing: still ends
    read = [(s.seq, s.event.id) async for s in log.read(1, subject="fl.job.*.job_submitted")]
    assert read == [(1, "j1/submitted"), (3, "j2/submitted")]
    assert [s.seq async for s in log.read(2, subject="fl.job.j2.*")] == [3]
    assert [s.seq async for s in log.read(1, subject="fl.job.nobody.*")] == []


async def test_a_follower_folds_the_same_state(log: EventLog) -> None:
    for i in range(300):
        await log.publish(submitted(f"j{i}"))
    await log.publish(cancelled("j7"))
    follower = Follower(log)
    assert await follower.catch_up() == 301
    assert len(follower.state.jobs) == 300 and follower.state.jobs["j7"].phase == "cancelled"


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("fl.job.*.job_started", "fl.job.j1.job_started", True),
        ("fl.job.*.job_started", "fl.job.j1.job_failed", False),
        ("fl.job.j1.*", "fl.job.j1.job_started", True),
        ("fl.job.j1.*", "fl.job.j10.job_started", False),
        ("fl.>", "fl.job.j1.x", True),
        ("fl.>", "fl", False),
        ("fl.job.*", "fl.job.j1.x", False),
    ],
)
def test_subject_patterns_match_as_nats_matches_them(
    pattern: str, subject: str, matches: bool
) -> None:
    assert subject_matches(pattern, subject) is matches
