"""Turn order: a project's candidates are put in job order without a key tuple for each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from policy.accounts import Account, Accounts
from policy.candidates import Candidate
from policy.state import Job
from policy.turns import Turns, grouped_in_job_order, in_job_order, job_key


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


class _Book:
    """The accounts `Turns` reads: each project's key depends on its usage and terms."""

    def __init__(self, accounts: dict[str, Account]) -> None:
        self.accounts = accounts

    def account(self, project: str) -> Account:
        return self.accounts[project]


@dataclass
class _Sleepers:
    """Able candidates, and projects that wake (for good) once so many turns were given."""

    able: set[Candidate]
    wakes_after: dict[str, int]
    given: int = 0

    def asleep(self, project: str) -> bool:
        return self.given < self.wakes_after.get(project, 1 << 30)


@st.composite
def turns_case(draw: st.DrawFn) -> tuple[_Book, list[Candidate], _Sleepers]:
    projects = ["p", "q", "r"]
    book = _Book(
        {
            name: Account(
                project=name,
                order=i,
                quota=draw(st.integers(0, 6)),
                weight=1,
                limit=1 << 20,
                priority=draw(st.sampled_from([50, 100])),
                usage=draw(st.integers(0, 8)),
                fair_share=draw(st.integers(0, 8)),
            )
            for i, name in enumerate(projects)
        }
    )
    cands = []
    for seq in range(draw(st.integers(0, 40))):
        job = _Job(
            seq=seq,
            priority=draw(st.sampled_from([50, 75])),
            min_replicas=1,
            project=draw(st.sampled_from(projects)),
            gpus=draw(st.sampled_from([1, 1, 2, 4])),
        )
        cands.append(Candidate(cast(Job, job), 1, ports=()))
    able = {c for c in cands if draw(st.integers(0, 4)) == 0}
    wakes = draw(st.dictionaries(st.sampled_from(projects), st.integers(0, 20), max_size=3))
    return book, cands, _Sleepers(able, wakes)


@given(turns_case())
def test_turns_pass_over_sleepers_as_if_each_had_its_turn(
    case: tuple[_Book, list[Candidate], _Sleepers],
) -> None:
    """Passing over a project's idle candidates in runs gives the candidates that may act in
    the order the plain turns give them, leaving out exactly those the plain turns give while
    they are idle and their project asleep (nothing happens in such a turn). Passing over a
    run must stop where the project's key with the next candidate's size no longer comes
    first: a run passed over whole gives a project its later turns too early."""
    book, cands, sleepers = case
    expected = []
    for cand in Turns(cast(Accounts, book), list(cands)):
        if cand in sleepers.able or not sleepers.asleep(cand.project):
            expected.append(cand)
            sleepers.given += 1
    sleepers.given = 0
    found = []
    for cand in Turns(cast(Accounts, book), list(cands), sleepers):
        found.append(cand)
        sleepers.given += 1
    assert [id(c) for c in found] == [id(c) for c in expected]
