"""What only the JetStream log does (the rest is in test_eventlog_contract.py): batched
replay, durable consumers acked as the reader goes."""

from __future__ import annotations

import asyncio

from cluster.servers import NatsServer
from events import JobSpec, JobSubmitted
from services.runtime.eventlog import JetStreamLog, connect


def submitted(job_id: str) -> JobSubmitted:
    return JobSubmitted(
        id=f"{job_id}/submitted", time=1.0, actor="t", job_id=job_id, spec=JobSpec(project="a")
    )


async def open_log(server: NatsServer) -> JetStreamLog:
    log = JetStreamLog(await connect(server.url, "test"))
    await log.ensure_stream()
    return log


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
    reader = JetStreamLog(await connect(nats_server.url, "reader"), durable="svc-test")
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
