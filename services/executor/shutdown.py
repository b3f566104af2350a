"""A cluster shut down: the executor stops its jobs as a preemption does, and they come back.

An executor told to shut down its workloads on exit (`--shutdown-on-exit`, what `fairlane up`
starts; `fairlane down` stops the executors first, while the log and the services still run)
stops every replica the log wants running here: SIGTERM, the grace period, SIGKILL, the
checkpoints they saved stored, then `JobPreempted(reason="shutdown")` for each attempt (the
same id from every node of a gang: the stream keeps one). The fold takes that back to pending,
so `fairlane up` places the job again and it resumes from its checkpoint; a shutdown is not a
preemption to make room (not in `MAKES_ROOM`).

Before the first signal the executor writes which attempts it is stopping, and when, to
`shutdown.json` in its data folder. If a report does not reach the log (it went away first, or
the executor was killed during the grace period), the next executor on the node finds the
attempt still running in the log, its workload gone (its exit status says SIGTERM), and the
file naming it: it reports the stop then (`reconcile`), with the time it was made, rather than
a failure, and the job's running time ends when it was stopped, not when the cluster came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from services.executor.local import AttemptKey, LocalReplica
from services.executor.nodework import desired
from services.executor.stopping import StopReport, stop

if TYPE_CHECKING:
    from services.executor.executor import Executor

SHUTDOWN_FILE: Final = "shutdown.json"
#: How long a report is tried: `fairlane down` keeps the log up until the executors are gone,
#: so this only bounds an executor whose log went away (the next one reports it instead).
REPORT_WITHIN_S: Final = 10.0


class StoppedAttempt(msgspec.Struct, frozen=True):
    """An attempt this node's executor stopped for a shut down, and when it began."""

    job_id: str
    attempt: int
    at: float


def shutdown_file(data_dir: Path) -> Path:
    return data_dir / SHUTDOWN_FILE


def read_stopped(data_dir: Path) -> dict[AttemptKey, StoppedAttempt]:
    """The attempts the last shut down here stopped (none if there is no readable file)."""
    try:
        marks = msgspec.json.decode(shutdown_file(data_dir).read_bytes(), type=list[StoppedAttempt])
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return {}
    return {(m.job_id, m.attempt): m for m in marks}


def write_stopped(data_dir: Path, marks: list[StoppedAttempt]) -> None:
    """Written whole, then renamed: a half-written file is never read."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = shutdown_file(data_dir)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(msgspec.json.encode(marks))
    os.replace(tmp, path)


def forget_stopped(data_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        shutdown_file(data_dir).unlink()


def shutdown_report(job_id: str, attempt: int, at: float | None = None) -> StopReport:
    """The report of an attempt stopped for a shut down; `at`: when (None: as reported)."""
    return StopReport(
        id=f"{job_id}/{attempt}/shutdown",
        job_id=job_id,
        attempt=attempt,
        reason="shutdown",
        at=at,
        within=REPORT_WITHIN_S,
    )


async def shut_down(ex: Executor) -> None:
    """Stop every replica the log wants running here, as a preemption does, and report each
    attempt `JobPreempted(reason="shutdown")`; the mark file stays where a report failed."""
    if ex._work is None:  # never replayed: it started nothing
        return
    by_attempt: dict[AttemptKey, list[LocalReplica]] = {}
    for lr in ex.local_replicas():
        # one already being stopped (a preemption asked for) ends as that stop reports it
        if lr.ended or lr.stopping:
            continue
        if desired(ex.work.jobs.get(lr.job_id), lr.attempt, lr.replica):
            by_attempt.setdefault(lr.key, []).append(lr)
    if not by_attempt:
        return
    now = time.time()
    if ex.runtime.real:  # a hollow replica leaves nothing to find after a restart
        write_stopped(ex.data_dir, [StoppedAttempt(key[0], key[1], now) for key in by_attempt])
    ex.logger.info("shutting down: stopping the jobs here", jobs=sorted(k[0] for k in by_attempt))
    reported = await asyncio.gather(
        *(stop(ex, replicas, shutdown_report(*key)) for key, replicas in by_attempt.items())
    )
    if all(reported) and ex.runtime.real:
        forget_stopped(ex.data_dir)
