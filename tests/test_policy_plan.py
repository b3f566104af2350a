"""The plan one cycle returns: decisions with their basis, and why each pending job waits."""

from __future__ import annotations

import gc

from bench.policy_cycle import NOW, Size, build
from events import (
    JobAdmitted,
    JobNominated,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    ProjectConfigured,
    ProjectTerms,
    Replica,
    SchedulingHeld,
)
from policy.cycle import decide
from policy.state import ClusterState


def cluster(gpus: int = 4, quota: int = 4, limit: int | None = None) -> ClusterState:
    state = ClusterState()
    state.apply(NodeRegistered(id="n0", time=0, actor="t", node="n0", pool="p", gpus=gpus))
    terms = {"p": ProjectTerms(quota=quota, limit=limit)}
    state.apply(ProjectConfigured(id="a", time=0, actor="t", project="a", terms=terms))
    return state


def admit(
    state: ClusterState, job: str, gpus: int, replicas: int = 1, project: str = "a", **kw: object
) -> None:
    minimum = int(kw.pop("min_replicas", replicas))  # type: ignore[call-overload]
    spec = JobSpec(project)
    state.apply(JobSubmitted(id=f"{job}/s", time=0, actor="t", job_id=job, spec=spec))
    state.apply(
        JobAdmitted(
            id=f"{job}/a",
            time=0,
            actor="t",
            job_id=job,
            project=project,
            priority=50,
            preemptible=True,
            gpus=gpus,
            replicas=replicas,
            min_replicas=minimum,
            pools=("p",),
            **kw,  # type: ignore[arg-type]
        )
    )


def nominate(state: ClusterState, job: str, replicas: tuple[Replica, ...]) -> None:
    """GPUs held for the job (by a reclaim whose victims have let go already)."""
    state.apply(
        JobNominated(
            id=f"{job}/nominate/1",
            time=0,
            actor="t",
            job_id=job,
            pool="p",
            replicas=replicas,
            victims=(),
            reason="reclaim",
        )
    )


def test_every_decision_carries_the_position_it_was_decided_on() -> None:
    state = cluster()
    admit(state, "j", 2)
    plan = decide(state, 1.0)
    assert plan.basis_seq == state.position == state.events_applied
    assert [(e.job_id, e.basis_seq) for e in plan.placements] == [("j", state.position)]


def test_a_nominee_that_starts_takes_its_turn_for_extras_in_the_same_cycle() -> None:
    """Rule 6: an elastic job starting on the GPUs held for it is granted its extras on idle
    GPUs in that very cycle, not one cycle later."""
    state = cluster()
    admit(state, "e", 1, replicas=3, min_replicas=1)
    nominated = (Replica("n0", (0,)),)
    nominate(state, "e", nominated)
    plan = decide(state, 1.0)
    placed = [(e.replicas, e.scale_up) for e in plan.events if isinstance(e, JobScheduled)]
    assert placed[0] == (nominated, False)
    assert [scale_up for _, scale_up in placed[1:]] == [True, True]
    assert plan.waiting == {}


def test_a_nominee_that_starts_is_not_waiting_though_an_extra_does_not_fit() -> None:
    """Only jobs still pending after the cycle wait: one that starts on the GPUs held for it
    is not listed, even when an extra replica it asks for has no room."""
    state = cluster(gpus=2)
    admit(state, "e", 1, replicas=4, min_replicas=1)
    nominate(state, "e", (Replica("n0", (0,)),))
    plan = decide(state, 1.0)
    assert [e.scale_up for e in plan.placements] == [False, True]  # one extra fits of three
    assert plan.waiting == {}


def run(state: ClusterState, job: str, replicas: tuple[Replica, ...]) -> None:
    for event in (
        JobScheduled(
            id=f"{job}/p", time=0, actor="t", job_id=job, attempt=1, pool="p", replicas=replicas
        ),
        JobStarted(id=f"{job}/r", time=0, actor="t", job_id=job, attempt=1),
    ):
        state.apply(event)


def test_an_extra_that_finds_no_room_after_one_is_placed_reclaims_in_that_cycle() -> None:
    """Rule 6 and rule 5: a running elastic job's next extra replica, queued once one is
    placed on idle GPUs, takes its turn in the same cycle's preemption pass, as every
    candidate left waiting does."""
    state = cluster(gpus=3, quota=3)
    terms = {"p": ProjectTerms(quota=0)}
    state.apply(ProjectConfigured(id="b", time=0, actor="t", project="b", terms=terms))
    admit(state, "lender", 1, project="b")
    run(state, "lender", (Replica("n0", (2,)),))
    admit(state, "e", 1, replicas=3, min_replicas=1)
    run(state, "e", (Replica("n0", (0,)),))
    plan = decide(state, 1.0)
    placed = [(e.job_id, e.replicas, e.scale_up) for e in plan.placements]
    assert placed == [("e", (Replica("n0", (1,)),), True)]
    assert [(e.job_id, e.reason) for e in plan.stops] == [("lender", "reclaim")]
    assert [(e.job_id, e.replicas) for e in plan.nominations] == [("e", (Replica("n0", (2,)),))]


def test_why_pending_jobs_wait() -> None:
    state = cluster(gpus=4, quota=0, limit=5)
    admit(state, "huge", 8)  # no pool could hold it (a hand-made log: admission refuses it)
    admit(state, "first", 2)
    admit(state, "capped", 4)  # 2 + 4 > the limit of 5
    admit(state, "second", 3)  # within the limit, but only 2 GPUs are left
    plan = decide(state, 1.0)
    assert plan.waiting == {"huge": "no_pool", "capped": "limit", "second": "no_fit"}
    state.apply(SchedulingHeld(id="hold", time=1, actor="t", held=True))
    assert set(decide(state, 2.0).waiting.values()) == {"held"}


def test_a_project_is_ranked_with_its_next_job_even_if_it_does_not_fit() -> None:
    """Rule 2: a's next job in job order is `big` (priority 75, 4 GPUs), which does not fit the
    2 idle GPUs; a is still ranked with it: 0 + 4 > quota 1, not within quota, so b (0 + 2 >
    quota 1 too, but 2/1 < 4/1 of its share) goes first and takes the 2 GPUs. Ranking a with
    `small` instead (within quota) would have served a first."""
    state = cluster(gpus=4, quota=1)
    terms = {"p": ProjectTerms(quota=1)}
    state.apply(ProjectConfigured(id="b", time=0, actor="t", project="b", terms=terms))
    terms = {"p": ProjectTerms(quota=2)}
    state.apply(ProjectConfigured(id="c", time=0, actor="t", project="c", terms=terms))
    for job, project, gpus, priority in (
        ("held", "c", 2, 125),
        ("big", "a", 4, 75),
        ("small", "a", 1, 50),
        ("bjob", "b", 2, 50),
    ):
        state.apply(
            JobSubmitted(id=f"{job}/s", time=0, actor="t", job_id=job, spec=JobSpec(project))
        )
        state.apply(
            JobAdmitted(
                id=f"{job}/a",
                time=0,
                actor="t",
                job_id=job,
                project=project,
                priority=priority,
                preemptible=priority < 100,
                gpus=gpus,
                replicas=1,
                min_replicas=1,
                pools=("p",),
            )
        )
        if job == "held":
            state.apply_all(decide(state, 0.0).events)
    assert [e.job_id for e in decide(state, 1.0).placements] == ["bjob"]


def test_a_cycle_leaves_nothing_for_the_collector() -> None:
    """Everything a cycle makes is freed when `decide` returns: nothing it made refers back
    to itself. (The reclaim's lists and reach refer to their pool's cycle; a loop left every
    candidate and victim of the cycle for the collector's full pass, which walked them all.)"""
    state = build(Size(nodes=40, running=200, pending=400)).state
    plan = decide(state, NOW)
    assert any(isinstance(e, JobNominated) and e.victims for e in plan.events)  # it reclaims
    gc.collect()
    gc.disable()
    try:
        decide(state, NOW)
        assert gc.collect() == 0
    finally:
        gc.enable()
