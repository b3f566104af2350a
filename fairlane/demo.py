"""`fairlane demo`: the Run:AI preemption exercise, played for real, told as a timeline.

By default it runs on a private embedded cluster (`fairlane up` in a temporary folder:
nats-server, PostgreSQL, the services, a node executor running real workloads, the projector
and the HTTP API) and plays the exercise through the API, as `fairlane submit` / `delete`
would, printing each project's usage after every step and the training job's timeline as the
API tells it; `--engine core` plays it on the pure policy instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.table import Table

from cluster.tool_log import log_like_services
from events import Event, JobNominated, JobPreempted, JobPreemptionRequested, JobScheduled
from fairlane.demo_api import play_through_api
from simulation.scenario.core_engine import CoreEngine
from simulation.scenario.observe import check
from simulation.scenario.runner import run_file
from simulation.spec import Scenario, load_scenario

SUITE = Path(__file__).resolve().parent.parent / "scenarios"
EXERCISE = SUITE / "runai-preemption-exercise.yaml"
EXAMPLES = (
    "runai-preemption-exercise.yaml",
    "determined-priority-demo.yaml",
    "pause-resume.yaml",
    "resource-pools.yaml",
)


def run_demo(console: Console, engine: Literal["core", "live"] = "live") -> bool:
    scenario = load_scenario(EXERCISE)
    console.rule(f"[bold]{scenario.name}[/] ({engine} engine)")
    console.print(scenario.description.strip(), style="dim")
    if engine == "live":
        console.print(
            "[dim]A private embedded cluster: nats-server with JetStream, PostgreSQL, admission, "
            "the quota ledger, the scheduler, the preemptor, a node executor running real "
            "workloads, the projector and the HTTP API; the exercise is played through the "
            "API.[/]"
        )
        ok = play_through_api(console)
    else:
        ok, log = _play_core(console, scenario)
        _print_timeline(console, log, "large-training-job")
    console.rule("[bold]Example scenarios (core engine)")
    for name in EXAMPLES:
        result = run_file(SUITE / name)
        ok = ok and result.verdict == "pass"
        colour = "green" if result.verdict == "pass" else "red"
        console.print(f"  [{colour}]{result.verdict.upper():4}[/] {result.name}")
        for problem in result.problems:
            console.print(f"       {problem}")
    return ok


def _play_core(console: Console, scenario: Scenario) -> tuple[bool, list[Event]]:
    engine = CoreEngine(scenario)
    ok = True
    for step in scenario.steps:
        if step.kind == "expect":
            ok = _report(console, step.number, check(step.value, engine.observe())) and ok
        else:
            engine.step(step)
            console.print(f"  step {step.number}: {step.kind} {_what(step.value)}")
    return ok, engine.vc.log


def _report(console: Console, number: int, problems: list[str]) -> bool:
    mark = "[green]holds[/]" if not problems else "[red]" + "; ".join(problems) + "[/]"
    console.print(f"  step {number}: expect ... {mark}")
    return not problems


def _print_timeline(console: Console, log: list[Event], job: str) -> None:
    mine = [e for e in log if getattr(e, "job_id", None) == job]
    if not mine:
        return
    start = mine[0].time
    table = Table(title=f"Timeline of {job}", title_justify="left")
    for column in ("time", "event", "details"):
        table.add_column(column)
    for event in mine:
        table.add_row(f"+{event.time - start:.2f}s", type(event).__name__, _details(event))
    console.print(table)


def _what(value: object) -> str:
    if isinstance(value, list):
        return ", ".join(getattr(v, "id", str(v)) for v in value)
    return str(getattr(value, "name", value))


def _details(event: Event) -> str:
    match event:
        case JobScheduled(replicas=replicas, attempt=attempt, note=note):
            where = ", ".join(f"{r.node}:{','.join(map(str, r.gpus))}" for r in replicas)
            return f"attempt {attempt} on {where}" + (f" ({note})" if note else "")
        case JobPreemptionRequested(reason=reason, for_job=for_job, facts=facts):
            text = f"reason {reason}" + (f", to make room for {for_job}" if for_job else "")
            if facts is not None:
                text += f"\nfair shares {facts.fair_share}, usage {facts.usage}\n{facts.note}"
            return text
        case JobPreempted(reason=reason, checkpointed=checkpointed):
            return f"stopped ({reason})" + (", checkpoint saved" if checkpointed else "")
        case JobNominated(victims=victims):
            return f"GPUs held while {', '.join(victims)} stop"
    return ""


def demo_command(engine: Literal["core", "live"] = "live") -> None:
    """Play the Run:AI preemption exercise and print the training job's timeline, with the
    reason for its preemption and the job it made room for; then check the example scenarios.

    Parameters
    ----------
    engine
        live: a private embedded cluster, driven through its HTTP API; core: the pure policy.
    """
    log_like_services("warning")
    if not run_demo(Console(soft_wrap=True, highlight=False), engine):
        raise SystemExit(1)
