"""`fairlane simulate`: the command line over `simulation.trace`."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import cyclopts
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from events import CheckpointModel
from events.model import VictimOrder
from fairlane.output import USAGE_FLAGS
from policy.decay import settings_problem
from simulation.trace.cluster import ClusterSpec, load_cluster, uniform_cluster
from simulation.trace.errors import SimulationError
from simulation.trace.policies import PolicyName, make_policy
from simulation.trace.report import print_report, result_dict
from simulation.trace.run import CycleMode, Options, Outcome, Simulation
from simulation.trace.traces import Slice, load_trace, select
from simulation.trace.units import parse_duration
from simulation.virtual_cluster import NotSettled

DEFAULT_OUT = Path("fairlane-simulation")
DEFAULT_NODES = 8
DEFAULT_GPUS_PER_NODE = 8


@contextmanager
def simulation_errors(err: Console) -> Iterator[None]:
    """Bad input exits 2 and a policy that never settles exits 1, each said in one line."""
    try:
        yield
    except SimulationError as e:
        err.print(f"[red]error:[/] {e}")
        sys.exit(2)
    except NotSettled as e:
        err.print(f"[red]policy error:[/] {e}")
        sys.exit(1)


def simulate(
    *,
    trace: Annotated[str | None, cyclopts.Parameter(name=["--trace", "-t"])] = None,
    scenario: Path | None = None,
    usage_half_life: str | None = None,
    usage_k: float = 1.0,
    traces_dir: Path | None = None,
    from_: Annotated[str | None, cyclopts.Parameter(name="--from")] = None,
    to: str | None = None,
    projects: str | None = None,
    first: int | None = None,
    split: int = 1,
    quotas: Path | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    cluster: Path | None = None,
    policy: PolicyName = "fair_share",
    victim_order: VictimOrder = "newest",
    cycles: CycleMode = "round",
    round_: Annotated[str, cyclopts.Parameter(name="--round")] = "360s",
    las_thresholds: str = "1,10",
    checkpoint_every: str = "30m",
    save: str = "20s",
    restore: str = "40s",
    cycle_on_checkpoint: bool = False,
    output: Annotated[
        Literal["text", "json"], cyclopts.Parameter(name=["--output", "-o"])
    ] = "text",
    out: Path | None = None,
    progress: bool = True,
) -> None:
    """Replay a workload trace through the scheduling policy on a virtual clock.

    Jobs arrive at their trace times and run for their trace durations on simulated nodes;
    the same policy code as the scheduler service decides what runs, preempts and resumes.
    Prints the results (JCT, queueing delay, makespan, utilization, preemptions, GPU-hours
    lost, per-project fairness) as tables and writes PNG plots, or one JSON object with -o json.
    Exits 2 on bad input, 1 if the policy fails to settle. See docs/simulator.md.

    With --scenario FILE the workload is a scenario file's steps instead (scenarios/FORMAT.md,
    run on the core engine; its expectations are not checked), and the report gives each
    project's GPU-hours up to the last step and plots each project's GPUs over time
    (allocation.png).

    Parameters
    ----------
    trace
        philly (all virtual clusters), philly:11vc (the 11 that philly_vc.csv sizes),
        itp:clusterNN (01-10), muri (the 400-job Muri testbed trace), or a file: .csv with
        columns job_id,submit_s,duration_s,gpus[,project][,priority], or .yaml with
        jobs: [{id, submit, duration, gpus, project, priority}].
    scenario
        A scenario file whose steps are the workload (instead of --trace).
    usage_half_life
        Time-aware fairness (rule 11) with this half-life (2h, 1d); with --scenario in the
        cluster's scheduler and every pool's own, whatever the file says ("off" turns it off).
    usage_k
        With --usage-half-life: how strongly the usage history moves the shares (default 1).
    traces_dir
        Folder holding the published traces. Default: $FAIRLANE_TRACES, else the first
        shared/traces found walking up from the repository.
    from_
        Keep jobs submitted at or after this: a date (2017-10-01 or '2017-10-01 12:00:00',
        UTC) for philly, seconds of the trace's clock for the others.
    to
        Keep jobs submitted at or before this (same forms; a bare date includes that day).
    projects
        Keep only these projects, comma-separated (philly: virtual cluster ids).
    first
        Keep only the first N jobs (after the other filters), in submission order.
    split
        Traces without a project column (itp, muri, files without one) are split into this
        many projects p0, p1, ... by a CRC-32 of the job id. Default 1: one project, p0.
    quotas
        YAML file of quotas: `project: gpus` or `project: {quota, over_quota_weight, limit,
        priority}`. Projects it leaves out get quota 0. Default: each project's share of the
        offered load (GPU-seconds) times the cluster's GPUs, largest remainder.
    nodes
        Nodes in the simulated cluster (default 8).
    gpus_per_node
        GPUs per node (default 8). Jobs larger than a node become gangs of ceil(gpus / G)
        replicas; jobs that can never fit are rejected and counted.
    cluster
        YAML file with config (fitting only), pools, nodes and projects in the scenario
        format, instead of --nodes/--gpus-per-node.
    policy
        fair_share (quotas, fair share, reclaim), priority (trace priorities, preempts lower),
        fifo (one queue in arrival order with backfill, never preempts), srtf (shortest
        remaining time first), srsf (shortest remaining service: time x GPUs), las (Tiresias
        least attained service with discrete queues).
    victim_order
        Among victims of equal priority: newest first, or cost (least work lost first).
    cycles
        When the scheduler runs: round (the default: once per round in which something
        happened, as the Tiresias/Muri simulators do; fast on long traces) or event (on every
        arrival and finish, exactly as the scheduler service does; several times slower).
    round_
        Round length (e.g. 360s, 6m): when cycles are per round, and when srtf/srsf/las
        priorities are refreshed.
    las_thresholds
        las queue boundaries in GPU-hours of attained service, comma-separated (1,10: three
        queues).
    checkpoint_every
        Jobs save a checkpoint after every this much work; a preemption loses the work since
        the last one. 0: no checkpoints, a preemption loses everything.
    save
        Time to save a checkpoint: weighed by cost-aware victim choice; saving runs alongside
        training, so it costs no GPU time.
    restore
        Time to restore on resume: the job holds its GPUs without progress.
    cycle_on_checkpoint
        With event cycles, also run a cycle whenever a checkpoint is saved, as the scheduler
        service does (a checkpoint is an event on its log). Only cost-aware victim choice can
        decide differently then; much slower on long traces.
    output
        text: tables, plus PNG plots in --out. json: one JSON object on stdout.
    out
        Folder for the plots (utilization.png, queue.png, jct_cdf.png). Default
        ./fairlane-simulation with text output; with json, plots only if given.
    progress
        Show a progress bar on stderr (only when stderr is a terminal).
    """
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if scenario is not None or trace is None:
        with simulation_errors(err):
            if trace is not None or scenario is None:
                raise SimulationError("give either --trace or --scenario")
            _simulate_scenario(scenario, _usage(usage_half_life, usage_k), output, out)
        return
    with simulation_errors(err):
        setup, sim = _prepare(
            trace=trace,
            traces_dir=traces_dir,
            part=Slice(from_, to, _names(projects), first),
            split=split,
            quotas=quotas,
            cluster=_cluster(cluster, nodes, gpus_per_node),
            options=_options(
                policy=policy,
                victim_order=victim_order,
                cycles=cycles,
                round_=round_,
                las_thresholds=las_thresholds,
                checkpoint_every=checkpoint_every,
                save=save,
                restore=restore,
                cycle_on_checkpoint=cycle_on_checkpoint,
                usage=_usage(usage_half_life, usage_k),
            ),
        )
        outcome = _run(sim, err, show=progress and err.is_terminal)
    plots_to = out if out is not None or output == "json" else DEFAULT_OUT
    plots: list[Path] = []
    if plots_to is not None:
        # imported here: matplotlib adds over a second to every start of the fairlane command
        from simulation.trace.plots import Curves, write_plots  # noqa: PLC0415

        end = outcome.summary.makespan_s
        title = f"{setup['trace']} - {setup['policy']} ({setup['victim_order']} victims)"
        curves = Curves(outcome.series, outcome.jct_s, sim.recorder.capacity, end)
        plots = write_plots(curves, plots_to, title)
    if output == "json":
        sys.stdout.write(json.dumps(result_dict(outcome, setup), indent=2) + "\n")
        return
    console = Console(highlight=False)
    if not console.is_terminal:  # a file or a pipe: do not squeeze the tables into 80 columns
        console = Console(highlight=False, width=120)
    print_report(console, outcome, setup)
    if plots:
        console.print("plots: " + ", ".join(str(p) for p in plots))


def _usage(half_life: str | None, k: float) -> tuple[float | None, float] | None:
    """Rule 11's settings to simulate with (None: the file's, or off for a trace); a bad value
    is named."""
    if half_life is None:
        return None
    seconds = None if half_life == "off" else parse_duration(half_life, "--usage-half-life")
    problem = settings_problem(seconds, k, USAGE_FLAGS)
    if problem is not None:
        raise SimulationError(problem)
    return seconds, k


def _simulate_scenario(
    path: Path, usage: tuple[float | None, float] | None, output: str, out: Path | None
) -> None:
    from simulation.trace import scenario as run  # noqa: PLC0415 (the scenario engines)

    outcome = run.run_scenario(path, usage)
    setup: dict[str, Any] = {"scenario": str(path), "name": outcome.scenario.name}
    settings = outcome.scenario.config.scheduler
    setup["usage_half_life_s"] = settings.usage_half_life_s
    setup["usage_k"] = settings.usage_k
    plots_to = out if out is not None or output == "json" else DEFAULT_OUT
    plots: list[Path] = []
    if plots_to is not None:
        from simulation.trace.plots import Curves, write_allocation, write_plots  # noqa: PLC0415

        title = f"{outcome.scenario.name}"
        if settings.usage_half_life_s is not None:
            title += (
                f" (usage half-life {settings.usage_half_life_s / 3600:g}h, k {settings.usage_k:g})"
            )
        curves = Curves(outcome.series, outcome.jct_s, outcome.capacity, outcome.end_s)
        plots = write_plots(curves, plots_to, title)
        a = outcome.allocation
        plots.append(
            write_allocation(a.time, a.gpus, outcome.end_s, plots_to / "allocation.png", title)
        )
    if output == "json":
        sys.stdout.write(json.dumps(run.result_dict(outcome, setup), indent=2) + "\n")
        return
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=120)
    run.print_report(console, outcome, setup)
    if plots:
        console.print("plots: " + ", ".join(str(p) for p in plots))


def _prepare(
    *,
    trace: str,
    traces_dir: Path | None,
    part: Slice,
    split: int,
    quotas: Path | None,
    cluster: tuple[ClusterSpec, str],
    options: Options,
) -> tuple[dict[str, Any], Simulation]:
    loaded = load_trace(trace, traces_dir, split)
    jobs = select(loaded, part)
    spec, described = cluster
    sim = Simulation(jobs, spec, options, quotas)
    origin: object = round(sim.workload.origin_s, 3)
    if loaded.dated:
        origin = datetime.fromtimestamp(sim.workload.origin_s, UTC).isoformat(sep=" ")
    cp = options.checkpoint
    setup: dict[str, Any] = {
        "trace": trace,
        "slice": {
            "from": part.start,
            "to": part.end,
            "projects": list(part.projects) or None,
            "first": part.first,
        },
        "origin": origin,
        "cluster": described,
        "gpus": spec.gpus,
        "policy": options.policy.name,
        "victim_order": options.victim_order,
        "cycles": options.cycles,
        "round_s": options.round_s,
        "checkpoint": None
        if cp is None
        else {"every_s": cp.every_s, "save_s": cp.save_s, "restore_s": cp.restore_s},
    }
    if split > 1:
        setup["split"] = split
    if options.cycle_on_checkpoint:
        setup["cycle_on_checkpoint"] = True
    return setup, sim


def _run(sim: Simulation, err: Console, show: bool) -> Outcome:
    if not show:
        return sim.run()
    bar = Progress(
        TextColumn("simulating"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,} jobs done"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )
    task = bar.add_task("jobs", total=len(sim.workload.jobs))
    shown = 0.0

    def report(done: int, total: int) -> None:
        nonlocal shown
        if time.monotonic() - shown > 0.1:  # the bar redraws at 10 Hz anyway
            bar.update(task, completed=done)
            shown = time.monotonic()

    with bar:
        return sim.run(report)


def _cluster(path: Path | None, nodes: int | None, gpus: int | None) -> tuple[ClusterSpec, str]:
    if path is not None:
        if nodes is not None or gpus is not None:
            raise SimulationError("give either --cluster or --nodes/--gpus-per-node, not both")
        spec = load_cluster(path)
        return spec, str(path)
    n = DEFAULT_NODES if nodes is None else nodes
    g = DEFAULT_GPUS_PER_NODE if gpus is None else gpus
    return uniform_cluster(n, g), f"{n} x {g} GPUs"


def _options(
    *,
    policy: PolicyName,
    victim_order: VictimOrder,
    cycles: CycleMode,
    round_: str,
    las_thresholds: str,
    checkpoint_every: str,
    save: str,
    restore: str,
    cycle_on_checkpoint: bool,
    usage: tuple[float | None, float] | None = None,
) -> Options:
    try:
        thresholds = tuple(float(t) for t in _names(las_thresholds))
    except ValueError:
        raise SimulationError(
            f"--las-thresholds: {las_thresholds!r} is not a list of GPU-hours like 1,10"
        ) from None
    every = parse_duration(checkpoint_every, "--checkpoint-every")
    checkpoint = (
        CheckpointModel(
            every_s=every,
            save_s=parse_duration(save, "--save"),
            restore_s=parse_duration(restore, "--restore"),
        )
        if every > 0
        else None
    )
    return Options(
        policy=make_policy(policy, thresholds),
        victim_order=victim_order,
        checkpoint=checkpoint,
        round_s=parse_duration(round_, "--round"),
        cycles=cycles,
        cycle_on_checkpoint=cycle_on_checkpoint,
        usage_half_life_s=None if usage is None else usage[0],
        usage_k=1.0 if usage is None else usage[1],
    )


def _names(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip()) if text else ()
