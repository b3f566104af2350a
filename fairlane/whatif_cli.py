"""`fairlane whatif`: the workload a cluster's log recorded, replayed through the simulator under
the settings it ran with and under other ones (scheduler, victim order, quotas), side by side.

Both runs go through the same simulator (`fairlane simulate`'s), so the comparison is between
settings, not between a simulation and the real cluster.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import cyclopts
import msgspec
from rich.console import Console
from rich.table import Table

from cluster.cluster_file import DEFAULT_DATA_DIR
from events import ProjectTerms
from events.model import VictimOrder
from fairlane.audit_cli import Log, read_log
from fairlane.cluster_cli import DataDir, NatsUrl, Output
from fairlane.output import USAGE_FLAGS
from fairlane.simulate_cli import simulation_errors
from policy.decay import settings_problem
from simulation.trace.errors import SimulationError
from simulation.trace.policies import PolicyName, make_policy
from simulation.trace.recorded import RecordedRun, project_entry, recorded_run
from simulation.trace.run import Options, Outcome, Simulation
from simulation.trace.units import parse_duration

err = Console(stderr=True, highlight=False, soft_wrap=True)
DEFAULT_OUT = Path("fairlane-whatif")
#: (label, Summary attribute or fairness index, lower is better)
FIGURES: list[tuple[str, str, bool]] = [
    ("avg queueing delay (s)", "avg_queue_s", True),
    ("p99 queueing delay (s)", "p99_queue_s", True),
    ("avg time waiting, all attempts (s)", "avg_wait_s", True),
    ("avg JCT (s)", "avg_jct_s", True),
    ("makespan (s)", "makespan_s", True),
    ("preemptions", "preemptions", True),
    ("GPU-hours lost to preemption", "gpu_hours_lost", True),
    ("utilization", "utilization", False),
    ("fairness: lowest ratio", "fairness_min", False),
    ("fairness: Jain's index", "fairness_jain", False),
]


def whatif(
    *,
    policy: PolicyName | None = None,
    victim_order: VictimOrder | None = None,
    quota: Annotated[tuple[str, ...], cyclopts.Parameter(consume_multiple=True)] = (),
    usage_half_life: str | None = None,
    usage_k: float | None = None,
    file: Path | None = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    nats: NatsUrl = None,
    out: Path | None = None,
    output: Output = "text",
) -> None:
    """Replay the workload on the log (submissions, sizes, actual run times) through the
    simulator under the recorded settings and under the changed ones; print the figures of
    both side by side and plot them. Exits 2 on bad input, 1 if the policy fails to settle.

    Parameters
    ----------
    policy
        The scheduler to try (as `fairlane simulate --policy`); default: the recorded one.
    victim_order
        newest or cost; default: the recorded one.
    quota
        PROJECT=GPUS: that project's quota in the compute pool (repeat for more projects).
    usage_half_life
        Time-aware fairness (rule 11) with this half-life (2h, 1d), or "off"; default: the
        recorded setting.
    usage_k
        How strongly the usage history moves the shares; default: the recorded one.
    file
        Read an export (`fairlane log export`) instead of a running cluster's log.
    out
        Folder for the plot (whatif.png); default ./fairlane-whatif with text output.
    """
    log = read_log(file, data_dir, nats)
    with simulation_errors(err):
        usage = parse_usage(usage_half_life, usage_k)
        runs = compare(log, policy, victim_order, parse_quotas(quota), usage)
    plots_to = out if out is not None or output == "json" else DEFAULT_OUT
    plot = None
    if plots_to is not None:
        from fairlane.whatif_plot import write_comparison  # noqa: PLC0415 (matplotlib is slow)

        values = {label: figures(outcome) for label, (_, outcome) in runs.items()}
        jct = {label: outcome.jct_s for label, (_, outcome) in runs.items()}
        plot = write_comparison(
            values, jct, [(label, attr) for label, attr, _ in FIGURES], plots_to
        )
    if output == "json":
        doc = {label: {**setup, **figures(outcome)} for label, (setup, outcome) in runs.items()}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    print_comparison(Console(highlight=False, soft_wrap=True), runs)
    if plot is not None:
        Console().print(f"plot: {plot}")


Runs = dict[str, tuple[dict[str, Any], Outcome]]


def compare(
    log: Log,
    policy: PolicyName | None,
    victim_order: VictimOrder | None,
    quotas: dict[str, int],
    usage: dict[str, Any] | None = None,
) -> Runs:
    """The recorded workload under the recorded settings and under the changed ones
    (`usage`: rule 11's `usage_half_life_s` and `usage_k`, those given)."""
    run = recorded_run(log)
    if not run.jobs:
        raise SimulationError("the log records no job that ran: nothing to replay")
    recorded = run.settings.scheduler
    if recorded.type == "round_robin":
        raise SimulationError("the simulator has no round_robin scheduler to replay it with")
    base: dict[str, Any] = {
        "policy": recorded.type,
        "victim_order": recorded.victim_order,
        "usage_half_life_s": recorded.usage_half_life_s,
        "usage_k": recorded.usage_k,
    }
    other: dict[str, Any] = {
        **base,
        "policy": policy or recorded.type,
        "victim_order": victim_order or recorded.victim_order,
        **(usage or {}),
    }
    if quotas:
        other["quotas"] = quotas
    return {
        "recorded settings": (base, _simulate(run, base, {})),
        "what if": (other, _simulate(run, other, quotas)),
    }


def _simulate(run: RecordedRun, setup: dict[str, Any], quotas: dict[str, int]) -> Outcome:
    cluster = run.cluster
    if quotas:
        pool = cluster.compute_pool
        terms = {name: dict(t) for name, t in run.terms.items()}
        for project, gpus in quotas.items():
            own = terms.setdefault(project, {})
            own[pool] = msgspec.structs.replace(own.get(pool, ProjectTerms()), quota=gpus)
        cluster = replace(cluster, projects=tuple(project_entry(n, t) for n, t in terms.items()))
    options = Options(
        policy=make_policy(setup["policy"]),
        victim_order=setup["victim_order"],
        cycles="event",
        usage_half_life_s=setup.get("usage_half_life_s"),
        usage_k=setup.get("usage_k", 1.0),
    )
    return Simulation(run.jobs, cluster, options).run()


def parse_usage(half_life: str | None, k: float | None) -> dict[str, Any]:
    """Rule 11's settings to try, those given (a bad value is named)."""
    usage: dict[str, Any] = {}
    if half_life is not None:
        off = half_life == "off"
        usage["usage_half_life_s"] = None if off else parse_duration(half_life, "--usage-half-life")
    if k is not None:
        usage["usage_k"] = k
    problem = settings_problem(
        usage.get("usage_half_life_s"), usage.get("usage_k", 1.0), USAGE_FLAGS
    )
    if problem is not None:
        raise SimulationError(problem)
    return usage


def parse_quotas(given: tuple[str, ...]) -> dict[str, int]:
    quotas: dict[str, int] = {}
    for item in given:
        project, _, gpus = item.partition("=")
        if not project or not gpus.isdigit():
            raise SimulationError(f"--quota {item!r}: expected PROJECT=GPUS, like a=4")
        quotas[project] = int(gpus)
    return quotas


def figures(outcome: Outcome) -> dict[str, Any]:
    s = outcome.summary
    lowest, jain = s.fairness
    values: dict[str, Any] = {
        attr: getattr(s, attr) for _, attr, _ in FIGURES if not attr.startswith("fairness")
    }
    return values | {"fairness_min": lowest, "fairness_jain": jain, "jobs": s.jobs_submitted}


def print_comparison(console: Console, runs: Runs) -> None:
    (base_label, (base, base_out)), (other_label, (other, other_out)) = runs.items()
    table = Table(title="fairlane whatif", title_justify="left")
    table.add_column("")
    table.add_column(base_label, justify="right")
    table.add_column(other_label, justify="right")
    for key in ("policy", "victim_order", "quotas"):
        table.add_row(
            key.replace("_", " "),
            str(base.get(key, "as recorded")),
            str(other.get(key, "as recorded")),
        )
    for key in ("usage_half_life_s", "usage_k"):  # rule 11
        table.add_row(key.replace("_", " "), _show(base.get(key)), _show(other.get(key)))
    a, b = figures(base_out), figures(other_out)
    table.add_row("jobs replayed", f"{a['jobs']:,}", f"{b['jobs']:,}")
    for label, attr, lower_better in FIGURES:
        table.add_row(
            label, _show(a[attr]), _show(b[attr]) + _trend(a[attr], b[attr], lower_better)
        )
    console.print(table)


def _show(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _trend(before: object, after: object, lower_better: bool) -> str:
    if not isinstance(before, int | float) or not isinstance(after, int | float) or before == after:
        return ""
    better = (after < before) == lower_better
    return " [green](better)[/]" if better else " [red](worse)[/]"
