"""The virtual cluster's work model: durations, checkpoints, and what a preemption loses."""

from __future__ import annotations

from events import (
    CheckpointModel,
    JobCheckpointed,
    JobCompleted,
    JobPreempted,
    JobSpec,
    ProjectTerms,
)
from simulation.virtual_cluster import VirtualCluster


def two_projects() -> VirtualCluster:
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 4)
    vc.set_project("a", {"default": ProjectTerms(quota=2)})
    vc.set_project("b", {"default": ProjectTerms(quota=2)})
    return vc


def test_a_job_completes_after_its_duration() -> None:
    vc = two_projects()
    vc.submit("j", JobSpec(project="a", gpus=1, duration_s=600))
    vc.advance(599)
    assert vc.state.jobs["j"].phase == "running"
    vc.advance(1)
    job = vc.state.jobs["j"]  # read anew: the check above narrowed its phase for mypy
    assert job.phase == "completed"
    done = [e for e in vc.log if isinstance(e, JobCompleted)]
    assert [e.time for e in done] == [600]


def test_preemption_loses_work_since_the_last_checkpoint() -> None:
    vc = two_projects()
    cp = CheckpointModel(every_s=100, save_s=5, restore_s=20)
    vc.submit("long", JobSpec(project="a", gpus=4, duration_s=1000, checkpoint=cp))
    vc.advance(250)  # checkpoints at 100 and 200; 50 s of work unsaved
    assert [e.time for e in vc.log if isinstance(e, JobCheckpointed)] == [100, 200]
    vc.submit("short", JobSpec(project="b", gpus=2, duration_s=100))
    vc.settle()
    preempted = [e for e in vc.log if isinstance(e, JobPreempted)]
    assert len(preempted) == 1 and preempted[0].checkpointed
    # 'short' runs 250..350; 'long' restarts at 350 from 200 s of saved work plus 20 s restore:
    # 800 s to go -> completes at 350 + 20 + 800 = 1170
    vc.advance(2000)
    done = {e.job_id: e.time for e in vc.log if isinstance(e, JobCompleted)}
    assert done == {"short": 350, "long": 1170}
