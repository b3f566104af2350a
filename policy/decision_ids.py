"""The ids of the policy's decisions, and which refused decision would be made again under
its own id.

Ids derive from their inputs, so that a decision made twice (two leaders, a retry) is stored
once: the stream drops an id it holds already (its duplicate window, two minutes). A decision
the fold refused (decided on a view the log has moved past) and made again under the same id
was dropped the same way, and the job did not move for those two minutes. So the fold counts
such a refusal (`Job.refusals`), once, and the next decision's id ends with the count.
"""

from __future__ import annotations

from typing import Final

from events import JobNominated, JobPreemptionRequested, JobScheduled
from policy.records import Job

_PLACED: Final = frozenset({"starting", "running"})


def after_refusals(job: Job) -> str:
    """The end of the id of a decision about `job`: its refusals counted, if any."""
    return f"/r{job.refusals}" if job.refusals else ""


def placement(job: Job, holds: int | None) -> tuple[int, str]:
    """The attempt and id of the job's next placement: its minimum (a new attempt), or with
    `holds` (the replicas it will then hold) more replicas for the attempt its minimum
    started, maybe in this very cycle."""
    if holds is None:
        attempt = job.attempt + 1
        return attempt, f"{job.id}/{attempt}/scheduled{after_refusals(job)}"
    attempt = job.attempt if job.phase in _PLACED else job.attempt + 1
    # surplus replicas may be taken back and granted again within one attempt: the preemption
    # count keeps the id of a later grant apart from an earlier one
    return attempt, f"{job.id}/{attempt}/scale/{holds}-{job.preemptions}{after_refusals(job)}"


def nomination(job: Job) -> str:
    return f"{job.id}/nominate/{job.nominations + 1}{after_refusals(job)}"


def stop(victim: Job, remaining: int) -> str:
    """A stop that makes room, leaving the victim `remaining` replicas. The preemption count
    keeps a later stop of as many replicas (surplus taken back, granted again, taken back
    again) apart from an earlier one."""
    return (
        f"{victim.id}/{victim.attempt}/preempt/{remaining}-{victim.preemptions}"
        f"{after_refusals(victim)}"
    )


def made_again(job: Job, event: JobScheduled | JobNominated | JobPreemptionRequested) -> bool:
    """Would the policy give the job's next decision of this kind the refused `event`'s id?
    Not for a repeat of a decision that was applied (the job has moved on: a new attempt, one
    more nomination, the stop it asked for), nor for one made on an older count."""
    if isinstance(event, JobScheduled):
        holds = len(job.held) + len(event.replicas) if event.scale_up else None
        return event.id == placement(job, holds)[1]
    if isinstance(event, JobNominated):
        return event.id == nomination(job)
    if event.for_job is None or event.id == job.stop_id:
        return False  # a stop for the job's own reason is made again only for a new attempt
    remaining = event.id.removeprefix(f"{job.id}/{job.attempt}/preempt/").split("-", 1)[0]
    return remaining.isdigit() and event.id == stop(job, int(remaining))
