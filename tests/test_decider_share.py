"""What each decider publishes of a plan it shares with the other (`decider.publishable`):
its own decisions, in the plan's order, but not before the other's it counts on."""

from __future__ import annotations

from events import Event, JobNominated, JobPreemptionRequested, JobScheduled, Replica
from services.runtime.decider import publishable

N0 = (Replica(node="n0", gpus=(0, 1, 2, 3)),)


def placed(job: str) -> JobScheduled:
    return JobScheduled(
        id=f"{job}/1/scheduled", time=0.0, actor="scheduler", job_id=job, attempt=1,
        pool="p", replicas=N0,
    )  # fmt: skip


def nominated(job: str, victim: str) -> list[Event]:
    nomination = JobNominated(
        id=f"{job}/nominate/2", time=0.0, actor="preemptor", job_id=job, pool="p",
        replicas=N0, victims=(victim,), reason="priority",
    )  # fmt: skip
    stop = JobPreemptionRequested(
        id=f"{victim}/1/preempt/0-0", time=0.0, actor="preemptor", job_id=victim, attempt=1,
        reason="priority", for_job=job, causation=nomination.id,
    )  # fmt: skip
    return [nomination, stop]


def places(e: Event) -> bool:
    return isinstance(e, JobScheduled)


def preempts(e: Event) -> bool:
    return isinstance(e, JobNominated | JobPreemptionRequested)


def test_the_extras_of_a_job_the_plan_starts_wait_for_its_start_to_land() -> None:
    # big starts on the GPUs held for it, and its extra replica is nominated in the same cycle
    plan = [placed("big"), *nominated("big", "low1"), *nominated("other", "low3")]
    assert publishable(plan, places) == [plan[0]]
    # its nomination, the stop it causes and every preemption decision after it: the next
    # cycle, once the start has landed (a later one may count on the GPUs they give back)
    assert publishable(plan, preempts) == []


def test_what_counts_on_nothing_of_the_other_deciders_goes_at_once() -> None:
    plan = [*nominated("other", "low3"), placed("small"), *nominated("big", "low1")]
    assert publishable(plan, preempts) == [plan[0], plan[1], plan[3], plan[4]]
    assert publishable(plan, places) == [plan[2]]
