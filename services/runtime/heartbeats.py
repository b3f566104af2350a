"""Node heartbeats: a JetStream KV bucket, not the log.

Each node executor puts its node's key every few seconds; the bucket's TTL removes keys that
stopped being renewed, so the bucket holds exactly the nodes that are alive. The node watcher
(services/nodewatch) reads it and declares the lapsed ones lost on the log.
"""

from __future__ import annotations

from typing import Final

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
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
