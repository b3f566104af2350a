"""Node heartbeats: a JetStream KV bucket, not the log.

Each node executor puts its node's key every few seconds; the bucket's TTL removes keys that
stopped being renewed, so the bucket holds exactly the nodes that are alive. The node watcher
(services/nodewatch) watches it and declares the lapsed ones lost on the log. Services reach it
through their host (`Heartbeats`: the bucket on a cluster, a dictionary in one process).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Final, Protocol

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, KeyNotFoundError, NotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

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

    def watch(self) -> AsyncIterator[tuple[str, int]]:
        """Every node's latest heartbeat now, then each new one as it comes, as (node,
        revision); a removed or lapsed key is never one. It runs until closed."""
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

    async def watch(self) -> AsyncIterator[tuple[str, int]]:
        # an ordered consumer on the bucket from each key's last entry: one read for all
        # the nodes, where a `get` per node each poll was one request per node
        watcher = await (await self._kv()).watchall(meta_only=True)
        try:
            async for entry in watcher:
                if entry is None or entry.operation in (KV_DEL, KV_PURGE):
                    continue  # the end of the keys there were; a key removed or lapsed
                yield entry.key, entry.revision
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

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
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def put(self, node: str) -> None:
        async with self._changed:
            self._last += 1
            self.revisions[node] = self._last
            self._changed.notify_all()

    async def get(self, node: str) -> int | None:
        return self.revisions.get(node)

    async def watch(self) -> AsyncIterator[tuple[str, int]]:
        seen = 0  # revisions are one counter for all nodes: the last one this watch gave
        while True:
            async with self._changed:
                while self._last <= seen:
                    await self._changed.wait()
                fresh = sorted((r, n) for n, r in self.revisions.items() if r > seen)
                seen = self._last
            for revision, node in fresh:
                yield node, revision
