"""Job commands: submit, cancel, pause, resume and a new priority."""

from __future__ import annotations

from events import JobCancelled, JobPaused, JobPriorityChanged, JobResumed, JobSubmitted, ids
from events.commands import CancelJob, PauseJob, ResumeJob, SetJobPriority, SubmitJob
from policy.commands.admission import admit
from policy.commands.names import name_problem
from policy.commands.outcome import Accepted, Outcome, Refused, refuse
from policy.state import FINAL_PHASES, ClusterState, Job

#: Phases a job can be paused from: it is admitted and not yet paused or ended.
PAUSABLE = frozenset({"pending", "starting", "running", "stopping"})


def submit(state: ClusterState, command: SubmitJob, now: float, at: int) -> Outcome:
    """Record the submission and admission's verdict on it (`policy.admission.admit`)."""
    job_id = command.job_id
    problem = name_problem("job id", "job_id", job_id)
    if problem is not None:
        return problem
    known = state.jobs.get(job_id)
    if known is not None and known.phase != "rejected":
        return refuse("name_taken", "job_id", job_id)
    # a rejected job's name may be used again: a new submission, told apart by the position
    # of the rejection it follows
    after = known.rejected_at if known is not None else 0
    submitted = JobSubmitted(
        id=ids.submitted(job_id, after),
        time=now,
        actor=command.actor,
        job_id=job_id,
        spec=command.spec,
        idempotency_key=command.idempotency_key,
    )
    return Accepted((submitted, admit(state, submitted, now, after)))


def cancel(state: ClusterState, command: CancelJob, now: float, at: int) -> Outcome:
    job = state.jobs.get(command.job_id)
    if job is None:
        return _unknown(command.job_id)
    if job.phase in FINAL_PHASES:
        return _wrong_phase(job, "cancelled")
    return Accepted(
        (JobCancelled(id=ids.cancelled(job.id), time=now, actor=command.actor, job_id=job.id),)
    )


def pause(state: ClusterState, command: PauseJob, now: float, at: int) -> Outcome:
    job = state.jobs.get(command.job_id)
    if job is None:
        return _unknown(command.job_id)
    if job.phase not in PAUSABLE:
        return _wrong_phase(job, "paused")
    event = JobPaused(id=ids.paused(job.id, at), time=now, actor=command.actor, job_id=job.id)
    return Accepted((event,))


def resume(state: ClusterState, command: ResumeJob, now: float, at: int) -> Outcome:
    job = state.jobs.get(command.job_id)
    if job is None:
        return _unknown(command.job_id)
    if job.phase != "paused":
        return _wrong_phase(job, "resumed")
    event = JobResumed(id=ids.resumed(job.id, at), time=now, actor=command.actor, job_id=job.id)
    return Accepted((event,))


def set_priority(state: ClusterState, command: SetJobPriority, now: float, at: int) -> Outcome:
    job = state.jobs.get(command.job_id)
    if job is None:
        return _unknown(command.job_id)
    if job.phase in FINAL_PHASES or job.phase in ("submitted", "rejected"):
        return _wrong_phase(job, "given a new priority")
    if job.priority == command.priority:
        return refuse("no_change", "priority", job.id, priority=job.priority)
    event = JobPriorityChanged(
        id=ids.priority_changed(job.id, at),
        time=now,
        actor=command.actor,
        job_id=job.id,
        priority=command.priority,
    )
    return Accepted((event,))


def admit_waiting(state: ClusterState, job: Job, now: float) -> Accepted | None:
    """The verdict for a job recorded as submitted that never got one (admission stopped
    between the two writes); None if the job has its verdict."""
    if job.phase != "submitted":
        return None
    submitted = JobSubmitted(
        id=ids.submitted(job.id, job.resubmitted_after),
        time=job.submitted_at,
        actor="admission",
        job_id=job.id,
        spec=job.spec,
    )
    return Accepted((admit(state, submitted, now, job.resubmitted_after),))


def _unknown(job_id: str) -> Refused:
    return refuse("not_found", "job_id", job_id)


def _wrong_phase(job: Job, done: str) -> Refused:
    return refuse("wrong_phase", None, job.id, done=done, phase=job.phase)
