"""Node heartbeats: a JetStream KV bucket, not the log.

Each node executor puts its node's key every few seconds; the bucket's TTL removes keys that
stopped being renewed, so the bucket holds exactly the nodes that are alive. The node watcher
(services/nodewatch) reads it and declares the lapsed ones lost on the log. Services reach it
through their host (`Heartbeats`: the bucket on a cluster, a dictionary in one process).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Protocol

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

BUCKET: Final = "fairlane-heartbeats"
#: How long a heartbeat counts: the bucket's TTL and the watcher's default timeout.
TIMEOUT_S: Final = 10.0


async def heartbeat_bucket(
    js: JetStreamContext, ttl_s: float = TIMEOUT_S, replicas: int = 1
) -> KeyValue:
    """The bucket, made on first use (its TTL and copies are fixed by whoever makes it:
    `provision` keeps it on every server of a cluster, so a node's heartbeats outlive one)."""
    try:
        return await js.key_value(BUCKET)
    except (BucketNotFoundError, NotFoundError):
        pass
    try:
        config = KeyValueConfig(bucket=BUCKET, ttl=ttl_s, history=1, replicas=replicas)
        return await js.create_key_value(config)
    except BadRequestError:  # made meanwhile by someone else, with a TTL of their own
        return await js.key_value(BUCKET)


class Heartbeats(Protocol):
    """A node's heartbeat as the services see it, whatever holds it: put one, and read the
    revision of the latest (a number that changes with every heartbeat)."""

    async def put(self, node: str) -> None: ...

    async def get(self, node: str) -> int | None:
        """The revision of `node`'s latest heartbeat; None if it has none alive."""
        ...


@dataclass
class KvHeartbeats:
    """The heartbeats in the JetStream bucket (made on first use with `ttl_s`)."""

    js: JetStreamContext
    ttl_s: float = TIMEOUT_S
    _bucket: KeyValue | None = None

    async def put(self, node: str) -> None:
        await (await self._kv()).put(node, b"")

    async def get(self, node: str) -> int | None:
        try:
            entry = await (await self._kv()).get(node)
        except (KeyNotFoundError, NotFoundError):
            return None  # expired, or never sent
        return entry.revision

    async def _kv(self) -> KeyValue:
        if self._bucket is None:
            self._bucket = await heartbeat_bucket(self.js, self.ttl_s)
        return self._bucket


@dataclass
class MemoryHeartbeats:
    """Heartbeats in one process: they never expire (a lapse is a revision that stops
    changing, which is all the node watcher looks at)."""

    revisions: dict[str, int] = field(default_factory=dict)
    _last: int = 0

    async def put(self, node: str) -> None:
        self._last += 1
        self.revisions[node] = self._last

    async def get(self, node: str) -> int | None:
        return self.revisions.get(node)
