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
    PortMapping,
    ProjectTerms,
    Replica,
    SchedulingHeld,
)
from policy.cycle import decide
from policy.state import Verdict
from simulation.virtual_cluster import VirtualCluster


def cluster(settled: bool = True) -> VirtualCluster:
    """One node of 2 GPUs, and two jobs of 2 GPUs (j1 running once settled, j2 waiting)."""
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 2)
    vc.set_project("a", {"default": ProjectTerms(quota=2)})
    vc.submit("j1", JobSpec(project="a", gpus=2))
    vc.submit("j2", JobSpec(project="a", gpus=2))
    if settled:
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


def test_a_placement_for_an_attempt_made_since_is_refused() -> None:
    """A placement decided before the job's first attempt was made, landing once that attempt
    has ended (its node lost), would make attempt 1 again: its reports would count for the new
    one, and the stream drops its id as the first placement's."""
    vc = cluster()
    assert vc.state.jobs["j1"].attempt == 1
    vc.remove_node("n0")
    vc.add_node("n1", "default", 2)

    def j1() -> tuple[str, int, int]:
        job = vc.state.jobs["j1"]
        return job.phase, job.attempt, len(job.held)

    assert j1() == ("pending", 1, 0)
    stale = msgspec.structs.replace(scheduled("j1", "n1", (0, 1)), id="j1/1/scheduled")
    assert vc.record(stale).reason == "attempt 1, not the job's next (2)"
    assert j1() == ("pending", 1, 0)
    vc.record(msgspec.structs.replace(stale, id="j1/2/scheduled", attempt=2))
    assert j1() == ("starting", 2, 1)


def test_a_refused_decision_is_made_again_under_a_fresh_id() -> None:
    """The stream drops an id it holds already: a placement refused (decided on a view the log
    has moved past) and made again under the same id was lost, and the job waited out the
    stream's two-minute window. The fold counts the refusal once, however often the refused
    placement is delivered, and the next decision's id says so."""
    vc = cluster(settled=False)
    first = decide(vc.state, vc.now).events
    assert [e.id for e in first] == ["j1/1/scheduled"]
    vc.record(scheduled("j2", "n0", (0, 1)))  # a stale leader's placement lands first
    for _ in range(2):
        assert not vc.record(first[0]).applied  # (and again: counted once)
    assert vc.state.jobs["j1"].refusals == 1
    vc.remove_node("n0")
    vc.add_node("n1", "default", 2)
    again = decide(vc.state, vc.now).events
    assert [e.id for e in again][:1] == ["j1/1/scheduled/r1"]
    assert vc.record(again[0]).applied


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


def test_a_shut_down_queues_the_job_again_only_from_its_own_attempt() -> None:
    """An executor that stops a job as the cluster shuts down reports it with no stop request
    (reason `shutdown`): the job goes back to pending, holding nothing, and it is not counted
    as a preemption. A report about another attempt changes nothing."""
    vc = cluster()
    assert vc.state.jobs["j1"].phase == "running"

    def shut(attempt: int) -> JobPreempted:
        return JobPreempted(
            id=f"j1/{attempt}/shutdown", time=5.0, actor="executor/n0", job_id="j1",
            attempt=attempt, reason="shutdown", checkpointed=True,
        )  # fmt: skip

    verdict = vc.record(shut(2))
    assert not verdict.applied and vc.state.jobs["j1"].phase == "running"
    assert vc.record(shut(1)).applied
    job = vc.state.jobs["j1"]
    assert (job.phase, job.held, job.preemptions, job.pending_since) == ("pending", [], 0, 5.0)
    assert job.last_checkpoint_at == 5.0
    assert vc.state.owners["n0"] == {}


def test_a_placement_that_would_publish_a_host_port_twice_on_a_node_is_refused() -> None:
    """Host ports are part of fitting: a decision (a stale or forged one) that puts a second
    replica publishing 8888 on a node that publishes it already has no effect, and one on a
    node where the port is free does."""
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 2)
    vc.add_node("n1", "default", 2)
    vc.set_project("a", {"default": ProjectTerms(quota=4)})
    ws = JobSpec(project="a", gpus=1, ports=(PortMapping(8888, 8888),))
    vc.submit("ws1", ws)
    vc.settle()
    assert vc.state.jobs["ws1"].held == [Replica("n0", (0,))]
    vc.record(SchedulingHeld(id="hold", time=0.0, actor="t", held=True))
    vc.submit("ws2", msgspec.structs.replace(ws, ports=(PortMapping(8888, 9999),)))
    verdict = vc.record(scheduled("ws2", "n0", (1,)))
    assert (verdict.applied, verdict.reason) == (
        False,
        "host port 8888 is taken on node 'n0' by job 'ws1'",
    )
    assert vc.state.jobs["ws2"].phase == "pending"
    assert vc.record(scheduled("ws2", "n1", (0,))).applied
    assert vc.state.ports_taken() == {"n0": {8888: "ws1"}, "n1": {8888: "ws2"}}
    # a gang's replicas publish it once per node too
    vc.submit("gang", JobSpec(project="a", gpus=1, replicas=2, ports=(PortMapping(6006, 6006),)))
    two = msgspec.structs.replace(
        scheduled("gang", "n0", (1,)), replicas=(Replica("n1", (1,)), Replica("n1", (1,)))
    )
    verdict = vc.record(two)
    assert not verdict.applied and "another replica" in verdict.reason


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


def gang_over_two_nodes() -> VirtualCluster:
    """Job g holds one replica on n0 and one on n1, running, and is asked to stop."""
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 1)
    vc.add_node("n1", "default", 1)
    vc.set_project("a", {"default": ProjectTerms(quota=2)})
    vc.submit("g", JobSpec(project="a", gpus=1, replicas=2))
    gang = (Replica("n0", (0,)), Replica("n1", (0,)))
    placed = JobScheduled(
        id="g/p", time=0.0, actor="t", job_id="g", attempt=1, pool="default", replicas=gang
    )
    assert vc.record(placed).applied
    assert vc.record(
        JobStarted(id="g/s", node="n0", time=1.0, actor="e", job_id="g", attempt=1)
    ).applied
    return vc


def own(node: str, reason: str = "priority", **kw: Any) -> JobPreempted:
    kw.setdefault("id", f"g/stop/{node}")
    return JobPreempted(
        time=5.0,
        actor=f"executor/{node}",
        job_id="g",
        attempt=1,
        reason=reason,  # type: ignore[arg-type]
        node=node,
        own_replicas=True,
        **kw,
    )


def test_a_gang_stop_ends_only_once_every_node_reported_its_own_replicas() -> None:
    """Each node reports its own replicas once they stopped and stored their checkpoints: the
    first report gives back that node's GPUs only, and the job is queued again (its next
    attempt placeable) only after the last node's."""
    vc = gang_over_two_nodes()
    asked = JobPreemptionRequested(
        id="g/ask", time=2.0, actor="p", job_id="g", attempt=1, reason="priority"
    )
    assert vc.record(asked).applied
    assert vc.record(own("n0", checkpointed=True)).applied
    job = vc.state.jobs["g"]
    assert (job.phase, job.held, job.stop_replicas) == ("stopping", [Replica("n1", (0,))], 1)
    assert job.preemptions == 0 and vc.state.owners["n0"] == {}
    # a repeat of n0's report is refused: nothing of n0 is being stopped any more
    assert not vc.record(msgspec.structs.replace(own("n0"), id="again")).applied
    assert vc.record(own("n1")).applied
    assert (job.phase, job.held, job.stop_replicas, job.preemptions) == ("pending", [], 0, 1)
    assert job.last_checkpoint_at == 5.0


def test_a_shut_down_report_of_one_node_stops_the_whole_gang() -> None:
    """No request precedes a shut down's report: the first node's turns the job to stopping,
    so the other node sees it and reports its own."""
    vc = gang_over_two_nodes()
    assert vc.record(own("n1", reason="shutdown")).applied
    job = vc.state.jobs["g"]
    assert (job.phase, job.held, job.stop_replicas) == ("stopping", [Replica("n0", (0,))], 1)
    assert vc.record(own("n0", reason="shutdown")).applied
    assert (job.phase, job.held, job.preemptions) == ("pending", [], 0)


def test_a_stop_of_some_replicas_over_two_nodes_ends_as_each_node_reports_its_own() -> None:
    """An elastic job's extras on two nodes, taken by two requests: each node gives back its
    own replicas of a request as it reports them (the other node's stay held while it stores),
    and each request counts one preemption, by its first node's report."""
    vc = VirtualCluster()
    vc.add_pool("default")
    for node in ("n0", "n1"):
        vc.add_node(node, "default", 2)
    vc.set_project("a", {"default": ProjectTerms(quota=4)})
    vc.submit("g", JobSpec(project="a", gpus=1, replicas=4, min_replicas=1))
    four = [Replica("n0", (0,)), Replica("n1", (0,)), Replica("n0", (1,)), Replica("n1", (1,))]
    placed = JobScheduled(
        id="g/p", time=0.0, actor="t", job_id="g", attempt=1, pool="default", replicas=tuple(four)
    )
    assert vc.record(placed).applied
    for ask, n in (("g/a1", 2), ("g/a2", 1)):
        request = JobPreemptionRequested(
            id=ask, time=2.0, actor="p", job_id="g", attempt=1, reason="reclaim", replicas=n
        )
        assert vc.record(request).applied
    job = vc.state.jobs["g"]
    a1_n0 = own("n0", id="g/a1/done", causation="g/a1", replicas=1, reason="reclaim")
    assert vc.record(a1_n0).applied
    assert (job.held, job.stop_replicas, job.preemptions) == (four[:2] + four[3:], 2, 1)
    assert vc.state.owners["n1"] == {0: "g", 1: "g"}  # n1 still stores its replica of a1
    a1_n1 = own("n1", id="g/a1/done/n1", causation="g/a1", replicas=1, reason="reclaim")
    assert vc.record(a1_n1).applied
    assert (job.held, job.stop_replicas, job.preemptions) == (four[:2], 1, 1)
    a2 = own("n1", id="g/a2/done", causation="g/a2", replicas=1, reason="reclaim")
    assert vc.record(a2).applied
    assert (job.phase, job.held, job.stop_replicas, job.preemptions) == (
        "starting",
        four[:1],
        0,
        2,
    )


def test_a_replica_lost_stops_the_whole_gang_node_by_node() -> None:
    """A node's report of its replica lost (no request precedes it) turns the job to stopping,
    as a shut down's does: the other node reports its own once stored, then it is queued."""
    vc = gang_over_two_nodes()
    assert vc.record(own("n1", id="g/1/lost/n1", reason="node_lost")).applied
    job = vc.state.jobs["g"]
    assert (job.phase, job.held, job.stop_replicas) == ("stopping", [Replica("n0", (0,))], 1)
    assert vc.record(own("n0", id="g/1/lost/n0", reason="node_lost", checkpointed=True)).applied
    assert (job.phase, job.held, job.preemptions, job.last_checkpoint_at) == ("pending", [], 0, 5.0)


def test_a_report_of_the_whole_stop_still_ends_it_at_once() -> None:
    """Reports written before nodes reported their own (no `own_replicas`) fold as they did."""
    vc = gang_over_two_nodes()
    whole = msgspec.structs.replace(own("n0"), own_replicas=False)
    assert vc.record(whole).applied
    assert (vc.state.jobs["g"].phase, vc.state.jobs["g"].held) == ("pending", [])


def test_non_preemptible_work_over_its_projects_quota_is_refused_even_from_a_stale_view() -> None:
    """Rule 3, refereed: a placement (or GPUs held for a job) decided before another
    non-preemptible job of the project got its GPUs does not take the project over quota;
    starting on GPUs held for it is not asked again (it was when they were held)."""
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 4)
    vc.set_project("a", {"default": ProjectTerms(quota=2)})
    for job in ("np1", "np2"):
        vc.submit(job, JobSpec(project="a", gpus=2, priority=100, preemptible=False))
    stale = decide(vc.state, vc.now)  # one of them fits the quota: np1
    [placed] = [e for e in stale.events if isinstance(e, JobScheduled)]
    assert placed.job_id == "np1"
    vc.record(placed)
    over = scheduled("np2", "n0", (2, 3))  # as a decider that had not seen np1 placed
    verdict = vc.record(over)
    assert not verdict.applied and "quota of 2" in verdict.reason
    assert vc.state.jobs["np2"].phase == "pending"
    assert vc.state.owners["n0"] == {0: "np1", 1: "np1"}
    vc.set_project("a", {"default": ProjectTerms(quota=4)})  # room now: the same placement lands
    assert vc.record(scheduled("np2", "n0", (2, 3))).applied
