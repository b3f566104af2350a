"""A cluster shut down's file: the attempts this node stopped, kept until they are reported.

An executor told to shut down its workloads on exit (`--shutdown-on-exit`, what `fairlane up`
starts; `fairlane down` stops the executors first, while the log and the services still run)
stops every replica the log wants running here as a preemption does (the planner, `plan.py`)
and reports each attempt `JobPreempted(reason="shutdown")`, so the fold queues it again and
`fairlane up` resumes it from its checkpoint; a shutdown is not a preemption to make room.

Before the first signal the executor writes which attempts it is stopping, and when, to
`shutdown.json` in its data folder. If a report does not reach the log (it went away first, or
the executor was killed during the grace period), the next executor on the node finds the
attempt still running in the log, its workload gone, and the file naming it: it reports the
stop then, with the time it was made, rather than a failure, and the job's running time ends
when it was stopped, not when the cluster came back.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

import msgspec

from services.executor.facts import AttemptKey

SHUTDOWN_FILE: Final = "shutdown.json"


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
