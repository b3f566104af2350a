"""A `Deliveries` subscription gets its messages as the server sent them, and nothing else
of the client changes. These fail if the pinned nats-py changes what
services/runtime/deliveries.py relies on: how its parser hands a message over
(`Client._process_msg(sid, subject, reply, data, headers)`) and a subscription's `_id`."""

from __future__ import annotations

import asyncio
import inspect

from nats.aio.client import Client
from nats.aio.msg import Msg

from cluster.servers import NatsServer
from services.runtime.connection import connect
from services.runtime.deliveries import Deliveries


def test_the_parser_hands_messages_over_as_relied_on() -> None:
    names = list(inspect.signature(Client._process_msg).parameters)
    assert names == ["self", "sid", "subject", "reply", "data", "headers"]
    parse = inspect.getsource(type(Client()._ps).parse)
    assert "self.nc._process_msg(sid, subject, reply, payload, hdr)" in parse


async def test_messages_go_straight_to_the_function_and_others_the_usual_way(
    nats_server: NatsServer,
) -> None:
    nc = await connect(nats_server.url, "deliveries")
    got: list[tuple[bytes, bytes, bytes, bytes | None]] = []
    two = asyncio.Event()

    def deliver(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        got.append((subject, reply, data, headers))
        if len(got) == 2:
            two.set()

    usual: asyncio.Queue[Msg] = asyncio.Queue()
    try:
        direct = await Deliveries.subscribe(nc, "d.x", deliver)
        assert direct.sub._id in nc._subs  # nats-py's own record: sent again on reconnect
        await nc.subscribe("d.*", cb=usual.put)  # the same message, to a usual subscription
        before = nc.stats["in_msgs"]
        await nc.publish("d.x", b"one", reply="r.1", headers={"Nats-Msg-Id": "a"})
        await nc.publish("d.x", b"two")
        await asyncio.wait_for(two.wait(), 5)
        assert got == [
            (b"d.x", b"r.1", b"one", b"NATS/1.0\r\nNats-Msg-Id: a\r\n\r\n"),
            (b"d.x", b"", b"two", None),
        ]
        msg = await asyncio.wait_for(usual.get(), 5)
        assert (msg.subject, msg.reply, msg.data, msg.headers) == (
            "d.x",
            "r.1",
            b"one",
            {"Nats-Msg-Id": "a"},
        )
        await asyncio.wait_for(usual.get(), 5)
        assert nc.stats["in_msgs"] == before + 4  # counted as nats-py counts them
        await direct.close()
        assert direct.sub._id not in nc._subs
        await nc.publish("d.x", b"three")
        await asyncio.wait_for(usual.get(), 5)  # past the closed one by now
        assert len(got) == 2
    finally:
        await nc.close()
