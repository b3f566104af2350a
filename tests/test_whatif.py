"""`fairlane whatif`: the workload a log recorded, replayed under other settings side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from events import CheckpointModel, Event, JobCheckpointed, JobSpec, ProjectTerms
from events.export import read_export
from fairlane.whatif_cli import compare, parse_quotas
from simulation.trace.errors import SimulationError
from simulation.trace.recorded import recorded_run
from simulation.virtual_cluster import VirtualCluster

HISTORY = Path(__file__).parent / "histories" / "in-project-preemption-lowest-then-newest.jsonl"


def test_the_recorded_workload_is_what_ran() -> None:
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 4)
    vc.set_project("a", {"default": ProjectTerms(quota=3, limit=4)})
    vc.submit("first", JobSpec(project="a", gpus=2, duration_s=600, priority=7))
    vc.advance(100)
    vc.submit("second", JobSpec(project="a", gpus=2, duration_s=300, priority=7))
    vc.advance(100)
    vc.submit("too-big", JobSpec(project="a", gpus=8, duration_s=300))  # rejected: never runs
    vc.advance(1000)
    run = recorded_run(enumerate(vc.log, 1))
    ran = {j.job_id: (j.submit_s, j.duration_s, j.gpus, j.project, j.priority) for j in run.jobs}
    assert ran == {"first": (0.0, 600.0, 2, "a", 7), "second": (100.0, 300.0, 2, "a", 7)}
    assert run.left_out == 1
    assert [(n.name, n.gpus, n.pool) for n in run.cluster.nodes] == [("n0", 4, "default")]
    assert run.terms == {"a": {"default": ProjectTerms(quota=3, limit=4)}}


def test_work_lost_to_a_preemption_is_not_counted_twice() -> None:
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 4)
    vc.set_project("a", {"default": ProjectTerms(quota=2)})
    vc.set_project("b", {"default": ProjectTerms(quota=2)})
    vc.submit("long", JobSpec(project="a", gpus=4, duration_s=1000))
    vc.advance(250)  # no checkpoints: the preemption loses these 250 s
    vc.submit("short", JobSpec(project="b", gpus=2, duration_s=100))
    vc.advance(5000)
    ran = {j.job_id: j.duration_s for j in recorded_run(enumerate(vc.log, 1)).jobs}
    assert ran == {"long": 1000.0, "short": 100.0}


def test_cost_aware_victims_against_newest_first_side_by_side() -> None:
    log: list[tuple[int, Event]] = list(read_export(HISTORY.read_bytes().splitlines()))
    runs = compare(log, None, "cost", {})
    (base, recorded), (other, changed) = runs.values()
    assert (base["victim_order"], other["victim_order"]) == ("newest", "cost")
    replayed = len(recorded_run(log).jobs)  # hi2 started as the log ended: no run time yet
    assert recorded.summary.jobs_submitted == changed.summary.jobs_submitted == replayed == 5
    assert recorded.summary.preemptions >= 1


def test_quotas_are_checked() -> None:
    assert parse_quotas(("a=4", "b=0")) == {"a": 4, "b": 0}
    with pytest.raises(SimulationError, match="'a'"):
        parse_quotas(("a",))


def test_the_command_prints_json_and_draws_the_plot(tmp_path: Path) -> None:
    args = ["--policy", "priority", "--quota", "a=2", "-o", "json", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "fairlane.cli", "whatif", "--file", str(HISTORY), *args],
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    doc = json.loads(done.stdout)
    assert doc["what if"]["policy"] == "priority" and doc["what if"]["quotas"] == {"a": 2}
    assert {"avg_queue_s", "gpu_hours_lost", "preemptions", "fairness_jain"} <= set(doc["what if"])
    assert (tmp_path / "whatif.png").stat().st_size > 10_000


def test_a_checkpoint_due_at_a_fractional_time_fires_once() -> None:
    # 1512.2588810113295 + 1800 - 1512.2588810113295 comes out below 1800 in floats
    vc = VirtualCluster()
    vc.add_pool("default")
    vc.add_node("n0", "default", 4)
    vc.set_project("a", {"default": ProjectTerms(quota=4)})
    vc.advance(1512.2588810113295)
    cp = CheckpointModel(every_s=1800, save_s=5, restore_s=20)
    vc.submit("j", JobSpec(project="a", gpus=1, duration_s=4000, checkpoint=cp))
    vc.advance(5000)
    saved = [e.id for e in vc.log if isinstance(e, JobCheckpointed)]
    assert saved == ["j/1/checkpoint/1800", "j/1/checkpoint/3600"]
    assert vc.state.jobs["j"].phase == "completed"
