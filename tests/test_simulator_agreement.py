"""The simulator and the policy agree: a workload run through `fairlane simulate` makes exactly
the decisions that feeding the same events, step by step, to `policy.cycle.decide` makes.

The reference below is written from the policy's contract alone: a fold (`ClusterState`), the
admission function, `decide` until it returns nothing, and executors that start at once, stop
at once when asked, and finish a job `duration` after its attempt starts (no checkpoints, so
a preempted job starts over). It shares no code with the simulator or the virtual cluster.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from events import (
    CheckpointModel,
    ClusterConfigured,
    ClusterSettings,
    Event,
    JobCompleted,
    JobNominated,
    JobPreempted,
    JobPreemptionRequested,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    PoolConfigured,
    ProjectConfigured,
    SchedulerSettings,
)
from events.model import VictimOrder
from policy.commands.admission import admit
from policy.cycle import decide
from policy.state import ClusterState
from simulation.trace.cluster import uniform_cluster
from simulation.trace.policies import PolicyName, make_policy
from simulation.trace.run import Options, Simulation
from simulation.trace.traces import TraceJob
from simulation.trace.workload import SimJob

DECISIONS = (JobScheduled, JobPreemptionRequested, JobNominated)
NODES, GPUS = 3, 4


def workload(seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(40):
        t += rng.choice([0, 0, 15, 60, 200])
        jobs.append(
            TraceJob(
                job_id=f"j{i}",
                submit_s=t,
                duration_s=rng.choice([30, 120, 400, 1500]),
                gpus=rng.choice([1, 1, 2, 4, 8]),
                project=rng.choice(["a", "a", "b", "c"]),
                priority=rng.choice([0, 0, 5]),
            )
        )
    return jobs


def reference(
    jobs: list[TraceJob], sim: Simulation, scheduler: SchedulerSettings, preemptible: bool
) -> list[Event]:
    state = ClusterState()
    setup: list[Event] = [
        ClusterConfigured(id="c", time=0, actor="t", settings=ClusterSettings(scheduler=scheduler)),
        PoolConfigured(id="p", time=0, actor="t", pool="default"),
    ]
    setup += [
        NodeRegistered(id=f"n{i}", time=0, actor="t", node=f"n{i}", pool="default", gpus=GPUS)
        for i in range(NODES)
    ]
    setup += [
        ProjectConfigured(id=f"pr-{p}", time=0, actor="t", project=p, terms=terms)
        for p, terms in sim.workload.projects.items()
    ]
    state.apply_all(setup)
    shaped = {j.job_id: j for j in sim.workload.jobs}
    decisions: list[Event] = []
    finish: dict[str, float] = {}  # running job -> when it is done

    def settle(now: float) -> None:
        while out := decide(state, now).events:
            for e in out:
                state.apply(e)
                decisions.append(e)
                if isinstance(e, JobScheduled):
                    state.apply(
                        JobStarted(
                            id=f"{e.id}/s",
                            time=now,
                            actor="t",
                            job_id=e.job_id,
                            attempt=e.attempt,
                            resumed=e.attempt > 1,
                        )
                    )
                    finish[e.job_id] = now + shaped[e.job_id].duration_s
                elif isinstance(e, JobPreemptionRequested):
                    state.apply(
                        JobPreempted(
                            id=f"{e.id}/p",
                            time=now,
                            actor="t",
                            job_id=e.job_id,
                            attempt=e.attempt,
                            reason=e.reason,
                            replicas=e.replicas,
                        )
                    )
                    del finish[e.job_id]

    def finish_until(end: float) -> None:
        while finish and (t := min(finish.values())) <= end:
            done = sorted((state.jobs[j].seq, j) for j, f in finish.items() if f == t)
            for _, job_id in done:
                state.apply(
                    JobCompleted(
                        id=f"{job_id}/done",
                        time=t,
                        actor="t",
                        job_id=job_id,
                        attempt=state.jobs[job_id].attempt,
                    )
                )
                del finish[job_id]
            settle(t)

    now = 0.0
    for t, group in arrivals(list(shaped.values())):
        settle(now)
        finish_until(t)
        now = t
        for job in group:
            priority = 0 if job.priority is None or not preemptible else job.priority
            spec = JobSpec(
                project=job.project,
                priority=priority,
                preemptible=preemptible,
                gpus=job.gpus,
                replicas=job.replicas,
                duration_s=job.duration_s,
            )
            submitted = JobSubmitted(
                id=f"{job.job_id}/sub", time=t, actor="t", job_id=job.job_id, spec=spec
            )
            state.apply(submitted)
            state.apply(admit(state, submitted, t))
    settle(now)
    finish_until(float("inf"))
    return decisions


def arrivals(jobs: list[SimJob]) -> Iterator[tuple[float, list[SimJob]]]:
    i = 0
    while i < len(jobs):
        t = jobs[i].submit_s
        group = [j for j in jobs[i:] if j.submit_s == t]
        i += len(group)
        yield t, group


@pytest.mark.parametrize(
    ("policy", "order", "seed"),
    [
        ("fair_share", "newest", 1),
        ("fair_share", "cost", 2),
        ("fair_share", "newest", 3),
        ("priority", "newest", 4),
        ("fifo", "newest", 5),
    ],
)
def test_simulator_decides_as_the_policy_does(
    policy: PolicyName, order: VictimOrder, seed: int
) -> None:
    jobs = workload(seed)
    options = Options(policy=make_policy(policy), victim_order=order, checkpoint=None)
    sim = Simulation(jobs, uniform_cluster(NODES, GPUS), options, keep_log=True)
    outcome = sim.run()
    assert outcome.summary.jobs_completed == len(jobs)
    simulated = [e for e in sim.vc.log if isinstance(e, DECISIONS)]
    settings = SchedulerSettings(make_policy(policy).scheduler, victim_order=order)
    expected = reference(jobs, sim, settings, preemptible=policy != "fifo")
    assert simulated == expected
    if policy != "fifo":
        assert any(isinstance(e, JobPreemptionRequested) for e in expected), "no preemption"


@pytest.mark.parametrize("seed", [6, 7])
def test_checkpoints_need_no_cycle_of_their_own_with_newest_victims(seed: int) -> None:
    """The simulator records checkpoints without running a cycle for them; with newest-first
    victims that changes no decision (only cost-aware victim choice reads checkpoints)."""
    jobs = workload(seed)
    runs = []
    for cycle_on_checkpoint in (True, False):
        options = Options(
            policy=make_policy("fair_share"),
            checkpoint=CheckpointModel(every_s=100, save_s=5, restore_s=20),
            cycle_on_checkpoint=cycle_on_checkpoint,
        )
        sim = Simulation(jobs, uniform_cluster(NODES, GPUS), options, keep_log=True)
        sim.run()
        runs.append([e for e in sim.vc.log if isinstance(e, DECISIONS)])
    assert runs[0] == runs[1]
    assert any(isinstance(e, JobPreemptionRequested) for e in runs[0])
