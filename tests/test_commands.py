"""The pure command deciders: what each command leads to, and why one is refused."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from events import (
    ClusterConfigured,
    ClusterSettings,
    JobAdmitted,
    JobCancelled,
    JobPaused,
    JobPriorityChanged,
    JobResumed,
    JobSpec,
    JobSubmitted,
    NodeRegistered,
    PoolConfigured,
    ProjectConfigured,
    ProjectTerms,
    SchedulerSettings,
    SchedulingHeld,
)
from events.commands import (
    AnyCommand,
    CancelJob,
    ConfigureCluster,
    HoldScheduling,
    PauseJob,
    ResumeJob,
    SetJobPriority,
    SetPool,
    SetProject,
    SubmitJob,
)
from events.model import DEFAULT_PRIORITY_CLASSES
from policy.commands import Accepted, Refused, decide_command
from policy.commands.decide import DECIDERS
from policy.state import ClusterState

ROOT = Path(__file__).resolve().parent.parent


def cluster() -> ClusterState:
    state = ClusterState()
    state.apply(PoolConfigured(id="p", time=0.0, actor="t", pool="gpu"))
    state.apply(NodeRegistered(id="n", time=0.0, actor="t", node="n0", pool="gpu", gpus=4))
    terms = {"gpu": ProjectTerms(quota=2, limit=4)}
    state.apply(ProjectConfigured(id="a", time=0.0, actor="t", project="a", terms=terms))
    return state


def accepted(state: ClusterState, command: AnyCommand, at: int = 7) -> Accepted:
    outcome = decide_command(state, command, 10.0, at)
    assert isinstance(outcome, Accepted), outcome
    for event in outcome.events:
        state.apply(event)
    return outcome


def refused(state: ClusterState, command: AnyCommand) -> str:
    outcome = decide_command(state, command, 10.0, 7)
    assert isinstance(outcome, Refused), outcome
    return outcome.reason


def test_submit_records_the_submission_and_its_verdict() -> None:
    state = cluster()
    outcome = accepted(state, SubmitJob(job_id="j1", spec=JobSpec(project="a"), actor="ann"))
    submitted, verdict = outcome.events
    assert isinstance(submitted, JobSubmitted) and isinstance(verdict, JobAdmitted)
    assert (submitted.id, verdict.id, verdict.causation) == (
        "j1/submitted",
        "j1/admission",
        "j1/submitted",
    )
    assert submitted.actor == "ann" and outcome.answer is verdict
    assert state.jobs["j1"].phase == "pending"


@pytest.mark.parametrize(
    ("command", "fragment"),
    [
        (SubmitJob(job_id="a.b", spec=JobSpec(project="a")), "job id 'a.b' is not valid"),
        (CancelJob(job_id="ghost"), "unknown job id 'ghost'"),
        (PauseJob(job_id="ghost"), "unknown job id 'ghost'"),
        (ResumeJob(job_id="ghost"), "unknown job id 'ghost'"),
        (SetProject(project="a b"), "project name 'a b' is not valid"),
        (SetProject(project="b", pool="tpu"), "unknown pool 'tpu' (known: gpu)"),
        (SetProject(project="b", quota=-1), "quota must be 0 or more, got -1"),
        (SetPool(pool="x>"), "pool name 'x>' is not valid"),
        (ConfigureCluster(default_aux_pool="a*"), "pool name 'a*' is not valid"),
    ],
)
def test_refusals_name_the_bad_value(command: AnyCommand, fragment: str) -> None:
    state = cluster()
    before = state.events_applied
    assert fragment in refused(state, command)
    assert state.events_applied == before


def test_a_job_moves_through_its_user_commands() -> None:
    state = cluster()
    accepted(state, SubmitJob(job_id="j1", spec=JobSpec(project="a")))
    assert refused(state, ResumeJob(job_id="j1")) == "job 'j1' cannot be resumed: it is pending"
    paused = accepted(state, PauseJob(job_id="j1"), at=3).answer
    assert isinstance(paused, JobPaused) and paused.id == "j1/paused/3"
    assert refused(state, PauseJob(job_id="j1")) == "job 'j1' cannot be paused: it is paused"
    resumed = accepted(state, ResumeJob(job_id="j1"), at=4).answer
    assert isinstance(resumed, JobResumed) and resumed.id == "j1/resumed/4"
    cancelled = accepted(state, CancelJob(job_id="j1")).answer
    assert isinstance(cancelled, JobCancelled) and cancelled.id == "j1/cancelled"
    assert refused(state, CancelJob(job_id="j1")) == "job 'j1' cannot be cancelled: it is cancelled"
    assert refused(state, ResumeJob(job_id="j1")) == "job 'j1' cannot be resumed: it is cancelled"


def test_a_job_priority_is_changed_while_it_may_still_run() -> None:
    state = cluster()
    accepted(state, SubmitJob(job_id="j1", spec=JobSpec(project="a", priority_class="train")))
    before = state.jobs["j1"].priority
    changed = accepted(state, SetJobPriority(job_id="j1", priority=before + 30), at=5).answer
    assert isinstance(changed, JobPriorityChanged) and changed.id == "j1/priority/5"
    assert state.jobs["j1"].priority == before + 30
    assert refused(state, SetJobPriority(job_id="j1", priority=before + 30)) == (
        f"job 'j1' has priority {before + 30} already"
    )
    assert refused(state, SetJobPriority(job_id="ghost", priority=1)) == "unknown job id 'ghost'"
    accepted(state, CancelJob(job_id="j1"))
    assert refused(state, SetJobPriority(job_id="j1", priority=1)) == (
        "job 'j1' cannot be given a new priority: it is cancelled"
    )


def test_a_submitted_job_cannot_be_paused_and_an_id_is_taken_once() -> None:
    state = cluster()
    state.apply(JobSubmitted(id="s", time=0.0, actor="t", job_id="j1", spec=JobSpec(project="a")))
    assert "it is submitted" in refused(state, PauseJob(job_id="j1"))
    outcome = decide_command(state, SubmitJob(job_id="j1", spec=JobSpec(project="a")), 1.0, 1)
    assert isinstance(outcome, Refused) and outcome.exists
    assert (outcome.code, outcome.field) == ("name_taken", "job_id")


def test_set_project_changes_only_what_it_names() -> None:
    state = cluster()
    accepted(state, SetProject(project="a", pool="gpu", over_quota_weight=3))
    assert state.projects["a"].terms["gpu"] == ProjectTerms(quota=2, over_quota_weight=3, limit=4)
    accepted(state, SetProject(project="a", no_limit=True, priority=7))  # default: compute pool
    assert state.projects["a"].terms["gpu"] == ProjectTerms(2, 3, None, 7)
    event = accepted(state, SetProject(project="b"), at=9).answer
    assert isinstance(event, ProjectConfigured) and event.id == "project/b/9"
    assert event.terms == {"gpu": ProjectTerms()}


def test_cluster_settings_pass_through_whole() -> None:
    state = cluster()
    command = ConfigureCluster(
        scheduler=SchedulerSettings(type="priority", fitting="worst"),
        preemption_grace_s=12.0,
        default_compute_pool="gpu",
        default_aux_pool="cpu",
    )
    event = accepted(state, command, at=5).answer
    assert isinstance(event, ClusterConfigured) and event.id == "cluster/5"
    assert event.settings == ClusterSettings(
        scheduler=command.scheduler,
        preemption_grace_s=12.0,
        priority_classes=DEFAULT_PRIORITY_CLASSES,  # none given: the defaults
        default_compute_pool="gpu",
        default_aux_pool="cpu",
    )
    assert state.settings.scheduler.type == "priority" and "cpu" in state.pools
    held = accepted(state, HoldScheduling(held=True, reason="maintenance"), at=6).answer
    assert isinstance(held, SchedulingHeld) and held.id == "held/True/6" and state.held


FORBIDDEN = {"time", "datetime", "random", "secrets", "uuid", "asyncio", "socket", "os", "io"}
FORBIDDEN_PREFIXES = ("nats", "pathlib", "subprocess", "services", "fairlane")


@pytest.mark.parametrize("package", ["policy", "events"])
def test_the_pure_core_imports_no_clock_io_randomness_or_nats(package: str) -> None:
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top not in FORBIDDEN and not top.startswith(FORBIDDEN_PREFIXES), (
                    f"{path.relative_to(ROOT)} imports {name}"
                )


def test_every_command_has_a_decider() -> None:
    assert set(DECIDERS) == set(get_args(AnyCommand))
