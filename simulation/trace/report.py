"""Presenting a run: one JSON object for scripts, rich tables for people."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from simulation.trace.run import Outcome


def result_dict(outcome: Outcome, setup: dict[str, Any]) -> dict[str, Any]:
    """`setup` (what was run) first, then every figure of the summary."""
    summary = outcome.summary
    figures = asdict(summary)
    lowest, jain = summary.fairness
    return {
        **setup,
        "quota_source": outcome.workload.quota_source,
        "padded_jobs": outcome.workload.padded_jobs,
        **figures,
        "fairness": {"min_ratio": lowest, "jain_index": jain},
        "wall_s": round(outcome.wall_s, 3),
        "cpu_s": round(outcome.cpu_s, 3),
    }


def print_report(console: Console, outcome: Outcome, setup: dict[str, Any]) -> None:
    s = outcome.summary
    head = Table(title="fairlane simulate", show_header=False, title_justify="left")
    head.add_column(style="bold")
    head.add_column()
    for key, value in setup.items():
        head.add_row(key.replace("_", " "), _show(value))
    head.add_row("quotas", outcome.workload.quota_source)
    console.print(head)

    lowest, jain = s.fairness
    table = Table(title="results", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows = [
        (
            "jobs submitted / completed / rejected",
            f"{s.jobs_submitted:,} / {s.jobs_completed:,} / {s.jobs_rejected:,}",
        ),
        ("avg / p50 / p99 JCT", f"{_t(s.avg_jct_s)} / {_t(s.p50_jct_s)} / {_t(s.p99_jct_s)}"),
        ("avg / p99 queueing delay", f"{_t(s.avg_queue_s)} / {_t(s.p99_queue_s)}"),
        ("avg time waiting (all attempts)", _t(s.avg_wait_s)),
        ("makespan", _t(s.makespan_s)),
        ("utilization", f"{s.utilization:.1%}"),
        ("preemptions (jobs)", f"{s.preemptions:,} ({s.jobs_preempted:,})"),
        (
            "GPU-hours held / lost to preemption",
            f"{s.gpu_hours_held:,.0f} / {s.gpu_hours_lost:,.1f}",
        ),
        ("fairness: lowest ratio / Jain's index", f"{_r(lowest)} / {_r(jain)}"),
        ("wall time (CPU time)", f"{outcome.wall_s:.1f}s ({outcome.cpu_s:.1f}s)"),
    ]
    if outcome.workload.padded_jobs:
        rows.append(("jobs padded to equal replicas", f"{outcome.workload.padded_jobs:,}"))
    for label, value in rows:
        table.add_row(label, value)
    console.print(table)
    for reason, count in s.rejected_reasons.items():
        console.print(f"[yellow]rejected {count:,}:[/] {reason}")

    projects = Table(title="projects (GPU-hours held vs fair share)", title_justify="left")
    for name in (
        "project",
        "jobs",
        "quota",
        "GPU-h",
        "fair GPU-h",
        "ratio",
        "avg JCT",
        "avg queue",
        "preempted",
    ):
        projects.add_column(name, justify="left" if name == "project" else "right")
    for name, p in s.projects.items():
        projects.add_row(
            name,
            f"{p.jobs:,}",
            str(p.quota),
            f"{p.gpu_hours:,.0f}",
            f"{p.fair_share_gpu_hours:,.0f}",
            _r(p.fair_share_ratio),
            _t(p.avg_jct_s),
            _t(p.avg_queue_s),
            f"{p.preemptions:,}",
        )
    console.print(projects)


def _show(value: object) -> str:
    if isinstance(value, dict):
        given = {k: v for k, v in value.items() if v is not None}
        return ", ".join(f"{k} {_show(v)}" for k, v in given.items()) or "-"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return "-" if value is None else str(value)


def _t(seconds: float) -> str:
    """Seconds for people: 45s, 12.5m, 3.2h, 4.1d."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0)):
        if abs(seconds) >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _r(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"
