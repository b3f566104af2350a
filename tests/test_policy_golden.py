"""Golden decisions: `decide()` on seeded random states gives exactly the recorded answers.

This guards the policy's speed work: an optimisation must not change a single decision. Each
case is a seeded random cluster driven through random commands, with executors that answer late
(so states hold jobs starting, stopping, nominated), plus the benchmark's cluster at a small size
under each scheduler, fitting and victim order; every `decide()` output along the way is encoded
and hashed.

A deliberate change of the policy's semantics changes these hashes, and so does a change of how
the benchmark builds its cluster (the `bench-*` cases only: their input changed, not the policy).
Check that the change is meant, then record the new answers:

    FAIRLANE_UPDATE_GOLDEN=1 uv run pytest tests/test_policy_golden.py
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Iterator
from itertools import product
from pathlib import Path

import msgspec
import pytest

from bench.policy_cycle import NOW, Size, build
from events import (
    ClusterConfigured,
    ClusterSettings,
    Event,
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobPaused,
    JobPreempted,
    JobPreemptionRequested,
    JobPriorityChanged,
    JobResumed,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeLost,
    NodeRegistered,
    PoolConfigured,
    ProjectConfigured,
    ProjectTerms,
    SchedulerSettings,
)
from events.model import Fitting, SchedulerType, VictimOrder
from policy.commands.admission import admit
from policy.cycle import decide
from policy.state import ClusterState

GOLDEN = Path(__file__).parent / "golden" / "policy_decisions.json"
UPDATE = os.environ.get("FAIRLANE_UPDATE_GOLDEN") == "1"
SCHEDULERS: tuple[SchedulerType, ...] = ("fair_share", "priority", "round_robin")
FITTINGS: tuple[Fitting, ...] = ("best", "worst")
ORDERS: tuple[VictimOrder, ...] = ("newest", "cost")
RANDOM_CASES = 40
STEPS = 120


class Driver:
    """A cluster on a virtual clock whose executors answer a random part of what is asked of
    them each step, so the policy also sees jobs starting, stopping and nominated."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.state = ClusterState()
        self.now = 0.0
        self.ids = 0
        self.asked: list[Event] = []  # decisions the executors have not answered yet

    def record(self, event: Event) -> None:
        self.state.apply(event)

    def eid(self) -> str:
        self.ids += 1
        return f"e{self.ids}"

    def answer_some(self) -> None:
        keep: list[Event] = []
        for event in self.asked:
            if self.rng.random() < 0.6:
                self.answer(event)
            else:
                keep.append(event)
        self.asked = keep

    def answer(self, event: Event) -> None:
        if isinstance(event, JobScheduled) and not event.scale_up:
            self.record(
                JobStarted(
                    id=self.eid(),
                    time=self.now,
                    actor="executor",
                    job_id=event.job_id,
                    attempt=event.attempt,
                    resumed=event.attempt > 1,
                )
            )
        elif isinstance(event, JobPreemptionRequested):
            self.record(
                JobPreempted(
                    id=self.eid(),
                    time=self.now,
                    actor="executor",
                    job_id=event.job_id,
                    attempt=event.attempt,
                    reason=event.reason,
                    replicas=event.replicas,
                    checkpointed=self.rng.random() < 0.5,
                )
            )


def random_case(  # noqa: PLR0912, PLR0915 (one random run, step by step)
    seed: int, usage: tuple[float, float] | None = None
) -> Iterator[list[Event]]:
    """Every decide() output along one seeded random run; `usage` (half-life, k) gives every
    scheduler setting rule 11's history (tests/test_time_aware.py), drawing nothing more."""
    rng = random.Random(seed)
    d = Driver(rng)
    pools = [f"p{i}" for i in range(rng.randint(1, 3))]
    projects = [f"proj{i}" for i in range(rng.randint(1, 5))]

    def settings() -> SchedulerSettings:
        return SchedulerSettings(
            type=rng.choice(SCHEDULERS),
            fitting=rng.choice(FITTINGS),
            victim_order=rng.choice(ORDERS),
            usage_half_life_s=None if usage is None else usage[0],
            usage_k=1.0 if usage is None else usage[1],
        )

    d.record(
        ClusterConfigured(
            id=d.eid(), time=0.0, actor="t", settings=ClusterSettings(scheduler=settings())
        )
    )
    for pool in pools:
        own = settings() if rng.random() < 0.4 else None
        d.record(PoolConfigured(id=d.eid(), time=0.0, actor="t", pool=pool, scheduler=own))
    nodes = 0

    def add_node() -> None:
        nonlocal nodes
        d.record(
            NodeRegistered(
                id=d.eid(),
                time=d.now,
                actor="t",
                node=f"n{nodes}",
                pool=rng.choice(pools),
                gpus=rng.randint(0, 8),
            )
        )
        nodes += 1

    def configure(project: str) -> None:
        terms = {
            pool: ProjectTerms(
                quota=rng.randint(0, 8),
                over_quota_weight=rng.randint(0, 3),
                limit=rng.choice((None, None, rng.randint(1, 16))),
                priority=rng.choice((50, 100, 100, 200)),
            )
            for pool in pools
            if rng.random() < 0.85
        }
        d.record(ProjectConfigured(id=d.eid(), time=d.now, actor="t", project=project, terms=terms))

    for _ in range(rng.randint(2, 4 * len(pools) + 2)):
        add_node()
    for project in projects:
        configure(project)
    jobs: list[str] = []
    for _ in range(STEPS):
        roll = rng.random()
        alive = [j for j in jobs if j in d.state.live]
        pick = rng.choice(alive) if alive else None
        if roll < 0.4:
            job_id = f"j{len(jobs)}"
            jobs.append(job_id)
            replicas = rng.randint(1, 3)
            spec = JobSpec(
                project=rng.choice(projects),
                priority=rng.choice((None, 40, 50, 75, 100, 125)),
                preemptible=rng.choice((None, True, True, False)),
                gpus=rng.choice((0, 1, 1, 1, 2, 2, 4, 8)),
                replicas=replicas,
                min_replicas=rng.choice((None, None, rng.randint(1, replicas))),
                pools=tuple(rng.sample(pools, rng.randint(0, len(pools)))),
                node=(
                    rng.choice(sorted(d.state.nodes))
                    if d.state.nodes and rng.random() < 0.1
                    else None
                ),
                preemption_delay_s=rng.choice((0.0, 0.0, 60.0)),
                min_runtime_s=rng.choice((0.0, 0.0, 120.0)),
            )
            submitted = JobSubmitted(id=d.eid(), time=d.now, actor="t", job_id=job_id, spec=spec)
            d.record(submitted)
            d.record(admit(d.state, submitted, d.now))
        elif roll < 0.52 and pick is not None:
            job = d.state.jobs[pick]
            if job.phase in ("starting", "running", "stopping"):
                d.record(
                    JobCompleted(
                        id=d.eid(), time=d.now, actor="t", job_id=pick, attempt=job.attempt
                    )
                )
        elif roll < 0.57 and pick is not None:
            d.record(JobCancelled(id=d.eid(), time=d.now, actor="t", job_id=pick))
        elif roll < 0.62 and pick is not None:
            d.record(JobPaused(id=d.eid(), time=d.now, actor="t", job_id=pick))
        elif roll < 0.67 and pick is not None:
            d.record(JobResumed(id=d.eid(), time=d.now, actor="t", job_id=pick))
        elif roll < 0.70 and pick is not None:
            job = d.state.jobs[pick]
            d.record(
                JobCheckpointed(
                    id=d.eid(), time=d.now, actor="t", job_id=pick, attempt=job.attempt, save_s=3.0
                )
            )
        elif roll < 0.72 and pick is not None:
            d.record(
                JobPriorityChanged(
                    id=d.eid(), time=d.now, actor="t", job_id=pick, priority=rng.choice((40, 90))
                )
            )
        elif roll < 0.76:
            add_node()
        elif roll < 0.79 and d.state.nodes:
            lost = rng.choice(sorted(d.state.nodes))
            d.record(NodeLost(id=d.eid(), time=d.now, actor="t", node=lost))
        elif roll < 0.82:
            configure(rng.choice(projects))
        else:
            d.now += rng.choice((1.0, 30.0, 90.0, 400.0))
        decisions = decide(d.state, d.now).events
        yield decisions
        for event in decisions:
            d.record(event)
        d.asked.extend(decisions)
        d.answer_some()


def bench_case(scheduler: SchedulerType, fitting: Fitting, order: VictimOrder) -> list[Event]:
    state = build(Size(nodes=40, running=150, pending=400), 11, scheduler, fitting, order).state
    return decide(state, NOW).events


def cases() -> Iterator[tuple[str, Iterator[list[Event]]]]:
    for seed in range(RANDOM_CASES):
        yield f"random-{seed}", random_case(seed)
    for scheduler, fitting, order in product(SCHEDULERS, FITTINGS, ORDERS):
        yield f"bench-{scheduler}-{fitting}-{order}", iter([bench_case(scheduler, fitting, order)])


def digest(outputs: Iterator[list[Event]]) -> tuple[str, int]:
    h = hashlib.sha256()
    count = 0
    for decisions in outputs:
        count += len(decisions)
        h.update(msgspec.json.encode(decisions))
        h.update(b"\n")
    return h.hexdigest(), count


def test_decisions_match_the_recorded_ones() -> None:
    found = {name: digest(outputs) for name, outputs in cases()}
    recorded = {name: (d, n) for name, (d, n) in found.items()}
    if UPDATE or not GOLDEN.exists():
        if not UPDATE:
            pytest.fail(f"{GOLDEN} is missing: run with FAIRLANE_UPDATE_GOLDEN=1 to record it")
        GOLDEN.parent.mkdir(exist_ok=True)
        doc = {name: {"sha256": d, "decisions": n} for name, (d, n) in recorded.items()}
        GOLDEN.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        return
    golden = json.loads(GOLDEN.read_text())
    expected = {name: (v["sha256"], v["decisions"]) for name, v in golden.items()}
    changed = sorted(
        f"{name}: {expected.get(name, ('?', '?'))[1]} -> {n} decisions"
        for name, (d, n) in found.items()
        if expected.get(name, ("", 0))[0] != d
    )
    assert not changed, "decisions changed (see the module docstring):\n" + "\n".join(changed)
    assert set(expected) == set(found)
