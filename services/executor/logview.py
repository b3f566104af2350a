"""What an executor reads from the log: the fold, plus the few facts it does not keep."""

from __future__ import annotations

from events import Event, JobCheckpointed, JobPreempted, JobPreemptionRequested, JobScheduled
from events.model import Replica
from policy.state import ClusterState, Job


class LogView:
    """The fold (kept by the shared `Follower`), plus the few facts about the log that
    `ClusterState` does not keep and an executor needs after a restart: the preemption request
    in progress per job (its id names the `JobPreempted` that answers it), the `JobScheduled`
    that started the current attempt, and the checkpoints already reported. One view can serve
    many executors (`ExecutorGroup`). `note` is called with each event after the fold applied
    it."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.requests: dict[str, JobPreemptionRequested] = {}
        self.scheduled: dict[str, str] = {}
        #: job -> (attempt, JobCheckpointed events seen for it, latest of their times)
        self.checkpoints: dict[str, tuple[int, int, float]] = {}
        #: job -> nodes of the executors (sharing this view) that have replicas of it
        self.holders: dict[str, set[str]] = {}

    def note(self, event: Event) -> None:
        job_id = getattr(event, "job_id", None)
        if job_id is None:
            return
        job = self.state.jobs.get(job_id)
        if job is None:
            return
        match event:
            case JobScheduled(scale_up=False) if accepted(job, event):
                self.scheduled[job_id] = event.id
                self.requests.pop(job_id, None)
            case JobPreemptionRequested() if job.attempt == event.attempt and job.stop_replicas > 0:
                self.requests[job_id] = event
            case JobPreempted() if job.stop_replicas == 0:
                self.requests.pop(job_id, None)
            case JobCheckpointed() if event.attempt == job.attempt:
                attempt, n, last = self.checkpoints.get(job_id, (event.attempt, 0, 0.0))
                if attempt != event.attempt:
                    n, last = 0, 0.0
                self.checkpoints[job_id] = (event.attempt, n + 1, max(last, event.time))
        if job_id not in self.state.live:
            self.requests.pop(job_id, None)
            self.scheduled.pop(job_id, None)
            self.checkpoints.pop(job_id, None)

    def checkpoints_of(self, job_id: str, attempt: int) -> tuple[int, float]:
        seen = self.checkpoints.get(job_id)
        if seen is None or seen[0] != attempt:
            return 0, 0.0
        return seen[1], seen[2]


def accepted(job: Job, event: JobScheduled) -> bool:
    """Whether the fold applied this placement (it refuses one decided on a stale state)."""
    if event.attempt != job.attempt:
        return False
    if event.scale_up:
        return job.phase in ("starting", "running") and all(r in job.held for r in event.replicas)
    return job.phase == "starting" and job.held == list(event.replicas)


def desired(job: Job | None, attempt: int, replica: Replica) -> bool:
    """Whether the log says this replica of this attempt holds its GPUs (should run, or is
    still being stopped)."""
    return job is not None and job.attempt == attempt and replica in job.held
