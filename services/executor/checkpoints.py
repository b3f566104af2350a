"""Checkpoint polling: a touched `$FAIRLANE_CHECKPOINT_DIR/.checkpoint` becomes `JobCheckpointed`,
and a replica that saved has its folder stored in the cluster's checkpoint store (`storage`).

Only the executor of the job's first replica reports, once the attempt's `JobStarted` is in the
log. The event's time is the marker's mtime: when the checkpoint happened, and what a restarted
executor compares the marker with to know whether it was reported. Every executor stores its
own replicas' folders, each after it saved (the marker, or the workload said so) and after it
stopped on SIGTERM (`stopping`), and fetches them before a later attempt starts here
(`lifecycle`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

from events import JobCheckpointed, JobMessage
from services.executor.local import LocalAttempt, LocalReplica, marker_mtime
from services.executor.runtime import checkpoint_dir
from services.executor.storage import Stored, object_name

if TYPE_CHECKING:
    from services.executor.executor import Executor


async def poll_checkpoints(ex: Executor) -> None:
    while True:
        await asyncio.sleep(ex.config.checkpoint_poll_s)
        for att in list(ex.attempts.values()):
            try:
                for lr in list(att.replicas.values()):
                    if att.started.is_set() and not lr.ended and saved_since_stored(ex, lr):
                        await store_replica(ex, lr)
                await check_marker(ex, att)
            except asyncio.CancelledError:
                raise
            except Exception:
                ex.logger.exception("checkpoint poll failed", job=att.job_id)


async def check_marker(ex: Executor, att: LocalAttempt) -> None:
    job = ex.work.jobs.get(att.job_id)
    if (
        job is None
        or job.attempt != att.attempt
        or job.phase not in ("starting", "running")
        or job.stop_replicas
        or not job.held
        or job.held[0].node != ex.node
        or not att.started.is_set()
    ):
        return
    mtime = marker_mtime(att.checkpoint_dir)
    if mtime is None or mtime <= max(att.last_checkpoint, att.baseline_mtime or 0.0):
        return
    att.checkpoints += 1
    att.last_checkpoint = mtime
    first = min(att.replicas.values(), key=lambda lr: lr.index, default=None)
    ex.logger.info("checkpoint", job=att.job_id, attempt=att.attempt, n=att.checkpoints)
    await ex.publish(
        JobCheckpointed(
            id=f"{att.job_id}/{att.attempt}/checkpoint/{att.checkpoints}",
            time=mtime,
            actor=ex.config.actor,
            job_id=att.job_id,
            attempt=att.attempt,
            # what the store holds of it, where it was just stored (the poll stores first)
            size_bytes=first.stored_bytes if first is not None else None,
        )
    )


def checkpointed(ex: Executor, att: LocalAttempt) -> bool:
    """Whether the attempt saved a checkpoint: the workload said so, or the checkpoint marker
    was touched since the attempt started here."""
    if not ex.runtime.real:
        return False
    if att.saved_by_workload:
        return True
    now = marker_mtime(att.checkpoint_dir)
    return now is not None and (att.baseline_mtime is None or now > att.baseline_mtime)


def replica_folder(ex: Executor, lr: LocalReplica) -> Path:
    return checkpoint_dir(ex.checkpoints_root, lr.job_id, lr.index)


def saved_since_stored(ex: Executor, lr: LocalReplica) -> bool:
    """Whether the replica saved a checkpoint that is not stored yet: the workload said so
    again, or its folder's marker is newer than the one last stored (or found at its start)."""
    if ex.objects is None:
        return False
    if lr.saves > lr.stored_saves:
        return True
    mark = marker_mtime(replica_folder(ex, lr))
    return mark is not None and (lr.stored_mark is None or mark > lr.stored_mark)


async def store_replica(ex: Executor, lr: LocalReplica) -> Stored | None:
    """Store the replica's checkpoint folder in the cluster's store (one at a time per
    replica); a folder over the bound is not stored, and the job's timeline says so."""
    if ex.objects is None:
        return None
    folder = replica_folder(ex, lr)
    async with lr.store_lock:
        if not saved_since_stored(ex, lr):
            return None  # stored meanwhile, by the poll or the stop
        mark, saves = marker_mtime(folder), lr.saves
        stored = await ex.objects.store(folder, object_name(lr.job_id, lr.index))
        lr.stored_mark, lr.stored_saves = mark, saves
    if stored.over_bound:
        bound = ex.objects.max_bytes
        ex.logger.warning(
            "checkpoint over the bound: not stored", job=lr.job_id, size=stored.size, bound=bound
        )
        await ex.publish(
            JobMessage(
                id=f"{lr.job_id}/{lr.attempt}/{lr.index}/checkpoint-over-bound/{saves}/{mark}",
                time=time.time(),
                actor=ex.config.actor,
                job_id=lr.job_id,
                attempt=lr.attempt,
                text=(
                    f"the checkpoint of replica {lr.index} on {ex.node} is {stored.size} bytes, "
                    f"over the bound of {bound} (--checkpoint-max-bytes): not stored; "
                    "an attempt on another node resumes from the last one stored"
                ),
            )
        )
    elif stored.digest is not None:
        lr.stored_bytes, lr.stored_at = stored.size, time.monotonic()
        ex.logger.info("checkpoint stored", job=lr.job_id, object=stored.name, size=stored.size)
    return stored


async def fetch_replica(ex: Executor, lr: LocalReplica) -> None:
    """Before a later attempt's replica starts here: its folder made the stored checkpoint,
    where this node's copy is not it. A failure to fetch starts it from what is here, and
    the job's timeline says so."""
    if ex.objects is None or lr.attempt <= 1:
        return
    folder = replica_folder(ex, lr)
    try:
        size = await ex.objects.fetch(folder, object_name(lr.job_id, lr.index))
    except Exception as e:  # the store away, a digest that does not match
        ex.logger.exception("checkpoint not fetched", job=lr.job_id, replica=lr.index)
        await ex.publish(
            JobMessage(
                id=f"{lr.job_id}/{lr.attempt}/{lr.index}/checkpoint-not-fetched",
                time=time.time(),
                actor=ex.config.actor,
                job_id=lr.job_id,
                attempt=lr.attempt,
                text=f"the checkpoint of replica {lr.index} could not be fetched to "
                f"{ex.node}: {e!r}; it starts from what is there",
            )
        )
        return
    if size is not None:
        ex.logger.info("checkpoint fetched", job=lr.job_id, replica=lr.index, size=size)
