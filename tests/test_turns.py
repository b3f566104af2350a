"""Turn order: a project's candidates are put in job order without a key tuple for each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from policy.candidates import Candidate
from policy.state import Job
from policy.turns import grouped_in_job_order, in_job_order, job_key


@dataclass
class _Job:
    """What a candidate and its job key read of a job."""

    seq: int
    priority: int
    min_replicas: int
    project: str
    preemptible: bool = True
    gpus: int = 1
    node: str | None = None
    preemption_delay_s: float = 0.0


@st.composite
def candidates(draw: st.DrawFn, many_projects: bool = False) -> list[Candidate]:
    """Minimums and extra replicas of a few priorities, in any order (submission orders
    repeated too: the sort must be stable), or in submission order."""
    found = []
    for _ in range(draw(st.integers(0, 30))):
        job = _Job(
            seq=draw(st.integers(0, 12)),
            priority=draw(st.sampled_from([-5, 50, 75, 100])),
            min_replicas=draw(st.integers(1, 3)),
            project=draw(st.sampled_from(["p", "q"])) if many_projects else "p",
        )
        extra = draw(st.booleans())
        before = job.min_replicas + draw(st.integers(0, 2)) if extra else 0
        found.append(Candidate(cast(Job, job), 1, extra=extra, before=before, ports=()))
    if draw(st.booleans()):  # as the candidate search gives them, mostly: no bucket is sorted
        found.sort(key=lambda c: c.seq)
    return found


@given(candidates())
def test_candidates_in_job_order_are_sorted_by_their_job_keys(cands: list[Candidate]) -> None:
    expected = sorted(cands, key=job_key)
    assert [id(c) for c in in_job_order(list(cands))] == [id(c) for c in expected]


@given(candidates(many_projects=True))
def test_each_projects_candidates_come_in_job_order(cands: list[Candidate]) -> None:
    grouped = grouped_in_job_order(list(cands))
    assert sorted(grouped) == sorted({c.project for c in cands})
    for project, found in grouped.items():
        expected = sorted((c for c in cands if c.project == project), key=job_key)
        assert [id(c) for c in found] == [id(c) for c in expected]
