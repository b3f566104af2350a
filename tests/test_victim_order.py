"""The order victims are taken in (rules 4, 5, 6 and 9 of docs/rules.md), against the rules.

`policy.victims.units_of` fills buckets by priority and kind, relying on the jobs coming in
submission order, instead of sorting by a key: here it is checked against that key, over
random jobs (elastic ones with extras, equal priorities, equal costs).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from events import JobSpec, Replica
from events.model import VictimOrder
from policy.state import Job
from policy.victims import lost_work_gpu_s, units_of

NOW = 1_000.0


@st.composite
def running_jobs(draw: st.DrawFn) -> list[Job]:
    """Running jobs in submission order (ascending `seq`, as `ClusterState.live` has them)."""
    jobs = []
    seqs = sorted(draw(st.sets(st.integers(0, 10_000), max_size=25)))
    for n, seq in enumerate(seqs):
        replicas = draw(st.integers(1, 4))
        minimum = draw(st.integers(1, replicas))
        holding = draw(st.integers(minimum, replicas))
        started = draw(st.sampled_from([100.0, 400.0, 900.0]))
        jobs.append(
            Job(
                id=f"j{n}",
                seq=seq,
                spec=JobSpec("a"),
                submitted_at=0.0,
                phase="running",
                priority=draw(st.sampled_from([0, 50, 50, 100])),
                gpus=draw(st.sampled_from([1, 2])),
                replicas=replicas,
                min_replicas=minimum,
                held=[Replica(f"n{n}", (i,)) for i in range(holding)],
                started_at=started,
                last_checkpoint_at=draw(st.sampled_from([None, started + 50.0])),
                save_s=draw(st.sampled_from([0.0, 10.0])),
            )
        )
    return jobs


def as_the_rule_says(jobs: list[Job], order: VictimOrder) -> list[tuple[str, bool]]:
    """Lowest priority first; extras before whole jobs; then the newest (`newest`), or the
    least lost work and then the newest (`cost`); a job's extras in turn."""

    def key(job: Job, extra: bool) -> tuple[float, ...]:
        kind = 0 if extra else 1
        if order == "cost":
            return (job.priority, kind, lost_work_gpu_s(job, NOW, 1 if extra else None), -job.seq)
        return (job.priority, kind, -job.seq)

    keyed = []
    for job in jobs:
        for i in range(job.active_replicas - job.min_replicas):
            keyed.append((key(job, True), i, (job.id, True)))
        keyed.append((key(job, False), 0, (job.id, False)))
    return [unit for *_, unit in sorted(keyed)]


@given(running_jobs(), st.sampled_from(["newest", "cost"]))
def test_victims_are_taken_in_the_order_the_rules_give(jobs: list[Job], order: VictimOrder) -> None:
    units = [(u.job.id, u.surplus) for u in units_of(jobs, order, NOW)]
    assert units == as_the_rule_says(jobs, order)
