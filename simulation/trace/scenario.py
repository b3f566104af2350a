"""`fairlane simulate --scenario FILE`: a scenario file's steps as the workload.

The steps run on the core engine (the policy itself on a virtual clock, as `fairlane scenario
run` runs them; `expect` steps are not checked here), and the simulator's `Recorder` measures
the run as it measures a trace: the same figures, plus each project's GPU-hours up to the
scenario's last step (jobs still running counted up to then) and each project's GPUs over
time. The half-life of rule 11 can be set for the whole run (`usage`), which is how the
oscillation measurement in docs/time-aware-fairness.md compares the same workload with it
and without it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
from rich.console import Console
from rich.table import Table

from events import Event, SchedulerSettings
from policy.decay import settings_problem
from simulation.scenario.core_engine import CoreEngine
from simulation.scenario.setup import SetupRefused
from simulation.spec import (
    PoolEntry,
    Scenario,
    ScenarioError,
    compute_pool_of,
    load_scenario,
    project_terms,
)
from simulation.trace.errors import SimulationError
from simulation.trace.metrics import Recorder, Series, Summary


@dataclass(slots=True)
class Allocation:
    """Each project's GPUs over time, a step function: gpus[p][i] holds from time[i] on."""

    time: list[float] = field(default_factory=list)
    gpus: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class ScenarioOutcome:
    scenario: Scenario
    summary: Summary
    #: GPU-hours each project held up to the last step, jobs still running counted up to then
    gpu_hours: dict[str, float]
    allocation: Allocation
    end_s: float
    wall_s: float
    #: what the trace plots draw: busy GPUs and waiting jobs, JCTs, the compute pool's GPUs
    series: Series
    jct_s: list[float]
    capacity: int


def run_scenario(path: Path, usage: tuple[float | None, float] | None = None) -> ScenarioOutcome:
    """Run the scenario's steps; `usage` (half-life, k) replaces rule 11's settings of the
    cluster and of every pool that has its own scheduler."""
    try:
        scenario = load_scenario(path)
    except ScenarioError as e:
        raise SimulationError(str(e)) from None
    if usage is not None:
        problem = settings_problem(*usage)
        if problem is not None:
            raise SimulationError(problem)
        scenario = with_usage(scenario, *usage)
    started = time.perf_counter()
    try:
        engine = CoreEngine(scenario)
    except SetupRefused as e:
        raise SimulationError(f"{path}: {e}") from None
    pool = compute_pool_of(scenario)
    names = [p.name for p in scenario.pools]
    terms = {p.name: project_terms(p, names, pool)[pool] for p in scenario.projects}
    capacity = sum(n.gpus for p in scenario.pools if p.name == pool for n in p.nodes)
    recorder = Recorder(capacity, terms)
    allocation = Allocation()
    watch = _Watch(recorder, allocation)
    engine.vc.observer = watch.observe
    for step in scenario.steps:
        if step.kind != "expect":
            engine.step(step)
    end = engine.vc.now
    watch.sample(end)
    recorder.close()
    return ScenarioOutcome(
        scenario=scenario,
        summary=recorder.summary(),
        gpu_hours=gpu_hours_until(recorder, end),
        allocation=allocation,
        end_s=end,
        wall_s=time.perf_counter() - started,
        series=recorder.series,
        jct_s=recorder.jct_s(),
        capacity=capacity,
    )


def with_usage(scenario: Scenario, half_life_s: float | None, k: float) -> Scenario:
    """The scenario with rule 11's settings replaced, in the cluster's scheduler and in every
    pool's own."""

    def tuned(settings: SchedulerSettings) -> SchedulerSettings:
        return msgspec.structs.replace(settings, usage_half_life_s=half_life_s, usage_k=k)

    config = scenario.config
    cluster = msgspec.structs.replace(config, scheduler=tuned(config.scheduler))
    pools = tuple(
        p if p.scheduler is None else PoolEntry(p.name, tuned(p.scheduler), p.nodes)
        for p in scenario.pools
    )
    return replace(scenario, config=cluster, pools=pools)


def gpu_hours_until(recorder: Recorder, end: float) -> dict[str, float]:
    """Each project's GPU-hours up to `end`: what its jobs held and gave back, and what those
    still holding GPUs held from their last change up to `end`."""
    held: dict[str, float] = {}
    for job in recorder.jobs.values():
        open_s = max(0.0, end - job.held_since) * job.held
        held[job.project] = held.get(job.project, 0.0) + (job.held_gpu_s + open_s) / 3600.0
    return dict(sorted(held.items()))


class _Watch:
    """The recorder's observer, sampling each project's GPUs whenever they change."""

    def __init__(self, recorder: Recorder, allocation: Allocation) -> None:
        self.recorder = recorder
        self.allocation = allocation
        self.last: dict[str, int] = {}

    def observe(self, event: Event) -> None:
        self.recorder.observe(event)
        self.sample(event.time)

    def sample(self, now: float) -> None:
        held: dict[str, int] = {}
        for job in self.recorder.jobs.values():
            if job.held:
                held[job.project] = held.get(job.project, 0) + job.held
        for job in self.recorder.jobs.values():
            held.setdefault(job.project, 0)
        if held == self.last:
            return
        a = self.allocation
        for project in held.keys() - a.gpus.keys():
            a.gpus[project] = [0] * len(a.time)
        if a.time and a.time[-1] == now:  # one instant: only how it ends counts
            for project, series in a.gpus.items():
                series[-1] = held.get(project, 0)
        else:
            a.time.append(now)
            for project, series in a.gpus.items():
                series.append(held.get(project, 0))
        self.last = held


def result_dict(outcome: ScenarioOutcome, setup: dict[str, Any]) -> dict[str, Any]:
    """`setup`, the summary's figures (as for a trace), and per project its GPU-hours up to the
    last step next to the summary's own figures of it."""
    summary = msgspec.to_builtins(outcome.summary)
    projects = summary.pop("projects")
    for name, hours in outcome.gpu_hours.items():
        figures = projects.setdefault(name, {})
        figures["gpu_hours"] = hours
        # against the GPU-hours held up to the last step, running jobs counted (the summary's
        # own ratio counts a job's hours only once it has ended)
        fair = figures.get("fair_share_gpu_hours")
        figures["fair_share_ratio"] = hours / fair if fair else None
    total = sum(outcome.gpu_hours.values())
    for figures in projects.values():
        figures["gpu_hours_part"] = figures.get("gpu_hours", 0.0) / total if total else None
    ratios = [f["fair_share_ratio"] for f in projects.values() if f.get("fair_share_ratio")]
    lowest = min(ratios) if ratios else None
    jain = sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios)) if ratios else None
    return {
        **setup,
        **summary,
        "end_s": outcome.end_s,
        "projects": projects,
        "fairness": {"min_ratio": lowest, "jain_index": jain},
        "wall_s": round(outcome.wall_s, 3),
    }


def print_report(console: Console, outcome: ScenarioOutcome, setup: dict[str, Any]) -> None:
    """The setup, the run's figures, and per project its GPU-hours up to the last step."""
    s = outcome.summary
    head = Table(title="fairlane simulate", show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column()
    for key, value in setup.items():
        head.add_row(key.replace("_", " "), "-" if value is None else str(value))
    console.print(head)
    lowest, jain = s.fairness
    table = Table(title="results", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    for label, value in (
        ("jobs submitted / completed", f"{s.jobs_submitted:,} / {s.jobs_completed:,}"),
        ("avg / p99 JCT", f"{s.avg_jct_s / 3600:.2f}h / {s.p99_jct_s / 3600:.2f}h"),
        ("avg / p99 queueing delay", f"{s.avg_queue_s / 3600:.2f}h / {s.p99_queue_s / 3600:.2f}h"),
        ("utilization", f"{s.utilization:.1%}"),
        ("preemptions (jobs)", f"{s.preemptions:,} ({s.jobs_preempted:,})"),
        ("GPU-hours lost to preemption", f"{s.gpu_hours_lost:,.1f}"),
        ("fairness: lowest ratio / Jain's index", f"{_r(lowest)} / {_r(jain)}"),
        ("last step at", f"{outcome.end_s / 3600:.2f}h"),
    ):
        table.add_row(label, value)
    console.print(table)
    total = sum(outcome.gpu_hours.values())
    projects = Table(title="projects, up to the last step", title_justify="left")
    for name in ("project", "GPU-h", "part", "jobs", "completed", "preempted"):
        projects.add_column(name, justify="left" if name == "project" else "right")
    for name, hours in outcome.gpu_hours.items():
        p = s.projects.get(name)
        projects.add_row(
            name,
            f"{hours:,.1f}",
            f"{hours / total:.1%}" if total else "-",
            str(p.jobs if p else 0),
            str(p.completed if p else 0),
            str(p.preemptions if p else 0),
        )
    console.print(projects)


def _r(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"
