"""Nodes taken out of service (cordon, drain) and put back: the fold, the cycle, the commands."""

from __future__ import annotations

from events import (
    JobNominated,
    JobPreemptionRequested,
    JobSpec,
    NodeCordoned,
    NodeRegistered,
    ProjectTerms,
    Replica,
)
from events.commands import CordonNode, UncordonNode
from policy.commands.outcome import Accepted, Refused
from policy.cycle import decide
from simulation.virtual_cluster import VirtualCluster
from tests.test_state_fold import scheduled


def two_nodes() -> VirtualCluster:
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 2)
    vc.add_node("n1", "default", 2)
    vc.set_project("a", {"default": ProjectTerms(quota=4)})
    return vc


def test_a_placement_on_a_cordoned_node_is_refused() -> None:
    """A placement decided before the cordon lands after it: no effect for anyone."""
    vc = two_nodes()
    vc.submit("j1", JobSpec(project="a", gpus=2))
    assert isinstance(vc.command(CordonNode(node="n0")), Accepted)
    verdict = vc.state.apply(scheduled("j1", "n0", (0, 1)))
    assert not verdict.applied and "cordoned" in verdict.reason
    assert vc.state.jobs["j1"].phase == "pending"
    vc.settle()
    assert [r.node for r in vc.state.jobs["j1"].held] == ["n1"]


def test_a_cordon_drops_nominations_holding_the_nodes_gpus() -> None:
    vc = two_nodes()
    vc.submit("j1", JobSpec(project="a", gpus=2))
    nomination = JobNominated(
        id="j1/nominate/1",
        time=0.0,
        actor="preemptor",
        job_id="j1",
        pool="default",
        replicas=(Replica("n0", (0, 1)),),
        victims=(),
        reason="priority",
    )
    vc.record(nomination)
    assert vc.state.jobs["j1"].nomination
    vc.command(CordonNode(node="n0"))
    assert vc.state.jobs["j1"].nomination == ()
    assert vc.state.reserved.get("n0", {}) == {}


def test_a_drain_asks_the_nodes_jobs_to_stop_with_reason_drain() -> None:
    vc = two_nodes()
    vc.submit("big", JobSpec(project="a", gpus=2, replicas=2))  # a gang on both nodes
    vc.submit("small", JobSpec(project="a", gpus=1))
    vc.settle()
    assert {r.node for r in vc.state.jobs["big"].held} == {"n0", "n1"}
    vc.command(CordonNode(node="n1", drain=True, reason="driver upgrade"))
    stops = [e for e in decide(vc.state, vc.now).events if isinstance(e, JobPreemptionRequested)]
    # the gang is stopped whole, though only one of its replicas is on n1
    assert [(e.job_id, e.reason, e.replicas) for e in stops] == [("big", "drain", 0)]
    vc.settle()
    assert vc.state.jobs["big"].phase == "pending"
    assert vc.state.jobs["big"].preemptions == 0  # a drain is not a preemption to make room


def test_a_cordon_outlives_the_node_registering_again() -> None:
    """An executor that restarts registers its node again: the operator's cordon stays."""
    vc = two_nodes()
    vc.command(CordonNode(node="n0"))
    vc.record(
        NodeRegistered(id="n0/again", time=1.0, actor="executor", node="n0", pool="default", gpus=2)
    )
    assert vc.state.nodes["n0"].cordoned
    vc.command(UncordonNode(node="n0"))
    assert not vc.state.nodes["n0"].cordoned


def test_an_unknown_node_is_refused_by_name() -> None:
    vc = two_nodes()
    for command in (
        CordonNode(node="gpu9"),
        CordonNode(node="gpu9", drain=True),
        UncordonNode(node="gpu9"),
    ):
        outcome = vc.command(command)
        assert isinstance(outcome, Refused)
        assert "'gpu9'" in outcome.reason and "n0, n1" in outcome.reason
    assert not any(isinstance(e, NodeCordoned) for e in vc.log)
