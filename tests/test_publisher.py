"""The publisher answers as nats-py's JetStream publish does, for every kind of answer: a
sequence, the original's sequence for a duplicate, the server's error with its code, no stream
taking the subject, and no answer at all."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest
from nats.js.api import StreamConfig
from nats.js.errors import APIError

from cluster.servers import NatsServer
from services.runtime.eventlog import connect
from services.runtime.publisher import Publisher

pytestmark = pytest.mark.nats


async def test_acks_duplicates_errors_and_no_stream_read_as_nats_py_reads_them(
    nats_server: NatsServer,
) -> None:
    nc = await connect(nats_server.url, "test")
    await nc.jetstream().add_stream(StreamConfig(name="S", subjects=["s.>"]))
    publisher = Publisher(nc)
    try:
        assert await publisher.publish("s.a", b"1", {"Nats-Msg-Id": "one"}) == 1
        assert await publisher.publish("s.a", b"2", {"Nats-Msg-Id": "two"}) == 2
        # a repeat of an id is not stored again: its ack names the original
        assert await publisher.publish("s.b", b"1", {"Nats-Msg-Id": "one"}) == 1
        with pytest.raises(APIError) as refused:  # the fence: s.a's last is 2, not 1
            await publisher.publish("s.a", b"3", {"Nats-Expected-Last-Subject-Sequence": "1"})
        assert refused.value.err_code == 10071
        with pytest.raises(nats.js.errors.NoStreamResponseError):  # no stream takes t.*
            await publisher.publish("t.a", b"x", {})
        assert await publisher.publish("s.c", b"3", {}) == 3  # and it goes on
    finally:
        await publisher.close()
        await nc.close()


async def test_a_write_nobody_answers_times_out_as_nats_py_does(nats_server: NatsServer) -> None:
    nc = await connect(nats_server.url, "test")
    sub = await nc.subscribe("quiet.>")  # takes the write, never answers it
    publisher = Publisher(nc)
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await publisher.publish("quiet.a", b"x", {}, wait_s=0.2)
        assert not publisher._waiting  # nothing left behind for an answer that never came
    finally:
        await sub.unsubscribe()
        await publisher.close()
        await nc.close()
