"""Creating the stream and buckets, with their limits, as the admin user, before services start.

With authentication on, services may read and append but not create, change or delete
streams (services/runtime/auth.py), so whoever deploys creates them once: `fairlane up` does
it for the embedded cluster. Without authentication a service still creates what is missing
itself (EventLog.ensure_stream, Lease, SnapshotStore), with the same settings.

Limits (documented in docs/operations.md):
- `max_bytes` (default 8 GiB): the log refuses new events once it holds this much
  (`discard: new`): nothing acknowledged is ever dropped to make room; services wait and
  retry until space is made (services/runtime/retry.py). `check_limits` warns from 80%.
- `max_age` (default 0, no age limit): the log is the record; old events removed by age
  would change what a replay from the start rebuilds. Set one only with snapshots kept.
- The stream denies deleting and purging messages: the log can only grow.
- The relay stream (services/runtime/relays.py: each node's work, apart from the log) has the
  same settings and its own `max_bytes` (by default the log's); `check_limits` watches both.
"""

from __future__ import annotations

from typing import Final

import structlog
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, KeyValueConfig, ObjectStoreConfig, StorageType, StreamConfig
from nats.js.errors import BucketNotFoundError, NotFoundError

from services.runtime.checkpoint_bucket import BUCKET as CHECKPOINTS
from services.runtime.checkpoint_bucket import bucket_config as checkpoints_config
from services.runtime.eventlog import STREAM, SUBJECTS
from services.runtime.gpu_samples import samples_bucket
from services.runtime.heartbeats import heartbeat_bucket
from services.runtime.lease import BUCKET as LEASES
from services.runtime.lease import LEASE_TTL_S
from services.runtime.logstream import DEFAULT_LOG_MAX_BYTES, LOG_STREAM, log_stream_config
from services.runtime.relays import RELAY_STREAM, RELAY_SUBJECTS
from services.runtime.snapshots import BUCKET as SNAPSHOTS

DEFAULT_MAX_BYTES: Final = 8 << 30
DEFAULT_MAX_AGE_S: Final = 0.0
#: The share of a limit from which `check_limits` warns.
WARN_AT: Final = 0.8
log = structlog.get_logger("fairlane.provision")


def stream_config(
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    replicas: int = 1,
    relays: bool = False,
) -> StreamConfig:
    """The log's settings, or with `relays` the relay stream's (the same but its name and
    subjects)."""
    return StreamConfig(
        name=RELAY_STREAM if relays else STREAM,
        subjects=RELAY_SUBJECTS if relays else SUBJECTS,
        duplicate_window=120.0,
        allow_rollup_hdrs=False,
        max_bytes=max_bytes,
        max_age=max_age_s,
        discard=DiscardPolicy.NEW,
        deny_delete=True,
        deny_purge=True,
        storage=StorageType.FILE,
        num_replicas=replicas,
    )


async def provision(  # noqa: PLR0913 (each stream's limits)
    js: JetStreamContext,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    replicas: int = 1,
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES,
    relay_max_bytes: int | None = None,
) -> None:
    """Create the stream, the relay stream, the lease bucket, the snapshot and checkpoint
    stores where missing, and bring an existing stream's limits to these (limits are the
    only settings changed in place). `relay_max_bytes`: the relay stream's, else the log's."""
    relay_bytes = max_bytes if relay_max_bytes is None else relay_max_bytes
    for name, config in (
        (STREAM, stream_config(max_bytes, max_age_s, replicas)),
        (RELAY_STREAM, stream_config(relay_bytes, max_age_s, replicas, relays=True)),
    ):
        try:
            await js.stream_info(name)
        except NotFoundError:
            await js.add_stream(config)
            log.info("stream created", stream=name, max_bytes=config.max_bytes)
        else:
            await js.update_stream(config)
    try:
        await js.key_value(LEASES)
    except (BucketNotFoundError, NotFoundError):
        await js.create_key_value(KeyValueConfig(bucket=LEASES, ttl=LEASE_TTL_S, replicas=replicas))
    await heartbeat_bucket(js, replicas=replicas)
    await samples_bucket(js, replicas=replicas)  # the GPUs' samples, off the log like heartbeats
    try:  # the workloads' output, bounded apart from the log (services/runtime/logstream.py)
        await js.stream_info(LOG_STREAM)
    except NotFoundError:
        await js.add_stream(log_stream_config(max_bytes=log_max_bytes, replicas=replicas))
    try:
        await js.object_store(SNAPSHOTS)
    except NotFoundError:
        await js.create_object_store(
            SNAPSHOTS,
            ObjectStoreConfig(
                bucket=SNAPSHOTS,
                description="fold snapshots",
                storage=StorageType.FILE,
                replicas=replicas,
            ),
        )
    try:  # the jobs' checkpoints, which move between nodes with them
        await js.object_store(CHECKPOINTS)
    except NotFoundError:
        await js.create_object_store(CHECKPOINTS, checkpoints_config(replicas))


async def check_limits(js: JetStreamContext) -> list[str]:
    """Warnings for every limit of the log and the relay stream that is at least WARN_AT full
    (also logged)."""
    warnings: list[str] = []
    for stream, name in ((STREAM, "the event log"), (RELAY_STREAM, "the relay stream")):
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            continue  # a log provisioned before relays had a stream of their own
        limits = (
            ("bytes", info.state.bytes, info.config.max_bytes),
            ("messages", info.state.messages, info.config.max_msgs),
        )
        for what, used, limit in limits:
            if limit is not None and limit > 0 and used >= WARN_AT * limit:
                share = used / limit
                warnings.append(f"{name} holds {used} of its {limit} {what} ({share:.0%})")
                log.warning("stream nearly full", stream=stream, what=what, used=used, limit=limit)
    return warnings
