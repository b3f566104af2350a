"""The fold is the referee: decisions that no longer fit the log have no effect."""

from __future__ import annotations

from typing import Any

import msgspec

from events import (
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobMessage,
    JobPreempted,
    JobPreemptionRequested,
    JobProgress,
    JobScheduled,
    JobSpec,
    JobStarted,
    NodeLost,
    ProjectTerms,
    Replica,
    SchedulingHeld,
)
from policy.cycle import decide
from policy.state import Verdict
from simulation.virtual_cluster import VirtualCluster


def cluster() -> VirtualCluster:
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 2)
    vc.set_project("a", {"default": ProjectTerms(quota=2)})
    vc.submit("j1", JobSpec(project="a", gpus=2))
    vc.submit("j2", JobSpec(project="a", gpus=2))
    vc.settle()
    return vc


def scheduled(job: str, node: str, gpus: tuple[int, ...]) -> JobScheduled:
    return JobScheduled(
        id=f"{job}/stale",
        time=0.0,
        actor="stale-leader",
        job_id=job,
        attempt=1,
        pool="default",
        replicas=(Replica(node, gpus),),
    )


def test_a_placement_on_held_gpus_is_ignored() -> None:
    vc = cluster()
    assert vc.state.jobs["j1"].phase == "running"
    vc.record(scheduled("j2", "n0", (1,)))
    assert vc.state.jobs["j2"].phase == "pending"
    assert vc.state.owners["n0"] == {0: "j1", 1: "j1"}


def test_a_placement_on_a_lost_node_is_ignored() -> None:
    vc = cluster()
    vc.record(NodeLost(id="lost", time=0.0, actor="t", node="n0"))
    vc.record(scheduled("j2", "n0", (0, 1)))
    assert vc.state.jobs["j2"].phase == "pending"
    assert vc.state.jobs["j1"].phase == "pending"  # its only node is gone


def test_a_placement_of_more_replicas_than_the_job_has_is_refused() -> None:
    """A job holds at most its replicas (victims are ordered on it): a forged or broken
    placement giving a pending job more is refused and takes nothing."""
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 4)
    vc.set_project("a", {"default": ProjectTerms(quota=0)})
    vc.submit("j", JobSpec(project="a", gpus=1))
    two = JobScheduled(
        id="j/forged",
        time=0.0,
        actor="t",
        job_id="j",
        attempt=1,
        pool="default",
        replicas=(Replica("n0", (0,)), Replica("n0", (1,))),
    )
    verdict = vc.record(two)
    assert (verdict.applied, verdict.reason) == (False, "more replicas than the job has")
    assert (vc.state.jobs["j"].held, vc.state.owners.get("n0", {})) == ([], {})


def test_gpus_given_back_can_be_taken_again() -> None:
    vc = cluster()
    vc.complete("j1")
    vc.settle()
    assert vc.state.jobs["j2"].phase == "running"
    assert vc.state.owners["n0"] == {0: "j2", 1: "j2"}


def test_held_scheduling_places_nothing_until_released() -> None:
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 2)
    vc.set_project("a", {"default": ProjectTerms(quota=2)})
    vc.record(SchedulingHeld(id="hold", time=0.0, actor="op", held=True))
    vc.submit("j1", JobSpec(project="a", gpus=1))
    assert decide(vc.state, 0.0).events == []
    vc.record(SchedulingHeld(id="release", time=0.0, actor="op", held=False))
    vc.settle()
    assert vc.state.jobs["j1"].phase == "running"


def test_stops_of_some_replicas_add_up_until_answered() -> None:
    """Two claims in one cycle may each take one extra replica of the same elastic job; the
    executor may answer both requests only after both are recorded. Both stops stand."""
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 3)
    vc.set_project("a", {"default": ProjectTerms(quota=3)})
    vc.submit("e", JobSpec(project="a", gpus=1, replicas=3, min_replicas=1))
    vc.settle()
    assert len(vc.state.jobs["e"].held) == 3
    for k in (1, 2):
        asked = JobPreemptionRequested(
            id=f"e/1/preempt/{3 - k}", time=1.0, actor="preemptor", job_id="e", attempt=1,
            reason="reclaim", replicas=1,
        )  # fmt: skip
        assert vc.record(asked).applied
    assert vc.state.jobs["e"].stop_replicas == 2
    for k in (1, 2):
        done = JobPreempted(id=f"e/1/preempted/{k}", time=2.0, actor="executor", job_id="e",
                            attempt=1, reason="reclaim", replicas=1)  # fmt: skip
        assert vc.record(done).applied, k
    job = vc.state.jobs["e"]
    assert (len(job.held), job.stop_replicas, job.phase) == (1, 0, "running")


def two_nodes() -> VirtualCluster:
    """j1 runs on n0 (both its GPUs); n1 runs nothing of it."""
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 2)
    vc.add_node("n1", "default", 2)
    vc.set_project("a", {"default": ProjectTerms(quota=2)})
    vc.submit("j1", JobSpec(project="a", gpus=2))
    vc.settle()
    assert [r.node for r in vc.state.jobs["j1"].held] == ["n0"]
    return vc


REPORT: dict[str, Any] = {"time": 1.0, "actor": "executor", "job_id": "j1", "attempt": 1}


def test_a_report_from_a_node_without_a_replica_of_the_attempt_is_refused() -> None:
    """An executor's credentials completed a job running on another node, and that node
    killed it: a node speaks only for the attempts it runs a replica of."""
    vc = two_nodes()
    for forged in (
        JobCompleted(id="f1", node="n1", **REPORT),
        JobFailed(id="f2", node="n1", **REPORT),
        JobPreempted(id="f3", node="n1", reason="priority", **REPORT),
        JobCheckpointed(id="f4", node="n1", **REPORT),
        JobProgress(id="f5", node="n1", step=3, **REPORT),
        JobMessage(id="f6", node="n1", text="hi", **REPORT),
    ):
        verdict = vc.record(forged)
        assert verdict == Verdict(False, "node n1 holds no replica of attempt 1"), forged
    job = vc.state.jobs["j1"]
    assert (job.phase, [r.node for r in job.held], job.last_checkpoint_at) == (
        "running",
        ["n0"],
        None,
    )
    # its own node's word is taken
    assert vc.record(JobCompleted(id="own", node="n0", **REPORT)).applied
    assert vc.state.jobs["j1"].phase == "completed"


def test_a_start_from_another_node_is_refused() -> None:
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 2)
    vc.add_node("n1", "default", 2)
    vc.set_project("a", {"default": ProjectTerms(quota=2)})
    vc.submit("j1", JobSpec(project="a", gpus=2))
    vc.record(scheduled("j1", "n0", (0, 1)))
    assert vc.state.jobs["j1"].phase == "starting"
    started = JobStarted(id="s", node="n1", **REPORT)
    assert vc.record(started).reason == "node n1 holds no replica of attempt 1"
    assert vc.state.jobs["j1"].phase == "starting"
    assert vc.record(msgspec.structs.replace(started, id="s0", node="n0")).applied


def test_a_report_naming_no_node_is_applied_as_before() -> None:
    """Logs written before reports named their node fold as they always did."""
    vc = two_nodes()
    assert vc.record(JobCompleted(id="old", **REPORT)).applied
    assert vc.state.jobs["j1"].phase == "completed"
