"""The host's heartbeat store holds one contract on NATS and in one process: a node's latest
heartbeat has a revision that changes with each one, and a node that sent none has none."""

from __future__ import annotations

from cluster.servers import NatsServer
from services.runtime.eventlog import JetStreamLog, connect
from services.runtime.heartbeats import Heartbeats
from services.runtime.host import InProcessHost, NatsHost


async def holds_the_contract(beats: Heartbeats) -> None:
    assert await beats.get("n0") is None
    await beats.put("n0")
    first = await beats.get("n0")
    await beats.put("n0")
    second = await beats.get("n0")
    assert first is not None and second is not None and second != first
    assert await beats.get("n1") is None


async def test_heartbeats_on_nats(nats_server: NatsServer) -> None:
    log = JetStreamLog(await connect(nats_server.url, "test"))
    try:
        await holds_the_contract(NatsHost(log).heartbeats(ttl_s=30.0))
    finally:
        await log.nc.close()


async def test_heartbeats_in_one_process() -> None:
    await holds_the_contract(InProcessHost().heartbeats())
