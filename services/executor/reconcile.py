"""Reconciling after a restart: the log's view of this node against what really runs here.

After the replay, recorded workloads still alive are adopted; those that ended meanwhile are
reported from the exit status they left; one that left none (a reboot) is reported as lost;
those that the last shut down here stopped and could not report (`shutdown`) are reported
stopped for it, with the time they were stopped;
what was placed here while the executor was down is started; and anything the log no longer
wants here (the job completed or failed elsewhere, a preemption reported by another node, this
node lost) is stopped without a report.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from events.catalogue import JobWork
from events.model import Replica
from services.executor.lifecycle import announce_started, launch_of, replica_ended, run_replica
from services.executor.local import LocalReplica
from services.executor.runtime import ProcessRecord
from services.executor.shutdown import (
    StoppedAttempt,
    forget_stopped,
    read_stopped,
    shutdown_report,
)
from services.executor.stopping import begin_stop, stop, sync_job

if TYPE_CHECKING:
    from services.executor.executor import Executor

RecordKey = tuple[str, int, Replica]


def reconcile(ex: Executor, records: list[ProcessRecord]) -> None:
    """Adopt what an earlier run of this executor left (`records`: what the runtime found)
    running and the log still wants, stop what it does not want, report what ended while
    nobody watched, and start what was placed here but never started."""
    recorded: dict[RecordKey, ProcessRecord] = {
        (r.job_id, r.attempt, Replica(r.node, r.gpus)): r for r in records if r.node == ex.node
    }
    stops: list[JobWork] = []
    lost: list[LocalReplica] = []
    marks = read_stopped(ex.data_dir) if ex.runtime.real else {}
    shut: list[Awaitable[bool]] = []
    for job in list(ex.work.jobs.values()):  # those holding replicas here
        mark = marks.get((job.job_id, job.attempt)) if job.stop_replicas == 0 else None
        found = _reconcile_job(ex, job, recorded, mark)
        if mark is not None:
            # stopped by the last shut down, never reported: report it now (`stop` marks
            # the replicas at once, so their end is not taken for a failure)
            shut.append(stop(ex, found, shutdown_report(job.job_id, job.attempt, mark.at)))
        else:
            lost += found
        if job.stop_replicas > 0:
            stops.append(job)
    if marks:
        ex.spawn(_forget_once_reported(ex, shut))
    # Recorded but not wanted by the log any more: stop (or forget) without a report.
    for record in recorded.values():
        att = ex.attempt(record.job_id, record.attempt, None, False, record.replica)
        lr = ex.add(att, record.replica, Replica(record.node, record.gpus))
        lr.workload = ex.runtime.adopt(record)
        ex.spawn(run_replica(ex, lr, None))
    for job in stops:
        request = ex.work.requests.get(job.job_id)
        if request is not None and request.attempt == job.attempt:
            begin_stop(ex, job, request)
    for lr in lost:
        replica_ended(ex, lr)
    for job_id in {key[0] for key in ex.attempts}:
        sync_job(ex, job_id)
    ex.save_records()


async def _forget_once_reported(ex: Executor, reports: list[Awaitable[bool]]) -> None:
    if all(await asyncio.gather(*reports)):
        forget_stopped(ex.data_dir)


def _reconcile_job(
    ex: Executor,
    job: JobWork,
    recorded: dict[RecordKey, ProcessRecord],
    stopped: StoppedAttempt | None = None,
) -> list[LocalReplica]:
    """Take up this node's replicas of one live job; returns those to report: the lost ones,
    or, with `stopped` (the attempt the last shut down stopped here), all of them, none
    started again."""
    announce = job.held[0].node == ex.node and job.phase == "starting" and stopped is None
    first = next(i for i, r in enumerate(job.held) if r.node == ex.node)
    att = ex.attempt(job.job_id, job.attempt, ex.work.scheduled.get(job.job_id), announce, first)
    lost: list[LocalReplica] = []
    for index, replica in enumerate(job.held):
        if replica.node != ex.node:
            continue
        record = recorded.pop((job.job_id, job.attempt, replica), None)
        launch = launch_of(ex, job, index, replica)
        lr = ex.add(att, index, replica)
        if record is not None:
            att.baseline_mtime = record.checkpoint_mtime
            lr.workload = ex.runtime.adopt(record)
            lr.token = record.token
            ex.logger.info(
                "adopted",
                job=job.job_id,
                attempt=job.attempt,
                replica=index,
                pid=record.pid,
                alive=lr.workload.alive(),
            )
            ex.spawn(run_replica(ex, lr, None))
            if stopped is not None:
                lost.append(lr)
        elif (workload := ex.runtime.adopt_unrecorded(launch)) is not None:
            lr.workload = workload
            ex.spawn(run_replica(ex, lr, None))
            if stopped is not None:
                lost.append(lr)
        elif stopped is not None:
            lr.end(None)  # stopped for the shut down, and its record gone with it
            lost.append(lr)
        elif job.phase == "starting":
            ex.logger.info("starting what was placed while down", job=job.job_id)
            ex.spawn(run_replica(ex, lr, launch))
        else:
            ex.logger.warning(
                "no record of a replica the log says runs here: lost",
                job=job.job_id,
                attempt=job.attempt,
                replica=index,
            )
            lr.end(None)
            lost.append(lr)
    att.checkpoints, att.last_checkpoint = ex.work.checkpoints_of(job.job_id, job.attempt)
    if announce:
        ex.spawn(announce_started(ex, att))
    return lost
