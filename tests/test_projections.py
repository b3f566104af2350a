"""The projection as pure code: the Run:AI exercise on the core engine, projected."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import msgspec

from events import (
    Event,
    JobAdmitted,
    JobCompleted,
    JobPreempted,
    JobProgress,
    JobRejected,
    JobScheduled,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    PortMapping,
    ProjectTerms,
    Replica,
)
from projections import (
    Batch,
    JobRow,
    NodeRow,
    OverQuotaRow,
    PreemptionRow,
    Projection,
    ProjectPoolRow,
    TimelineRow,
)
from simulation.scenario.core_engine import CoreEngine
from simulation.spec import load_scenario

SUITE = Path(__file__).resolve().parent.parent / "scenarios"
EXERCISE = SUITE / "runai-preemption-exercise.yaml"


def exercise_log() -> list[Event]:
    scenario = load_scenario(EXERCISE)
    engine = CoreEngine(scenario)
    for step in scenario.steps:
        if step.kind != "expect":
            engine.step(step)
    return list(engine.vc.log)


def project(events: list[Event], batch_every: int) -> list[Batch]:
    projection = Projection()
    batches = []
    for seq, event in enumerate(events, start=1):
        projection.apply(seq, event)
        if seq % batch_every == 0:
            batches.append(projection.take())
    batches.append(projection.take())
    return batches


class Tables(TypedDict, total=False):
    """The tables a batch writes to, each by its key; a table no batch wrote to is absent."""

    timeline: dict[int, TimelineRow]
    jobs: dict[str, JobRow]
    nodes: dict[str, NodeRow]
    project_pools: dict[tuple[str, str], ProjectPoolRow]
    preemptions: dict[int, PreemptionRow]
    over_quota: dict[tuple[str, str, int], OverQuotaRow]


def final_rows(batches: list[Batch]) -> Tables:
    """What a table holds after the batches are written in order (later rows replace)."""
    tables: Tables = {}
    for batch in batches:
        for row in batch.timeline:
            tables.setdefault("timeline", {})[row.seq] = row
        for job in batch.jobs:
            tables.setdefault("jobs", {})[job.job_id] = job
        for node in batch.nodes:
            tables.setdefault("nodes", {})[node.node] = node
        for pp in batch.project_pools:
            tables.setdefault("project_pools", {})[(pp.project, pp.pool)] = pp
        for p in batch.preemptions:
            tables.setdefault("preemptions", {})[p.seq] = p
        for o in batch.over_quota:
            tables.setdefault("over_quota", {})[(o.project, o.pool, o.started_seq)] = o
    return tables


def test_exercise_timeline_preemption_and_usage() -> None:
    events = exercise_log()
    tables = final_rows(project(events, batch_every=1000))
    timeline = [r for r in tables["timeline"].values() if r.job_id == "large-training-job"]
    assert all(r.applied for r in timeline)
    request = next(r for r in timeline if r.type == "JobPreemptionRequested")
    assert request.reason == "reclaim" and request.for_job == "jupyter-workspace"
    assert request.project == "project-a" and request.nodes == ("node-1",)
    after = [r.type for r in timeline if r.seq > request.seq]
    assert after == ["JobPreempted", "JobNominated", "JobScheduled", "JobStarted"]  # rule 7
    (preemption,) = tables["preemptions"].values()
    assert preemption.victim == "large-training-job"
    assert preemption.beneficiary == "jupyter-workspace" and preemption.gpus == 8
    assert preemption.preempted_at is not None and preemption.work_lost_gpu_s is not None
    job = tables["jobs"]["large-training-job"]
    assert (job.state, job.attempt, job.gpus_held, job.preemptions) == ("running", 2, 8, 1)
    assert job.nodes == ("node-1",)
    workspace = tables["jobs"]["jupyter-workspace"]
    assert workspace.state == "cancelled" and workspace.gpus_held == 0
    usage = {(p.project, p.pool): (p.usage, p.quota) for p in tables["project_pools"].values()}
    assert usage[("project-a", "single-node-pool")] == (8, 4)
    assert usage[("project-b", "single-node-pool")] == (0, 4)
    assert tables["nodes"]["node-1"].free == 0


def test_usage_and_fair_share_while_reclaimed() -> None:
    events = exercise_log()
    cut = next(
        i for i, e in enumerate(events) if type(e).__name__ == "JobStarted"
        and getattr(e, "job_id", "") == "jupyter-workspace"
    )  # fmt: skip
    tables = final_rows(project(events[: cut + 1], batch_every=3))
    pp = {p.project: p for p in tables["project_pools"].values()}
    assert (pp["project-a"].usage, pp["project-b"].usage) == (0, 4)
    assert (pp["project-a"].fair_share, pp["project-b"].fair_share) == (4, 4)


def test_shares_start_at_quota_where_quotas_outgrow_the_pool() -> None:
    """What `fairlane projects` shows (the project_pools rows) on a 4-GPU pool whose quotas
    add up to 6: every share starts at min(quota, demand), none cut down."""
    scenario = load_scenario(SUITE / "fair-share-quotas-outgrow-pool-never-cut.yaml")
    engine = CoreEngine(scenario)
    for step in scenario.steps:
        if step.kind != "expect":
            engine.step(step)
    tables = final_rows(project(list(engine.vc.log), batch_every=7))
    rows = {p.project: (p.quota, p.usage, p.fair_share) for p in tables["project_pools"].values()}
    assert rows == {"p1": (1, 1, 1), "p2": (1, 1, 1), "p3": (2, 2, 2), "p4": (2, 0, 1)}


def test_batching_does_not_change_the_rows() -> None:
    events = exercise_log()
    whole = final_rows(project(events, batch_every=len(events) + 1))
    for every in (1, 2, 7):
        assert final_rows(project(events, batch_every=every)) == whole


def test_clocks_queued_running_gpu_seconds_and_refused_decisions() -> None:
    def admitted(job: str, t: float) -> JobAdmitted:
        return JobAdmitted(
            id=f"{job}/a", time=t, actor="admission", job_id=job, project="p", priority=50,
            preemptible=True, gpus=2, replicas=1, min_replicas=1, pools=("default",),
        )  # fmt: skip

    where = (Replica("n1", (0, 1)),)
    events = [
        NodeRegistered(id="n", time=0.0, actor="x", node="n1", pool="default", gpus=2),
        JobSubmitted(id="j/s", time=10.0, actor="u", job_id="j", spec=JobSpec(project="p")),
        admitted("j", 11.0),
        JobScheduled(id="j/1", time=40.0, actor="s", job_id="j", attempt=1, pool="default",
                     replicas=where),
        JobStarted(id="j/1/s", time=50.0, actor="e", job_id="j", attempt=1),
        JobSubmitted(id="k/s", time=60.0, actor="u", job_id="k", spec=JobSpec(project="p")),
        admitted("k", 60.0),
        # GPUs 0 and 1 are j's: the fold refuses this placement
        JobScheduled(id="k/1", time=61.0, actor="s", job_id="k", attempt=1, pool="default",
                     replicas=where),
        JobCompleted(id="j/1/c", time=150.0, actor="e", job_id="j", attempt=1),
    ]  # fmt: skip
    tables = final_rows(project(events, batch_every=2))
    job = tables["jobs"]["j"]
    assert (job.state, job.queued_s, job.running_s, job.gpu_s) == ("completed", 30.0, 100.0, 220.0)
    assert job.accounted_at == 150.0 and job.state_since == 150.0
    refused = tables["timeline"][8]
    assert refused.type == "JobScheduled" and refused.job_id == "k" and not refused.applied
    assert tables["jobs"]["k"].state == "pending"
    assert tables["nodes"]["n1"].free == 2


def test_running_time_stops_when_a_shut_down_stopped_the_job() -> None:
    """A cluster shut down at 100 and back at 500: the executor that comes back reports the
    stop with the time it was made, so "Ran" counts only the time the job really ran."""
    where = (Replica("n1", (0,)),)
    events = [
        NodeRegistered(id="n", time=0.0, actor="x", node="n1", pool="default", gpus=1),
        JobSubmitted(id="j/s", time=10.0, actor="u", job_id="j", spec=JobSpec(project="p")),
        JobAdmitted(
            id="j/a", time=10.0, actor="admission", job_id="j", project="p", priority=50,
            preemptible=True, gpus=1, replicas=1, min_replicas=1, pools=("default",),
        ),
        JobScheduled(id="j/1", time=20.0, actor="s", job_id="j", attempt=1, pool="default",
                     replicas=where),
        JobStarted(id="j/1/s", time=20.0, actor="e", job_id="j", attempt=1),
        NodeRegistered(id="n/2", time=500.0, actor="x", node="n1", pool="default", gpus=1),
        JobPreempted(id="j/1/shutdown", time=100.0, actor="e", job_id="j", attempt=1,
                     reason="shutdown", checkpointed=True),
        JobScheduled(id="j/2", time=510.0, actor="s", job_id="j", attempt=2, pool="default",
                     replicas=where),
        JobStarted(id="j/2/s", time=510.0, actor="e", job_id="j", attempt=2, resumed=True),
        JobCompleted(id="j/2/c", time=600.0, actor="e", job_id="j", attempt=2),
    ]  # fmt: skip
    tables = final_rows(project(events, batch_every=3))
    job = tables["jobs"]["j"]
    assert (job.state, job.running_s, job.queued_s, job.preemptions) == (
        "completed",
        80.0 + 90.0,
        10.0 + 410.0,
        0,
    )
    assert "preemptions" not in tables  # a shut down is not a preemption to make room


def test_a_job_row_says_its_ports_and_where_they_are_reached() -> None:
    """`http://<node address>:<host port>` while it holds replicas (the node's registered
    address, 127.0.0.1 for one that gave none); its ports alone while it runs nowhere."""
    spec = JobSpec(project="p", ports=(PortMapping(8888, 8888), PortMapping(6006, 6000)))
    events = [
        NodeRegistered(id="n", time=0.0, actor="x", node="n1", pool="default", gpus=1,
                       address="10.0.0.7"),
        JobSubmitted(id="ws/s", time=1.0, actor="u", job_id="ws", spec=spec),
        JobAdmitted(
            id="ws/a", time=1.0, actor="admission", job_id="ws", project="p", priority=75,
            preemptible=True, gpus=1, replicas=1, min_replicas=1, pools=("default",),
        ),
    ]  # fmt: skip
    pending = final_rows(project(events, batch_every=1))["jobs"]["ws"]
    assert (pending.ports, pending.urls) == (("8888:8888", "6006:6000"), ())
    events.append(
        JobScheduled(id="ws/1", time=2.0, actor="s", job_id="ws", attempt=1, pool="default",
                     replicas=(Replica("n1", (0,)),))
    )  # fmt: skip
    running = final_rows(project(events, batch_every=1))["jobs"]["ws"]
    assert running.urls == ("http://10.0.0.7:8888", "http://10.0.0.7:6006")


def test_a_rejected_job_row_says_what_it_asked_for() -> None:
    """A job is shaped at admission; one never admitted shows what its spec asked for (its
    class's priority), not the defaults of one GPU and priority 0."""
    asked = JobSpec(project="p", priority_class="interactive", gpus=5, replicas=2, min_replicas=1)
    unknown = JobSpec(project="p", priority_class="nope", gpus=3)
    events = [
        JobSubmitted(id="big/s", time=1.0, actor="u", job_id="big", spec=asked),
        JobRejected(id="big/r", time=1.0, actor="admission", job_id="big", reason="never fits"),
        JobSubmitted(id="odd/s", time=2.0, actor="u", job_id="odd", spec=unknown),
    ]
    rows = final_rows(project(events, batch_every=1))["jobs"]
    big, odd = rows["big"], rows["odd"]
    assert (big.state, big.gpus, big.replicas, big.min_replicas) == ("rejected", 5, 2, 1)
    assert (big.priority, big.preemptible) == (75, True)
    assert (odd.state, odd.gpus, odd.replicas, odd.min_replicas, odd.priority) == (
        "submitted",
        3,
        1,
        1,
        0,
    )


def test_a_job_as_of_any_position_equals_the_projection_then() -> None:
    from projections.as_of import job_as_of  # noqa: PLC0415

    events = exercise_log()
    for cut in range(6, len(events) + 1):
        projection = Projection()
        for seq, event in enumerate(events[:cut], start=1):
            projection.apply(seq, event)
        timeline = projection.take().timeline
        mine = [
            (row.seq, events[row.seq - 1])
            for row in timeline
            if row.job_id == "large-training-job" and row.applied
        ]
        again = job_as_of("large-training-job", mine)
        then = projection.job_row("large-training-job")
        # why it waited needs the whole cluster, like a fair share: not given as of a position
        assert again == msgspec.structs.replace(then, waiting=""), cut


def test_a_pending_job_row_says_why_the_policy_leaves_it_waiting() -> None:
    """The projector asks the policy (a cycle on the state at the batch's end): a job held by its
    project's limit says `limit`, non-preemptible work over quota says `quota`, and once the
    limit has room the row changes to "" (the next cycle starts it) in that batch."""
    from simulation.virtual_cluster import VirtualCluster  # noqa: PLC0415

    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n", "default", 8)
    vc.set_project("a", {"default": ProjectTerms(quota=2, limit=2)})
    vc.set_project("b", {"default": ProjectTerms(quota=0)})
    vc.submit("first", JobSpec(project="a", gpus=2, priority_class="train"))
    vc.settle()
    vc.submit("second", JobSpec(project="a", gpus=1, priority_class="train"))
    vc.submit("steady", JobSpec(project="b", gpus=1, priority_class="train", preemptible=False))
    vc.settle()
    projection = Projection()
    for seq, event in enumerate(vc.log, start=1):
        projection.apply(seq, event)
    rows = {row.job_id: row for row in projection.take().jobs}
    assert (rows["second"].state, rows["second"].waiting) == ("pending", "limit")
    assert (rows["steady"].state, rows["steady"].waiting) == ("pending", "quota")
    assert (rows["first"].state, rows["first"].waiting) == ("running", "")
    done = len(vc.log)
    vc.complete("first")
    for seq, event in enumerate(vc.log[done:], start=done + 1):
        projection.apply(seq, event)
    rows = {row.job_id: row for row in projection.take().jobs}
    assert rows["second"].waiting == ""  # its last event is older: a view of the cycle
    assert rows["second"].last_seq < done


def test_the_timeline_says_what_the_fold_said_of_each_event() -> None:
    """`applied` is the fold's verdict: a workload's progress report, which changes no state,
    is applied; a placement the log had moved past is not."""
    events = exercise_log()
    started = next(
        i for i, e in enumerate(events)
        if isinstance(e, JobStarted) and e.job_id == "large-training-job"
    )  # fmt: skip
    report = JobProgress(id="p1", time=events[started].time, actor="workload",
                         job_id="large-training-job", attempt=1, step=3)  # fmt: skip
    events.insert(started + 1, report)
    rows = final_rows(project(events, batch_every=1000))["timeline"]
    assert rows[started + 2].type == "JobProgress" and rows[started + 2].applied
    assert not [r for r in rows.values() if r.type == "JobProgress" and not r.applied]
