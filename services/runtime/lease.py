"""Leader leases: one writer per decision kind, elected through a JetStream KV bucket.

The bucket's TTL is the lease length. `create()` takes a free lease, `update(last=revision)`
renews it; a holder that stops renewing (it died, or lost the server) loses the key when it
expires and a standby's `create()` succeeds. The lease alone is not enough to keep a deposed
leader from writing, so a new leader also records a `LeaderElected` term on `fl.leader.<kind>`
and every decision it publishes expects that term to be the subject's last message: a newer
term makes the server refuse the old leader's writes.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import structlog
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import (
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from services.runtime.retry import is_transient

BUCKET = "fairlane-leases"
#: How long a lease lasts without renewal (the bucket's TTL).
LEASE_TTL_S = 3.0
log = structlog.get_logger("fairlane.lease")


@dataclass
class Lease:
    kind: str
    holder: str
    ttl_s: float = LEASE_TTL_S
    revision: int | None = None
    _kv: KeyValue | None = None

    async def _bucket(self, js: JetStreamContext) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await js.key_value(BUCKET)
            except (BucketNotFoundError, NotFoundError):
                self._kv = await js.create_key_value(KeyValueConfig(bucket=BUCKET, ttl=self.ttl_s))
        return self._kv

    async def try_acquire(self, js: JetStreamContext) -> bool:
        kv = await self._bucket(js)
        try:
            self.revision = await kv.create(self.kind, self.holder.encode())
        except KeyWrongLastSequenceError:
            return False
        except KeyNotFoundError:
            # the race with the TTL: `create` found the key taken, then looked at it just as
            # it lapsed. Free now: the next try takes it.
            return False
        log.info("lease acquired", kind=self.kind, holder=self.holder, revision=self.revision)
        return True

    async def renew(self, js: JetStreamContext) -> bool:
        kv = await self._bucket(js)
        try:
            self.revision = await kv.update(self.kind, self.holder.encode(), last=self.revision)
        except KeyWrongLastSequenceError:
            log.warning("lease lost", kind=self.kind, holder=self.holder)
            self.revision = None
            return False
        return True

    async def acquire(self, js: JetStreamContext) -> None:
        """Wait as standby until the lease is ours (through server restarts too)."""
        # polling is the protocol here: the key frees itself when its TTL runs out
        while True:
            try:
                if await self.try_acquire(js):
                    return
            except Exception as e:
                if not is_transient(e):
                    raise
                log.warning("lease not reachable", kind=self.kind, error=str(e) or repr(e))
            await asyncio.sleep(self.ttl_s / 4)

    async def keep(self, js: JetStreamContext, lost: asyncio.Event) -> None:
        """Renew until the lease is lost (then set `lost`), or until cancelled."""
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                ok = await self.renew(js)
            except Exception as e:  # a server away for longer than the lease: treat as lost
                log.warning("lease renewal failed", kind=self.kind, error=str(e))
                ok = False
            if not ok:
                lost.set()
                return

    async def release(self, js: JetStreamContext) -> None:
        if self.revision is None:
            return
        kv = await self._bucket(js)
        with contextlib.suppress(Exception):
            await kv.delete(self.kind, last=self.revision)
        self.revision = None
