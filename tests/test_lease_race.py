"""The lease race on a real nats-server: a key that lapses while a standby's `create` looks."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.js.kv import KeyValue

from cluster.servers import NatsServer
from services.runtime.eventlog import connect
from services.runtime.lease import Lease


class SlowLookingBucket(KeyValue):
    """The real bucket, with time passing between `create`'s write and its look at the key
    (as on a busy machine): long enough for the holder's key to lapse."""

    lapse_s = 0.0

    async def _get(self, key: str, revision: int | None = None) -> Any:
        await asyncio.sleep(self.lapse_s)
        return await super()._get(key, revision)


async def test_a_key_lapsing_inside_create_is_a_miss_not_a_crash(
    nats_server: NatsServer,
) -> None:
    nc = await connect(nats_server.url, "t")
    js = nc.jetstream()
    holder = Lease("scheduler", "holder", ttl_s=1.0)
    assert await holder.try_acquire(js)
    standby = Lease("scheduler", "standby", ttl_s=1.0)
    real = await js.key_value("fairlane-leases")
    slow = SlowLookingBucket(
        name=real._name, stream=real._stream, pre=real._pre, js=js, direct=real._direct
    )
    slow.lapse_s = 2.5  # the holder's key (TTL 1 s) is gone when create looks
    standby._kv = slow
    assert not await standby.try_acquire(js)  # lost the race, did not raise
    slow.lapse_s = 0.0
    assert await standby.try_acquire(js)  # and takes the free lease next time
    await nc.close()
