"""The one place a cycle's decisions become events: placements, nominations and stop requests.

Each decision's id derives from its inputs (a restarted scheduler that decides the same thing
again publishes the same ids, which the log drops as duplicates), and each carries the time and
the log position (`basis_seq`) it was decided on. Every site that decides appends here, in the
order the events must be written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from events import (
    Event,
    JobNominated,
    JobPreemptionRequested,
    JobScheduled,
    PreemptionFacts,
    Replica,
)
from events.catalogue import PreemptionReason
from events.model import UsageFacts
from policy import decision_ids
from policy.state import Job

#: Placements carry the scheduler as actor.
ACTOR: Final = "scheduler"
#: Preemption decisions (nominations and the stop requests they cause) carry their own actor.
PREEMPTOR: Final = "preemptor"


class Decisions:
    """A cycle's decisions, as events in the order they must be written."""

    __slots__ = ("basis_seq", "events", "now")

    def __init__(self, basis_seq: int, now: float, events: list[Event] | None = None) -> None:
        self.basis_seq = basis_seq
        self.now = now
        self.events: list[Event] = events if events is not None else []

    def place(  # noqa: PLR0913 (a placement names all of these)
        self,
        job: Job,
        pool: str,
        replicas: Sequence[Replica],
        *,
        holds: int | None = None,
        note: str = "",
        history: UsageFacts | None = None,
    ) -> JobScheduled:
        """Start the job's minimum (a new attempt), or with `holds` (the replicas it will then
        hold) add replicas to the attempt its minimum started, maybe in this very cycle."""
        attempt, event_id = decision_ids.placement(job, holds)
        event = JobScheduled(
            id=event_id,
            time=self.now,
            actor=ACTOR,
            job_id=job.id,
            attempt=attempt,
            pool=pool,
            replicas=tuple(replicas),
            scale_up=holds is not None,
            note=note,
            basis_seq=self.basis_seq,
            history=history,
        )
        self.events.append(event)
        return event

    def nominate(  # noqa: PLR0913 (a nomination names all of these)
        self,
        job: Job,
        pool: str,
        replicas: Sequence[Replica],
        victims: tuple[str, ...],
        reason: PreemptionReason,
        history: UsageFacts | None,
    ) -> JobNominated:
        """Hold GPUs for the job while its victims (if any) give them back."""
        event = JobNominated(
            id=decision_ids.nomination(job),
            time=self.now,
            actor=PREEMPTOR,
            job_id=job.id,
            pool=pool,
            replicas=tuple(replicas),
            victims=victims,
            reason=reason,
            basis_seq=self.basis_seq,
            history=history,
        )
        self.events.append(event)
        return event

    def preempt(
        self,
        victim: Job,
        nomination: JobNominated,
        replicas: int,
        remaining: int,
        facts: PreemptionFacts,
    ) -> JobPreemptionRequested:
        """Ask a victim to stop `replicas` replicas (0: all of it) for the nominee, leaving it
        `remaining`."""
        event = JobPreemptionRequested(
            id=decision_ids.stop(victim, remaining),
            time=self.now,
            actor=PREEMPTOR,
            causation=nomination.id,
            job_id=victim.id,
            attempt=victim.attempt,
            reason=nomination.reason,
            replicas=replicas,
            for_job=nomination.job_id,
            facts=facts,
            basis_seq=self.basis_seq,
        )
        self.events.append(event)
        return event

    def stop(self, job: Job, reason: PreemptionReason) -> JobPreemptionRequested:
        """Ask a job to stop for a reason of its own (paused, cancelled, lost or drained)."""
        event = JobPreemptionRequested(
            id=f"{job.id}/{job.attempt}/stop/{reason}",
            time=self.now,
            actor=PREEMPTOR,
            job_id=job.id,
            attempt=job.attempt,
            reason=reason,
            basis_seq=self.basis_seq,
        )
        self.events.append(event)
        return event
