"""Leader leases on a real nats-server: one holder at a time, a standby takes over."""

from __future__ import annotations

import asyncio

from cluster.servers import NatsServer
from services.runtime.eventlog import connect
from services.runtime.lease import Lease


async def test_one_holder_and_a_standby_that_takes_over(nats_server: NatsServer) -> None:
    nc1 = await connect(nats_server.url, "one")
    nc2 = await connect(nats_server.url, "two")
    js1, js2 = nc1.jetstream(), nc2.jetstream()
    first = Lease("scheduler", "one", ttl_s=1.0)
    second = Lease("scheduler", "two", ttl_s=1.0)
    assert await first.try_acquire(js1)
    assert not await second.try_acquire(js2)
    assert await first.renew(js1)
    # the holder stops renewing (as if killed): the standby gets the lease after the TTL
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(second.acquire(js2), 10)
    waited = asyncio.get_running_loop().time() - started
    assert waited < 5
    assert not await first.renew(js1)  # the old holder learns it lost
    await nc1.close()
    await nc2.close()


async def test_release_hands_over_at_once(nats_server: NatsServer) -> None:
    nc = await connect(nats_server.url, "t")
    js = nc.jetstream()
    first, second = Lease("preemptor", "a", ttl_s=30), Lease("preemptor", "b", ttl_s=30)
    assert await first.try_acquire(js)
    await first.release(js)
    assert await second.try_acquire(js)
    await nc.close()
