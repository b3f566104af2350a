"""The cluster's checkpoint store: a JetStream object store that every node's executor reads
and writes (services/executor/storage.py), so a job's checkpoint follows it to another node.

One object per replica of a job (`<job>/replica-<i>`, a tar of its checkpoint folder). A put
writes its chunks under a new id and then the object's metadata (a rollup), so a reader sees the
previous object whole until the new one is: never a half-written checkpoint; a get checks the
SHA-256 digest the metadata records.
"""

from __future__ import annotations

from typing import Final

from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.object_store import ObjectStore

BUCKET: Final = "fairlane-checkpoints"


def bucket_config(replicas: int = 1) -> ObjectStoreConfig:
    return ObjectStoreConfig(
        bucket=BUCKET,
        description="the jobs' checkpoints, one object per replica",
        storage=StorageType.FILE,
        replicas=replicas,
    )


async def checkpoint_bucket(js: JetStreamContext) -> ObjectStore:
    """The bucket; made on first use where nobody provisioned it (a server without
    authentication: with it on, only the admin may create streams)."""
    try:
        return await js.object_store(BUCKET)
    except NotFoundError:
        pass
    try:
        return await js.create_object_store(BUCKET, bucket_config())
    except BadRequestError:  # made meanwhile by another node's executor
        return await js.object_store(BUCKET)
