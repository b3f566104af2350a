"""The event log on a real nats-server: idempotent publishing, fenced writes, replay, bad input."""

from __future__ import annotations

import asyncio

import pytest

from events import JobCancelled, JobSpec, JobSubmitted
from services.runtime.eventlog import Conflict, EventLog, connect
from services.runtime.servers import NatsServer


def submitted(job_id: str) -> JobSubmitted:
    return JobSubmitted(
        id=f"{job_id}/submitted", time=1.0, actor="t", job_id=job_id, spec=JobSpec(project="a")
    )


async def open_log(server: NatsServer) -> EventLog:
    log = EventLog(await connect(server.url, "test"))
    await log.ensure_stream()
    return log


async def test_the_same_event_twice_is_stored_once(nats_server: NatsServer) -> None:
    log = await open_log(nats_server)
    first = await log.publish(submitted("j1"))
    again = await log.publish(submitted("j1"))
    assert first == again == 1
    assert await log.last_seq() == 1
    await log.nc.close()


async def test_a_stale_writer_is_refused(nats_server: NatsServer) -> None:
    log = await open_log(nats_server)
    seen = await log.publish(submitted("j1"))
    await log.publish(submitted("j2"))
    with pytest.raises(Conflict):
        await log.publish(
            JobCancelled(id="c1", time=2.0, actor="t", job_id="j1"), expect_last_seq=seen
        )
    assert (
        await log.publish(
            JobCancelled(id="c2", time=2.0, actor="t", job_id="j1"), expect_last_seq=2
        )
        == 3
    )
    await log.nc.close()


async def test_replay_skips_garbage_and_keeps_order(nats_server: NatsServer) -> None:
    log = await open_log(nats_server)
    await log.publish(submitted("j1"))
    await log.publish_raw("fl.job.j1.job_submitted", b"\x00not json")
    await log.publish_raw("fl.job.j1.unknown", b'{"type":"Nope","id":"x","time":1,"actor":"t"}')
    await log.publish(submitted("j2"))
    stored = [s async for s in log.read()]
    assert [(s.seq, getattr(s.event, "job_id", None)) for s in stored] == [(1, "j1"), (4, "j2")]
    assert log.skipped == 2
    await log.nc.close()


async def test_follow_sees_the_live_tail(nats_server: NatsServer) -> None:
    log = await open_log(nats_server)
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
    await log.nc.close()


async def test_a_thousand_events_replay_in_order(nats_server: NatsServer) -> None:
    log = await open_log(nats_server)
    acks = [log.publish(submitted(f"j{i}")) for i in range(1000)]
    await asyncio.gather(*acks)
    stored = [s async for s in log.read(batch=300)]
    assert [s.seq for s in stored] == list(range(1, 1001))
    await log.nc.close()


async def test_a_durable_follower_acks_what_it_has_handled(nats_server: NatsServer) -> None:
    """The server's ack floor is the reader's progress; a reader made again starts where it
    says, not where the old consumer was."""
    writer = await open_log(nats_server)
    for i in range(5):
        await writer.publish(submitted(f"j{i}"))
    reader = EventLog(await connect(nats_server.url, "reader"), durable="svc-test")
    handled: list[int] = []

    async def follow(from_seq: int, until: int) -> None:
        async for stored in reader.follow(from_seq):
            handled.append(stored.seq)
            if stored.seq == until:
                return

    await asyncio.wait_for(follow(1, 3), 10)
    await asyncio.sleep(0.2)
    info = await writer.js.consumer_info(writer.stream, "svc-test")
    # 1 and 2 were handled (the reader came back for the next); 3 was still being handled
    assert info.ack_floor is not None and info.ack_floor.stream_seq == 2
    await asyncio.wait_for(follow(4, 5), 10)
    await asyncio.sleep(0.2)
    assert handled == [1, 2, 3, 4, 5]
    info = await writer.js.consumer_info(writer.stream, "svc-test")
    assert info.config.durable_name == "svc-test"
    assert info.ack_floor is not None and info.ack_floor.stream_seq == 4
    await reader.nc.close()
    await writer.nc.close()


async def test_follow_with_a_subject_delivers_only_those_events(nats_server: NatsServer) -> None:
    log = await open_log(nats_server)
    await log.publish(submitted("j1"))
    await log.publish(JobCancelled(id="j1/cancelled", time=1.0, actor="t", job_id="j1"))
    await log.publish(submitted("j2"))
    seen: list[tuple[int, str]] = []

    async def reader() -> None:
        async for stored in log.follow(1, subject="fl.job.*.job_submitted"):
            seen.append((stored.seq, type(stored.event).__name__))
            if len(seen) == 2:
                return

    await asyncio.wait_for(reader(), 10)
    assert seen == [(1, "JobSubmitted"), (3, "JobSubmitted")]
    await log.nc.close()
