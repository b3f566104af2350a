"""`fairlane scenario run`: check scenario files against the policy (or the live services)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import cyclopts
import msgspec
from rich.console import Console
from rich.markup import escape

from cluster.tool_log import log_like_services
from fairlane.output import USAGE, fail
from simulation.scenario.runner import EngineName, Result, run_file

scenario_app = cyclopts.App(
    name="scenario", help="Scenario files: a cluster, steps, and what must hold after them."
)


@scenario_app.command
def run(
    files: list[Path],
    /,
    *,
    engine: Annotated[EngineName, cyclopts.Parameter(name=["--engine", "-e"])] = "core",
    output: Annotated[
        Literal["text", "json"], cyclopts.Parameter(name=["--output", "-o"])
    ] = "text",
) -> None:
    """Run scenario files and check every expectation.

    Prints one line per scenario, and for each failed expectation what was expected and what was
    observed. Exits 1 if any scenario failed or could not be read.

    Parameters
    ----------
    files
        Scenario YAML files (see scenarios/FORMAT.md), or folders: every `*.yaml` and `*.yml`
        file in one and its subfolders, in name order.
    engine
        core: the pure policy with a virtual clock (fast, no servers). live: the real services
        on an embedded NATS, with real workloads, or on a virtual clock with simulated ones
        when the scenario moves time or simulates work. in-process: the services in one
        process on the in-memory log and a virtual clock.
    output
        text for people, json for scripts (one object with every result).
    """
    console = Console(highlight=False, soft_wrap=True)
    log_like_services("warning")  # the live engine's services talk; only problems matter here
    results = [run_file(path, engine) for path in _scenario_files(files)]
    if output == "json":
        sys.stdout.write(msgspec.json.encode(results).decode() + "\n")
    else:
        for result in results:
            _print(console, result)
        counts = {
            v: sum(r.verdict == v for r in results) for v in ("pass", "fail", "skip", "error")
        }
        console.print(
            f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped"
            + (f", {counts['error']} errors" if counts["error"] else "")
        )
    if any(r.verdict in ("fail", "error") for r in results):
        sys.exit(1)


def _scenario_files(given: list[Path]) -> list[Path]:
    """The files named, each folder replaced by the scenario files under it (a folder with
    none is a usage error: it was likely the wrong one)."""
    found: list[Path] = []
    for path in given:
        if not path.is_dir():
            found.append(path)  # (one that cannot be read is that scenario's error)
            continue
        inside = sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
        if not inside:
            fail(f"FILES: the folder {str(path)!r} holds no scenario file (*.yaml, *.yml)", USAGE)
        found.extend(inside)
    return found


def _print(console: Console, result: Result) -> None:
    style = {"pass": "green", "fail": "red", "skip": "yellow", "error": "red"}[result.verdict]
    label = result.verdict.upper()
    detail = f"{result.expectations} expectations" if result.verdict in ("pass", "fail") else ""
    if result.reason:
        detail = result.reason
    name, path = escape(result.name), escape(result.path)
    console.print(f"[{style}]{label:5}[/] {name} [dim]({path})[/] {escape(detail)}")
    for problem in result.problems:
        console.print(f"      {escape(problem)}")
