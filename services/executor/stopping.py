"""Stopping replicas: SIGTERM, the grace period, SIGKILL, and the `JobPreempted` report.

A preemption request stops the replicas it takes back (the whole job, or its newest
`request.replicas`, as the fold does); the executor of the first of those replicas reports
`JobPreempted` once its own are gone. A cluster shut down stops its jobs the same way with no
request (`shutdown`), and reports them with the reason `shutdown`. Anything the log no longer
wants here (the job ended elsewhere, this node was lost) is stopped without a report.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import structlog

from events import JobPreempted, JobPreemptionRequested
from events.catalogue import JobWork, PreemptionReason
from services.executor.checkpoints import checkpointed, store_replica
from services.executor.local import LocalReplica
from services.executor.nodework import desired

if TYPE_CHECKING:
    from services.executor.executor import Executor

logger = structlog.get_logger("fairlane.executor")

KILL_WAIT_S: Final = 30.0  # after SIGKILL, how long to wait before reporting anyway


@dataclass(frozen=True, slots=True)
class StopReport:
    """The `JobPreempted` a stop ends with, once the replicas it stopped are gone."""

    id: str
    job_id: str
    attempt: int
    reason: PreemptionReason
    replicas: int = 0
    causation: str | None = None
    #: When the replicas were stopped (None: when it is reported). A stop made before the
    #: executor restarted is reported with its own time, so the job's running time ends there.
    at: float | None = None
    #: Give up publishing after this long (an executor shutting down may outlive the log).
    within: float = 300.0


def requested(request: JobPreemptionRequested) -> StopReport:
    """The report of a stop the log asked for."""
    return StopReport(
        id=f"{request.id}/done",
        job_id=request.job_id,
        attempt=request.attempt,
        reason=request.reason,
        replicas=request.replicas,
        causation=request.id,
    )


def begin_stop(ex: Executor, job: JobWork, request: JobPreemptionRequested) -> None:
    """Stop the replicas the request takes back that run here."""
    whole = request.replicas == 0 or request.replicas >= len(job.held)
    targets = job.held if whole else job.held[len(job.held) - request.replicas :]
    if not targets:
        return
    reporter = targets[0].node == ex.node
    att = ex.attempts.get((job.job_id, request.attempt))
    local = [att.replicas[r] for r in targets if att is not None and r in att.replicas]
    if not local and not reporter:
        return
    ex.logger.info(
        "stopping",
        job=job.job_id,
        attempt=request.attempt,
        reason=request.reason,
        replicas=[lr.index for lr in local],
        grace_s=grace_of(ex, job.job_id),
    )
    ex.spawn(stop(ex, local, requested(request) if reporter else None))


def stop(ex: Executor, replicas: list[LocalReplica], report: StopReport | None) -> Awaitable[bool]:
    """Mark the replicas as being stopped (now, so that their end is not taken for a
    failure) and return the work: SIGTERM, the grace period, SIGKILL, then the report
    (the work's result: whether a report was wanted and is in the log)."""
    fresh = [lr for lr in replicas if not lr.stopping]
    for lr in replicas:
        lr.stopping = True
    return _stopping(ex, replicas, fresh, report)


async def _stopping(
    ex: Executor,
    replicas: list[LocalReplica],
    fresh: list[LocalReplica],
    report: StopReport | None,
) -> bool:
    grace = grace_of(ex, replicas[0].job_id if replicas else "")
    began = time.monotonic()
    killed = await terminate(fresh, grace)
    # Replicas that an earlier request is already stopping end on that one's schedule.
    await wait_all((lr.finished for lr in replicas), grace + KILL_WAIT_S)
    # what they saved on SIGTERM goes to the cluster's store before the stop is reported, so
    # the next attempt, placed once it is, finds it wherever it runs
    # (the poll may be storing one of them already: `store_replica` waits for it)
    stored = 0
    for lr in replicas:
        if lr.workload is None:
            continue
        try:
            await store_replica(ex, lr)
        except Exception:
            ex.logger.exception("checkpoint not stored", job=lr.job_id, replica=lr.index)
            continue
        if lr.stored_at >= began and lr.stored_bytes:
            stored += lr.stored_bytes
    reported = False
    if report is not None:
        att = ex.attempts.get((report.job_id, report.attempt))
        if att is not None:
            await att.started.wait()
        event = JobPreempted(
            id=report.id,
            time=report.at if report.at is not None else time.time(),
            actor=ex.config.actor,
            causation=report.causation,
            job_id=report.job_id,
            attempt=report.attempt,
            reason=report.reason,
            replicas=report.replicas,
            checkpointed=att is not None and checkpointed(ex, att),
            killed=killed,
            stored_bytes=stored or None,
            gpu_utilization=ex.attempt_utilization(report.job_id, report.attempt),
        )
        try:
            await ex.publish(event, give_up_after=report.within)
        except Exception as e:
            ex.logger.error("stop not reported", id=report.id, error=str(e) or repr(e))
        else:
            reported = True
    for lr in replicas:
        if not desired(ex.work.jobs.get(lr.job_id), lr.attempt, lr.replica):
            ex.drop(lr)
    return reported


def grace_of(ex: Executor, job_id: str) -> float:
    """The job's own grace period if it has one, else the cluster's (as relayed)."""
    return ex.work.grace_of(job_id)


def sync_job(ex: Executor, job_id: str) -> None:
    """Stop or forget local replicas of `job_id` that the log no longer wants here."""
    job = ex.work.jobs.get(job_id)
    for att in [a for key, a in ex.attempts.items() if key[0] == job_id]:
        for lr in list(att.replicas.values()):
            if desired(job, lr.attempt, lr.replica):
                continue
            if lr.ended:
                ex.drop(lr)
            elif not lr.stopping:
                ex.logger.info(
                    "stopping what the log no longer wants here",
                    job=job_id,
                    attempt=lr.attempt,
                    replica=lr.index,
                )
                ex.spawn(stop(ex, [lr], None))


async def terminate(replicas: list[LocalReplica], grace_s: float) -> bool:
    """SIGTERM, up to `grace_s` to exit, then SIGKILL; returns once they ended (or after
    KILL_WAIT_S more, if even SIGKILL does not end one): whether SIGKILL was needed."""
    await wait_all((lr.launched for lr in replicas), None)
    live = [lr for lr in replicas if not lr.ended and lr.workload is not None]
    for lr in live:
        assert lr.workload is not None
        lr.workload.signal(signal.SIGTERM)
    if await wait_all((lr.finished for lr in live), grace_s):
        return False
    for lr in live:
        if not lr.ended and lr.workload is not None:
            logger.warning("grace period over: SIGKILL", job=lr.job_id, replica=lr.index)
            lr.workload.signal(signal.SIGKILL)
    if not await wait_all((lr.finished for lr in live), KILL_WAIT_S):
        logger.error("workload did not end after SIGKILL", jobs=[lr.job_id for lr in live])
    return True


async def wait_all(events: Iterable[asyncio.Event], within: float | None) -> bool:
    """Wait until every event is set, or `within` seconds; whether they all were."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    if not waits:
        return True
    _, pending = await asyncio.wait(waits, timeout=within)
    for task in pending:
        task.cancel()
    return not pending
