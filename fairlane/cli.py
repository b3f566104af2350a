"""The `fairlane` command line."""

from __future__ import annotations

from typing import Literal

import cyclopts
from rich.console import Console

from fairlane.cluster_cli import register
from fairlane.demo import run_demo
from fairlane.deploy_cli import deploy_app
from fairlane.projections_cli import projections_app
from fairlane.scenario_cli import scenario_app
from fairlane.simulate_cli import simulate
from services.runtime.main import configure_logging

app = cyclopts.App(
    name="fairlane",
    help="Fairlane: share GPUs between teams with quotas, over-quota lending and reclaim.",
)
app.command(scenario_app, name="scenario")
app.command(simulate, name="simulate")
app.command(projections_app, name="projections")
app.command(deploy_app, name="deploy")
register(app)


@app.command
def demo(engine: Literal["core", "live"] = "live") -> None:
    """Play the Run:AI preemption exercise and print the training job's timeline, with the
    reason for its preemption and the job it made room for; then check the example scenarios."""
    configure_logging("warning")
    if not run_demo(Console(soft_wrap=True), engine):
        raise SystemExit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
