"""Benchmark: audit throughput (`policy.audit.audit`) on a large synthetic log.

The log is a busy cluster's: a synthetic workload (Poisson arrivals over `--hours` offering
1.1 times the cluster's GPU-hours, mostly
1-GPU jobs, some of 2, 4 and 8 GPUs, durations from minutes to hours, projects over and under
their quotas, a third of them at a higher priority) run through the simulator with a cycle on
every arrival and finish, as the scheduler service runs them, on `--nodes` x 8 GPUs. Every
placement, nomination and stop request on it carries its basis, as on a live log.

The audit folds the whole log and re-derives every plan that made a decision. Figures: events
and decisions on the log, plans re-derived, seconds, decisions/s and events/s, and how long a
day of this cluster takes to audit. Nothing is asserted about time.

Jobs checkpoint every 30 minutes (the simulator's default), so the log has checkpoints too.

    uv run python -m bench.audit [--hours 24] [--nodes 64] [--load 1.1] [-o json]

A long log is built once and kept: `--save FILE` writes it as an export (`fairlane log
export`'s JSON lines), `--log FILE` audits such a file instead of building one (for example
the 1,000,000-event log: `--hours 235 --load 0.95 --save /tmp/million.jsonl`).
"""

from __future__ import annotations

import json
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Literal

import cyclopts
from rich.console import Console
from rich.table import Table

from events import Event, JobSubmitted, NodeRegistered
from events.export import export_line, read_export
from policy.audit import DECISIONS, audit
from simulation.trace.cluster import uniform_cluster
from simulation.trace.policies import make_policy
from simulation.trace.run import Options, Simulation
from simulation.trace.traces import TraceJob

app = cyclopts.App(name="bench.audit", help=__doc__)
SIZES = (1, 1, 1, 1, 1, 1, 2, 2, 4, 8)


@dataclass(frozen=True)
class Figures:
    jobs: int
    hours: float
    gpus: int
    events: int
    decisions: int
    plans: int
    matched: int
    build_s: float
    audit_s: float
    decisions_per_s: float
    events_per_s: float
    #: seconds to audit one day of this cluster's log
    day_s: float


#: the mean job: GPUs (of SIZES) and seconds (of the duration's distribution)
MEAN_GPUS = sum(SIZES) / len(SIZES)
MEAN_DURATION_S = 1160.0
#: offered load against the cluster's GPUs: busy, with a queue, without growing without end
LOAD = 1.1


def jobs_for(hours: float, nodes: int, load: float = LOAD) -> int:
    """Jobs that offer `load` times the cluster's GPU-seconds over `hours`."""
    return max(1, round(load * nodes * 8 * hours * 3600.0 / (MEAN_GPUS * MEAN_DURATION_S)))


def synthetic_log(
    hours: float, nodes: int, load: float = LOAD, seed: int = 7
) -> list[tuple[int, Event]]:
    rng = random.Random(seed)
    span = hours * 3600.0
    jobs = jobs_for(hours, nodes, load)
    trace = []
    t = 0.0
    for i in range(jobs):
        t += rng.expovariate(jobs / span)
        project = f"p{rng.randrange(12)}"
        trace.append(
            TraceJob(
                job_id=f"j{i}",
                submit_s=t,
                duration_s=round(rng.lognormvariate(6.5, 1.0) + 60.0, 1),
                gpus=rng.choice(SIZES),
                project=project,
                priority=100 if int(project[1:]) % 3 == 0 else 50,
            )
        )
    options = Options(policy=make_policy("fair_share"), cycles="event", victim_order="cost")
    sim = Simulation(trace, uniform_cluster(nodes, 8), options, keep_log=True)
    sim.run()
    return list(enumerate(sim.vc.log, 1))


def build(hours: float, nodes: int, load: float) -> tuple[list[tuple[int, Event]], float]:
    began = time.perf_counter()
    log = synthetic_log(hours, nodes, load)
    return log, time.perf_counter() - began


def load_export(path: Path) -> list[tuple[int, Event]]:
    with path.open("rb") as lines:
        return list(read_export(lines))


def save_export(log: list[tuple[int, Event]], path: Path) -> None:
    with path.open("wb") as out:
        out.writelines(export_line(seq, event) for seq, event in log)


def measure(log: list[tuple[int, Event]], built_s: float) -> Figures:
    began = time.perf_counter()
    report = audit(log)
    took = time.perf_counter() - began
    decisions = sum(isinstance(e, DECISIONS) for _, e in log)
    assert report.checked == decisions  # the audit looked at every one of them
    virtual_s = max(e.time for _, e in log) or 1.0
    return Figures(
        jobs=sum(isinstance(e, JobSubmitted) for _, e in log),
        hours=round(virtual_s / 3600.0, 1),
        gpus=sum(e.gpus for _, e in log if isinstance(e, NodeRegistered)),
        events=len(log),
        decisions=decisions,
        plans=report.plans,
        matched=report.matched,
        build_s=round(built_s, 2),
        audit_s=round(took, 2),
        decisions_per_s=round(decisions / took),
        events_per_s=round(len(log) / took),
        day_s=round(took * 86400.0 / virtual_s, 1),
    )


@app.default
def main(
    *,
    hours: float = 24.0,
    nodes: int = 64,
    load: float = LOAD,
    save: Path | None = None,
    log: Path | None = None,
    output: Annotated[Literal["text", "json"], cyclopts.Parameter(name=["--output", "-o"])] = (
        "text"
    ),
) -> None:
    """Audit a busy cluster's log and report decisions/s.

    Parameters
    ----------
    hours: how long a log to build (virtual hours)
    nodes: the cluster's nodes, 8 GPUs each
    load: offered GPU-hours against the cluster's (above 1 the queue grows all along)
    save: write the built log here as an export (JSON lines) to audit again with --log
    log: audit this export instead of building a log (build_s is then 0)
    """
    if not (0 < hours <= 24 * 365) or not (1 <= nodes <= 10_000) or not (0 < load <= 10):
        raise SystemExit(f"--hours {hours} --nodes {nodes} --load {load}: out of range")
    if log is not None:
        events, built = load_export(log), 0.0
    else:
        events, built = build(hours, nodes, load)
        if save is not None:
            save_export(events, save)
    figures = measure(events, built)
    if output == "json":
        doc = {"python": platform.python_version(), "results": asdict(figures)}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    table = Table(title="bench.audit", show_header=False, title_justify="left")
    for key, value in asdict(figures).items():
        table.add_row(key.replace("_", " "), f"{value:,}")
    Console().print(table)
    if figures.matched != figures.decisions:
        Console(stderr=True).print("[red]some decisions did not match: see fairlane audit[/]")
        raise SystemExit(1)


if __name__ == "__main__":
    app()
