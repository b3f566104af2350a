"""The relay stream across a node watcher's failover: the leader stops in the middle of
relaying, the standby (which has read both streams all along) records its term in the relay
stream, reads it back to there and writes the rest. Each node's relays are then in the relay
stream once each, in log order, and they are exactly what the fold of the log relays.

Real nats-server, two node watchers in-process (their heartbeat timeout too long to lose a
node), the log written beforehand from the virtual cluster.
"""

from __future__ import annotations

import asyncio

import pytest

from cluster.servers import NatsServer
from events import JobSpec, LeaderElected, WorkRelayed
from policy.state import ClusterState
from services.nodewatch.service import NodeWatch
from services.nodewatch.work import WorkBook
from services.runtime.eventlog import JetStreamLog, Stored, connect
from services.runtime.relays import relay_log
from services.runtime.tasks import cancel_and_wait
from tests.test_executor import eventually
from tests.test_work_relay import cluster

pytestmark = pytest.mark.nats
#: enough that the leader is still relaying when the standby has read its first relays back
#: (200 were relayed whole in that time once the log was read faster)
JOBS = 600


async def expected_relays(log: JetStreamLog) -> list[str]:
    """The relays the fold of the log as it now is gives, in log order (their ids)."""
    state, book, ids = ClusterState(), WorkBook(), []
    async for stored in log.read(1):
        verdict = state.apply(stored.event, stored.seq)
        ids += [r.id for r in book.relays(state, stored.seq, stored.event, verdict)]
    return ids


async def relay_stream(log: JetStreamLog) -> list[Stored]:
    return [s async for s in relay_log(log).read(1)]


async def test_the_standby_carries_on_relaying_where_the_leader_stopped(
    nats_server: NatsServer,
) -> None:
    vc = cluster()
    for i in range(JOBS):  # a queue that moves: ~3 relays a job
        vc.submit(f"j{i}", JobSpec(project="a"))
        vc.settle()
        if i >= 5:
            vc.complete(f"j{i - 5}")
            vc.settle()
    log = JetStreamLog(await connect(nats_server.url, "test"))
    await log.ensure_stream()
    for event in vc.log:
        await log.publish(event)
    logs = [JetStreamLog(await connect(nats_server.url, f"nodewatch-{i}")) for i in range(2)]
    watchers = [NodeWatch(one, timeout_s=3600) for one in logs]
    first = asyncio.create_task(watchers[0].run())
    await eventually(lambda: watchers[0].relayed > 0, within=10)
    standby = asyncio.create_task(watchers[1].run())
    await eventually(lambda: watchers[1].relays_read > 0, within=10)  # reading back
    await cancel_and_wait(first)  # in the middle of relaying (its lease is given back)
    expected = await expected_relays(log)
    assert watchers[0].relayed < len(expected), "the leader relayed everything: no failover"

    async def all_relayed() -> bool:
        written = [s for s in await relay_stream(log) if isinstance(s.event, WorkRelayed)]
        return len(written) >= len(expected)

    deadline = asyncio.get_running_loop().time() + 20
    while not await all_relayed():
        assert asyncio.get_running_loop().time() < deadline, "the standby did not relay the rest"
        await asyncio.sleep(0.1)
    await cancel_and_wait(standby)

    stream = await relay_stream(log)
    terms = [s.event.holder for s in stream if isinstance(s.event, LeaderElected)]
    assert terms == [w.holder for w in watchers]  # each term recorded in the relay stream
    relays = [s.event for s in stream if isinstance(s.event, WorkRelayed)]
    assert sorted(r.id for r in relays) == sorted(expected)  # each once, nothing else
    for node in {r.node for r in relays}:  # each node's in log order
        seqs = [r.source_seq for r in relays if r.node == node]
        assert seqs == sorted(seqs), node
    # the standby wrote only what the leader had not (a rewrite would be dropped by its id, so
    # only its count tells)
    assert 0 < watchers[1].relayed <= len(expected) - watchers[0].relayed
    for one in [*logs, log]:
        await one.nc.close()
