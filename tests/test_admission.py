"""Admission refuses what can never run, with a reason that names the bad value (rule 10)."""

from __future__ import annotations

import pytest

from events import JobAdmitted, JobRejected, JobSpec, ProjectTerms
from policy.commands import Refused
from simulation.virtual_cluster import VirtualCluster


@pytest.fixture
def cluster() -> VirtualCluster:
    vc = VirtualCluster()
    vc.add_pool("gpu")
    vc.add_pool("cpu")
    vc.add_node("g0", "gpu", 8)
    vc.add_node("g1", "gpu", 4)
    vc.add_node("c0", "cpu", 0)
    vc.set_project("team", {"gpu": ProjectTerms(quota=4, limit=10), "cpu": ProjectTerms()})
    return vc


@pytest.mark.parametrize(
    ("spec", "fragment", "code", "field"),
    [
        (JobSpec(project="nobody"), "unknown project 'nobody'", "unknown_project", "project"),
        (
            JobSpec(project="team", priority_class="urgent"),
            "unknown priority class 'urgent'",
            "unknown_class",
            "class",
        ),
        (JobSpec(project="team", pools=("tpu",)), "unknown pool 'tpu'", "unknown_pool", "pools"),
        (JobSpec(project="team", node="g9"), "unknown node 'g9'", "unknown_node", "node"),
        (JobSpec(project="team", gpus=9), "largest node in pool 'gpu' has 8", "never_fits", "gpus"),
        (
            JobSpec(project="team", gpus=4, replicas=4),
            "need 4 slots but pool 'gpu' has 3",
            "never_fits",
            "gpus",
        ),
        (JobSpec(project="team", gpus=1, pools=("cpu",)), "pool 'cpu' has 0", "never_fits", "gpus"),
        (JobSpec(project="team", gpus=4, replicas=3), "limit of 10", "over_limit", "gpus"),
        (
            JobSpec(project="team", replicas=2, min_replicas=3),
            "min_replicas must be between 1 and replicas (2), got 3",
            "out_of_range",
            "min_replicas",
        ),
        (
            JobSpec(project="team", gpus=-1),
            "gpus must be 0 or more, got -1",
            "out_of_range",
            "gpus",
        ),
    ],
)
def test_refusals_name_the_bad_value(
    cluster: VirtualCluster, spec: JobSpec, fragment: str, code: str, field: str
) -> None:
    verdict = cluster.submit("j1", spec)
    assert isinstance(verdict, JobRejected)
    assert fragment in verdict.reason
    assert (verdict.code, verdict.field) == (code, field)
    assert cluster.state.jobs["j1"].phase == "rejected"


def test_bad_job_id_is_refused_before_anything_is_recorded(cluster: VirtualCluster) -> None:
    # as admission does: an id that cannot be a stream subject is never recorded
    before = len(cluster.log)
    verdict = cluster.submit("no spaces", JobSpec(project="team"))
    assert isinstance(verdict, Refused)
    assert "'no spaces'" in verdict.reason
    assert len(cluster.log) == before and "no spaces" not in cluster.state.jobs


def test_a_job_id_is_taken_once(cluster: VirtualCluster) -> None:
    assert isinstance(cluster.submit("j1", JobSpec(project="team")), JobAdmitted)
    again = cluster.submit("j1", JobSpec(project="team", gpus=2))
    assert isinstance(again, Refused) and again.exists
    assert "job id 'j1' already exists" in again.reason


def test_defaults_resolve_from_class_and_pools(cluster: VirtualCluster) -> None:
    verdict = cluster.submit("j1", JobSpec(project="team", priority_class="build", gpus=2))
    assert isinstance(verdict, JobAdmitted)
    assert (verdict.priority, verdict.preemptible, verdict.pools) == (100, False, ("gpu",))
    aux = cluster.submit("j2", JobSpec(project="team", gpus=0))
    assert isinstance(aux, JobAdmitted)
    assert aux.pools == ("gpu",)  # no aux pool configured: the compute pool


def test_pool_list_keeps_only_pools_that_could_hold_the_job(cluster: VirtualCluster) -> None:
    verdict = cluster.submit("j1", JobSpec(project="team", gpus=2, pools=("cpu", "gpu")))
    assert isinstance(verdict, JobAdmitted)
    assert verdict.pools == ("gpu",)
