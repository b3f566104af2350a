"""Snapshots of the fold in a JetStream object store, so that a restart replays only the tail.

Every service folds the same log into the same `ClusterState`, so one snapshot serves them all.
The ledger writes one every `EVERY_EVENTS` events (any service could: a snapshot at sequence
`n` is the fold of events 1..n whoever takes it); every other service reads the newest on
start and replays from the sequence after it. A snapshot is only ever a shortcut: one that is
missing, unreadable or of another fold version is logged and ignored, and the service replays
the whole log as it would without one.

The object store chunks the bytes (a state of 100,000 jobs is tens of megabytes; a KV value is
capped at the server's max payload), and replaces the object whole: a reader sees the old
snapshot or the new one, never a mix.
"""

from __future__ import annotations

import asyncio
import io
import time
from typing import Final

import structlog
from nats.js import JetStreamContext
from nats.js.api import ObjectMeta, ObjectMetaOptions, StorageType
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from policy.snapshot import SnapshotMismatch, decode_snapshot, encode_snapshot
from policy.state import ClusterState

BUCKET: Final = "fairlane-snapshots"
OBJECT: Final = "cluster-state"
#: How many events the ledger folds between two snapshots.
EVERY_EVENTS: Final = 50_000
CHUNK_BYTES: Final = 512 * 1024
#: How long one read of the snapshot may wait for its chunks (a 27 MB state reads in about a
#: second here), and how often it is tried before the whole log is replayed instead.
LOAD_WAIT_S: Final = 10.0
LOAD_ATTEMPTS: Final = 3
log = structlog.get_logger("fairlane.snapshots")


class SnapshotStore:
    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self._store: ObjectStore | None = None

    async def _bucket(self) -> ObjectStore:
        if self._store is None:
            try:
                self._store = await self.js.object_store(BUCKET)
            except NotFoundError:
                self._store = await self.js.create_object_store(
                    BUCKET, description="fold snapshots", storage=StorageType.FILE
                )
        return self._store

    async def load(self) -> tuple[ClusterState, int] | None:
        """The newest snapshot's state and sequence, or None if there is none this code can use."""
        began = time.perf_counter()
        buffer = io.BytesIO()
        try:
            for attempt in range(1, LOAD_ATTEMPTS + 1):
                buffer = io.BytesIO()
                if await self._read(buffer):
                    break
                log.warning("snapshot replaced while read: reading it again", attempt=attempt)
            else:
                return None
        except NotFoundError:
            return None
        except Exception as e:  # a damaged or half-written object: replay instead
            log.warning("snapshot unreadable, replaying the whole log", error=repr(e))
            return None
        try:
            state, seq = decode_snapshot(buffer.getvalue())
        except SnapshotMismatch as e:
            log.warning("snapshot ignored, replaying the whole log", reason=str(e))
            return None
        log.info(
            "snapshot loaded",
            seq=seq,
            jobs=len(state.jobs),
            bytes=buffer.tell(),
            seconds=round(time.perf_counter() - began, 3),
        )
        return state, seq

    async def _read(self, buffer: io.BytesIO) -> bool:
        """The snapshot into `buffer`; False if its chunks did not come within LOAD_WAIT_S.
        nats-py reads the object's description, then waits for its chunks with no time limit:
        a snapshot replaced in between (the ledger takes them as events arrive) has its chunks
        purged, and the read waited for ever (a restarting service hung at its start)."""
        store = await self._bucket()
        try:
            async with asyncio.timeout(LOAD_WAIT_S):
                await store.get(OBJECT, writeinto=buffer)
        except TimeoutError:
            return False
        return True

    async def save(self, data: bytes, seq: int) -> None:
        """Store snapshot bytes (`encode_snapshot`) taken at `seq`."""
        store = await self._bucket()
        meta = ObjectMeta(
            name=OBJECT,
            description=f"fold up to seq {seq}",
            options=ObjectMetaOptions(max_chunk_size=CHUNK_BYTES),
        )
        began = time.perf_counter()
        await store.put(OBJECT, data, meta=meta)
        log.info(
            "snapshot saved",
            seq=seq,
            bytes=len(data),
            seconds=round(time.perf_counter() - began, 3),
        )


class Snapshotter:
    """Takes a snapshot every `every` events a follower applies; one write in flight at a time
    (a slow write is not queued behind: the next one is simply taken later)."""

    def __init__(self, store: SnapshotStore, every: int = EVERY_EVENTS) -> None:
        self.store = store
        self.every = every
        self.last_seq = 0
        self._writing: asyncio.Task[None] | None = None

    def after_apply(self, state: ClusterState, seq: int) -> None:
        if seq - self.last_seq < self.every or (self._writing and not self._writing.done()):
            return
        self.last_seq = seq
        # encoded now, between two applies, where the state is `seq`'s; written in the background
        try:
            data = encode_snapshot(state, seq)
        except Exception as e:  # a value no snapshot can hold (an old log's huge integer):
            log.error("snapshot not taken", seq=seq, error=repr(e))  # only a shortcut
            return
        self._writing = asyncio.create_task(self._write(data, seq))

    async def _write(self, data: bytes, seq: int) -> None:
        try:
            await self.store.save(data, seq)
        except Exception as e:  # only a shortcut: the log still holds everything
            log.warning("snapshot not saved", seq=seq, error=repr(e))

    async def close(self) -> None:
        if self._writing is not None and not self._writing.done():
            await asyncio.wait({self._writing}, timeout=10)
