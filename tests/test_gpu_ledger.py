"""The independent GPU ledger the crash tests audit with catches what the fold would hide."""

from __future__ import annotations

from events import JobCompleted, JobPreempted, JobScheduled, JobStarted, NodeLost, Replica
from tests.process_cluster import GpuLedger


def placed(job: str, attempt: int, *replicas: Replica) -> list[object]:
    return [
        JobScheduled(
            id=f"{job}/{attempt}",
            time=0,
            actor="t",
            job_id=job,
            attempt=attempt,
            pool="p",
            replicas=replicas,
        ),
        JobStarted(id=f"{job}/{attempt}/s", time=0, actor="t", job_id=job, attempt=attempt),
    ]


def problems(events: list[object]) -> list[str]:
    ledger = GpuLedger()
    found: list[str] = []
    for e in events:
        found += ledger.apply(e)  # type: ignore[arg-type]
    return found


def test_two_running_attempts_on_one_gpu_are_reported() -> None:
    events = placed("a", 1, Replica("n0", (0, 1))) + placed("b", 1, Replica("n0", (1, 2)))
    assert problems(events) == ["GPU n0:1 held by a and b"]


def test_gpus_given_back_may_be_used_again() -> None:
    events = [
        *placed("a", 1, Replica("n0", (0, 1))),
        JobPreempted(id="a/1/p", time=0, actor="t", job_id="a", attempt=1, reason="reclaim"),
        *placed("b", 1, Replica("n0", (0, 1))),
        JobCompleted(id="b/1/c", time=0, actor="t", job_id="b", attempt=1),
        *placed("a", 2, Replica("n0", (1,))),
        NodeLost(id="lost", time=0, actor="t", node="n0"),
        *placed("c", 1, Replica("n0", (1,))),
    ]
    assert problems(events) == []


def test_a_placement_never_started_holds_nothing() -> None:
    events = [
        JobScheduled(
            id="a/1",
            time=0,
            actor="t",
            job_id="a",
            attempt=1,
            pool="p",
            replicas=(Replica("n0", (0,)),),
        ),
        *placed("b", 1, Replica("n0", (0,))),
    ]
    assert problems(events) == []
