"""Benchmark: audit throughput (`policy.audit.audit`) on a large synthetic log.

The log is a busy cluster's: a synthetic workload (Poisson arrivals over `--hours` offering
1.1 times the cluster's GPU-hours, mostly
1-GPU jobs, some of 2, 4 and 8 GPUs, durations from minutes to hours, projects over and under
their quotas, a third of them at a higher priority) run through the simulator with a cycle on
every arrival and finish, as the scheduler service runs them, on `--nodes` x 8 GPUs. Every
placement, nomination and stop request on it carries its basis, as on a live log.

The log is written as an export and audited twice, each time in a child process of its own
(bench/audit_child.py, through bench/revision.py), reading and decoding the export included:
by the audit of git revision `--baseline` (checked out into a temporary folder) with the whole
log read into a list first, as the audit ran before it streamed, and by this tree's
`policy.audit.audit` as it streams. Figures for each: seconds, decisions/s, events/s, peak
resident memory of its process (its own maxrss) and before it read the log; and now over
baseline for decisions/s and peak memory. Also: events and decisions on the log, plans
re-derived, and how long a day of this cluster takes to audit. Nothing is asserted about
time. The audit before it streamed is revision 5a50346 (`--baseline 5a50346`); the default,
HEAD, sets this tree's audit reading the whole log beside it streaming.

Jobs checkpoint every 30 minutes (the simulator's default), so the log has checkpoints too.

    uv run python -m bench.audit [--hours 24] [--nodes 64] [--load 1.1] [--baseline REV]
        [-o json]

A long log is built once and kept: `--save FILE` writes it as an export (`fairlane log
export`'s JSON lines), `--log FILE` audits such a file instead of building one (for example
the 1,000,000-event log: `--hours 290 --load 0.9 --save /tmp/million.jsonl`).
"""

from __future__ import annotations

import json
import platform
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import cyclopts
import msgspec
from rich.console import Console
from rich.table import Table

from bench import revision
from bench.audit_child import Request, Run, read_file
from bench.options import Output, run_command
from events import Event, JobSubmitted, NodeRegistered
from events.export import export_line
from policy.audit import DECISIONS
from simulation.trace.cluster import uniform_cluster
from simulation.trace.policies import make_policy
from simulation.trace.run import Options, Simulation
from simulation.trace.traces import TraceJob

app = cyclopts.App(name="bench.audit", help=__doc__)
ROOT: Final = Path(__file__).resolve().parent.parent
CHILD: Final = Path(__file__).resolve().parent / "audit_child.py"
SIZES = (1, 1, 1, 1, 1, 1, 2, 2, 4, 8)


@dataclass(frozen=True)
class Figures:
    jobs: int
    hours: float
    gpus: int
    events: int
    decisions: int
    build_s: float
    #: the baseline revision's audit, the log read whole, and this tree's, streaming
    baseline_revision: str
    baseline: Run
    streaming: Run
    #: streaming over baseline: decisions/s (above 1: faster) and peak memory (below 1: less)
    speed_ratio: float
    memory_ratio: float
    #: seconds to audit one day of this cluster's log (streaming)
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


def save_export(log: list[tuple[int, Event]], path: Path) -> None:
    with path.open("wb") as out:
        out.writelines(export_line(seq, event) for seq, event in log)


def measure(path: Path, built_s: float, baseline: str) -> Figures:
    """The figures of the export at `path`: each audit in a child process, one after the
    other, so each one's peak memory is its own."""
    jobs = gpus = events = decisions = 0
    last_time = 0.0
    for _, e in read_file(path):
        events += 1
        jobs += isinstance(e, JobSubmitted)
        decisions += isinstance(e, DECISIONS)
        gpus += e.gpus if isinstance(e, NodeRegistered) else 0
        last_time = max(last_time, e.time)
    with tempfile.TemporaryDirectory(prefix="bench-audit-baseline-") as tree:
        revision.check_out(baseline, Path(tree))
        old = _run_child(Path(tree), path, whole=True)
    new = _run_child(ROOT, path, whole=False)
    for run in (old, new):
        assert run.checked == decisions  # the audit looked at every one of them
    virtual_s = last_time or 1.0
    return Figures(
        jobs=jobs,
        hours=round(virtual_s / 3600.0, 1),
        gpus=gpus,
        events=events,
        decisions=decisions,
        build_s=round(built_s, 2),
        baseline_revision=baseline,
        baseline=old,
        streaming=new,
        speed_ratio=round(new.decisions_per_s / max(old.decisions_per_s, 1), 2),
        memory_ratio=round(new.peak_mib / old.peak_mib, 2),
        day_s=round(new.seconds * 86400.0 / virtual_s, 1),
    )


def _run_child(tree: Path, path: Path, whole: bool) -> Run:
    request = msgspec.json.encode(Request(str(path), whole)).decode()
    how = "read whole" if whole else "streaming"
    out = revision.child_output(tree, CHILD, request, f"the audit ({how})")
    return msgspec.json.decode(out, type=Run)


@app.default
def main(
    *,
    hours: float = 24.0,
    nodes: int = 64,
    load: float = LOAD,
    save: Path | None = None,
    log: Path | None = None,
    baseline: str = "HEAD",
    output: Output = "text",
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
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as scratch:
        if log is not None:
            path, built = log, 0.0
        else:
            events, built = build(hours, nodes, load)
            path = save or Path(scratch) / "log.jsonl"
            save_export(events, path)
            del events  # the audits read the export, each in a process of its own
        try:
            figures = measure(path, built, baseline)
        except (ValueError, RuntimeError) as e:
            raise SystemExit(str(e)) from None
    if output == "json":
        doc = {"python": platform.python_version(), "results": msgspec.to_builtins(figures)}
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
        return
    _print_table(figures)
    if any(run.matched != figures.decisions for run in (figures.baseline, figures.streaming)):
        Console(stderr=True).print("[red]some decisions did not match: see fairlane audit[/]")
        raise SystemExit(1)


def _print_table(figures: Figures) -> None:
    table = Table(title="bench.audit", show_header=True, title_justify="left")
    title = f"baseline {figures.baseline_revision}, read whole"
    for column in ("", title, "now, streaming", "now / baseline"):
        table.add_column(column, justify="right")
    for key in ("jobs", "hours", "gpus", "events", "decisions", "build_s", "day_s"):
        table.add_row(key.replace("_", " "), "", f"{getattr(figures, key):,}", "")
    old, new = figures.baseline, figures.streaming
    ratios = {"decisions_per_s": figures.speed_ratio, "peak_mib": figures.memory_ratio}
    for key in ("seconds", "decisions_per_s", "events_per_s", "peak_mib", "start_mib", "plans"):
        ratio = ratios.get(key)
        table.add_row(
            key.replace("_", " "),
            f"{getattr(old, key):,}",
            f"{getattr(new, key):,}",
            "" if ratio is None else f"{ratio:,}",
        )
    Console().print(table)


if __name__ == "__main__":
    run_command(app)
