"""The cluster's checkpoint store, which every node's executor reads and writes
(services/executor/storage.py), so a job's checkpoint follows it to another node.

One object per replica of a job (`<job>/replica-<i>`, a tar of its checkpoint folder). On a
cluster it is a JetStream object store (`JetStreamCheckpoints`): a put writes its chunks under
a new id and then the object's metadata (a rollup), so a reader sees the previous object whole
until the new one is, never a half-written checkpoint; a get checks the SHA-256 digest the
metadata records. In one process it is a dictionary (`MemoryCheckpoints`), where a put is
whole at once. Services reach it through their host.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from io import BufferedIOBase
from typing import Final, Protocol

from nats.js import JetStreamContext
from nats.js.api import ObjectMeta, ObjectMetaOptions, ObjectStoreConfig, StorageType
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.object_store import ObjectStore

BUCKET: Final = "fairlane-checkpoints"
#: The size of the pieces a put sends an object in.
CHUNK_BYTES: Final = 1 << 20


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


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An object as the store holds it: its size and digest (`SHA-256=<base64url>`)."""

    name: str
    size: int
    digest: str


class CheckpointStore(Protocol):
    """The replicas' archives, whatever holds them."""

    async def put(self, name: str, data: BufferedIOBase) -> StoredObject:
        """Make `data` (read to its end) the object `name`, replacing any before it."""
        ...

    async def info(self, name: str) -> StoredObject | None:
        """The object `name` as stored now; None if there is none."""
        ...

    async def get(self, name: str, into: BufferedIOBase) -> StoredObject:
        """Write the object `name` into `into`, checking its digest; it must exist."""
        ...


@dataclass
class JetStreamCheckpoints:
    """The store in the cluster's JetStream object store (made on first use)."""

    js: JetStreamContext
    _bucket: ObjectStore | None = None

    async def put(self, name: str, data: BufferedIOBase) -> StoredObject:
        meta = ObjectMeta(name=name, options=ObjectMetaOptions(max_chunk_size=CHUNK_BYTES))
        info = await (await self._store()).put(name, data, meta=meta)
        return StoredObject(name, info.size or 0, info.digest or "")

    async def info(self, name: str) -> StoredObject | None:
        try:
            info = await (await self._store()).get_info(name)
        except NotFoundError:
            return None
        return StoredObject(name, info.size or 0, info.digest or "")

    async def get(self, name: str, into: BufferedIOBase) -> StoredObject:
        result = await (await self._store()).get(name, writeinto=into)  # checks the digest
        return StoredObject(name, result.info.size or 0, result.info.digest or "")

    async def _store(self) -> ObjectStore:
        if self._bucket is None:
            self._bucket = await checkpoint_bucket(self.js)
        return self._bucket


def digest_of(data: bytes) -> str:
    """The digest as the object store writes it."""
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


@dataclass
class MemoryCheckpoints:
    """The store in one process: each object's bytes, replaced whole by a put."""

    objects: dict[str, bytes] = field(default_factory=dict)

    async def put(self, name: str, data: BufferedIOBase) -> StoredObject:
        self.objects[name] = content = data.read()
        return StoredObject(name, len(content), digest_of(content))

    async def info(self, name: str) -> StoredObject | None:
        content = self.objects.get(name)
        return None if content is None else StoredObject(name, len(content), digest_of(content))

    async def get(self, name: str, into: BufferedIOBase) -> StoredObject:
        content = self.objects.get(name)
        if content is None:
            raise LookupError(f"no checkpoint object {name!r}")
        into.write(content)
        return StoredObject(name, len(content), digest_of(content))
