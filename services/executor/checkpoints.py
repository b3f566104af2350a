"""Checkpoint polling: a touched `$FAIRLANE_CHECKPOINT_DIR/.checkpoint` becomes `JobCheckpointed`.

Only the executor of the job's first replica reports, once the attempt's `JobStarted` is in the
log. The event's time is the marker's mtime: when the checkpoint happened, and what a restarted
executor compares the marker with to know whether it was reported.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from events import JobCheckpointed
from services.executor.local import LocalAttempt, marker_mtime

if TYPE_CHECKING:
    from services.executor.executor import Executor


async def poll_checkpoints(ex: Executor) -> None:
    while True:
        await asyncio.sleep(ex.config.checkpoint_poll_s)
        for att in list(ex.attempts.values()):
            try:
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
    ex.logger.info("checkpoint", job=att.job_id, attempt=att.attempt, n=att.checkpoints)
    await ex.publish(
        JobCheckpointed(
            id=f"{att.job_id}/{att.attempt}/checkpoint/{att.checkpoints}",
            time=mtime,
            actor=ex.config.actor,
            job_id=att.job_id,
            attempt=att.attempt,
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
