"""What only the JetStream log does (the rest is in test_eventlog_contract.py): batched
replay, durable consumers acked as the reader goes, a live tail through what ends its pull
requests (expiry, a deleted consumer, a server restart)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from cluster.servers import NatsServer
from events import JobSpec, JobSubmitted, encode_event, subject_for
from services.runtime import eventlog
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


class Seen(list[int]):
    """The sequences a follower read, and a way to wait for one."""

    def __init__(self) -> None:
        super().__init__()
        self.moved = asyncio.Event()

    async def follow(self, log: JetStreamLog) -> None:
        async for stored in log.follow(1):
            self.append(stored.seq)
            self.moved.set()

    async def until(self, seq: int, within: float) -> None:
        async with asyncio.timeout(within):
            while not self or self[-1] < seq:
                self.moved.clear()
                await self.moved.wait()


@contextlib.asynccontextmanager
async def tailing(
    server: NatsServer, durable: str | None = None
) -> AsyncIterator[tuple[JetStreamLog, Seen]]:
    """A writer, and a reader following the log's tail (as `durable`) into what it saw."""
    writer = await open_log(server)
    reader = JetStreamLog(await connect(server.url, "reader"), durable=durable)
    seen = Seen()
    following = asyncio.create_task(seen.follow(reader))
    try:
        yield writer, seen
    finally:
        following.cancel()
        await reader.nc.close()
        await writer.nc.close()


async def test_a_deleted_consumer_is_made_again_from_the_next_event(
    nats_server: NatsServer,
) -> None:
    async with tailing(nats_server, durable="svc-gone") as (writer, seen):
        await writer.publish(submitted("j0"))
        await seen.until(1, within=5)
        await writer.js.delete_consumer(writer.stream, "svc-gone")  # its pull request ends
        await writer.publish(submitted("j1"))
        await seen.until(2, within=5)
        assert seen == [1, 2]


async def test_a_reader_asks_again_when_its_pull_request_expires(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eventlog, "PULL_EXPIRES_S", 0.3)
    async with tailing(nats_server) as (writer, seen):
        await writer.publish(submitted("j0"))
        await seen.until(1, within=5)
        await asyncio.sleep(1.0)  # several requests expired (408) and were made again
        await writer.publish(submitted("j1"))
        # sooner than the wait for a request that was lost (its expiry and 2 s)
        await seen.until(2, within=1.0)


async def test_the_tail_goes_on_after_a_server_restart(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the reader's pull request died with the server: it asks again as soon as its connection
    # is back, not after its request's expiry (ten minutes here, past every wait below)
    monkeypatch.setattr(eventlog, "PULL_EXPIRES_S", 600.0)
    async with tailing(nats_server, durable="svc-restart") as (writer, seen):
        await writer.publish(submitted("j0"))
        await seen.until(1, within=5)
        await nats_server.stop()
        await nats_server.start()
        await writer.publish_durably(submitted("j1"), give_up_after=20)
        await seen.until(2, within=20)
        assert seen == [1, 2]


async def test_a_stored_message_with_a_status_header_is_read_as_what_it_holds(
    nats_server: NatsServer,
) -> None:
    """Only the server's own status messages end a pull request: they come without a reply
    subject; whatever headers a writer put on a stored message are not read as one."""
    log = await open_log(nats_server)
    event = submitted("j0")
    headers = {"Status": "503", "Description": "Consumer Deleted"}
    await log.js.publish(subject_for(event), encode_event(event), headers=headers)
    assert [s.event async for s in log.read(1)] == [event]
    await log.nc.close()


async def test_a_503_for_a_consumer_that_is_there_is_waited_out_and_one_that_is_gone_is_not(
    nats_server: NatsServer,
) -> None:
    """A replicated stream's consumer answers its first pull requests with 503 while its
    leader is being chosen: the reader asks again (for a while) if the consumer is there, and
    gives up at once if it is gone."""
    log = await open_log(nats_server)
    await log.publish(submitted("j0"))
    pull = await eventlog._Pull.open(log, 1, 10, None, None)
    try:
        assert await pull.not_ready_yet()  # there: wait and ask again
        pull.not_ready = round(eventlog.NOT_READY_S / eventlog.NOT_READY_WAIT_S)
        assert not await pull.not_ready_yet()  # there, but not serving for too long
        pull.not_ready = 0
        await log.js.delete_consumer(log.stream, pull.consumer)
        assert not await pull.not_ready_yet()  # gone
    finally:
        await pull.close()
        await log.nc.close()
