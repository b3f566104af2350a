"""The `fairlane` command line."""

from __future__ import annotations

import sys
from typing import Literal

import cyclopts
from rich.console import Console

from fairlane import cluster_view_cli, jobs_cli
from fairlane.cluster_cli import register
from fairlane.demo import run_demo
from fairlane.output import EXIT_STATUS_HELP
from fairlane.projections_cli import projections_app
from fairlane.scenario_cli import scenario_app
from fairlane.simulate_cli import simulate
from fairlane.top import top
from services.runtime.main import configure_logging

HELP = f"""Fairlane: share GPUs between teams with quotas, over-quota lending and reclaim.

```
fairlane up --gpus 8 --detach
fairlane project set team-a --quota 4
fairlane submit train-1 --project team-a --class train --gpus 4 -- python3 train.py
fairlane list ; fairlane describe train-1 --events ; fairlane logs train-1 -f
fairlane projects ; fairlane top
```

The job and cluster commands talk to the HTTP API: --api/--token, else FAIRLANE_API and
FAIRLANE_TOKEN, else ~/.config/fairlane/config.yaml (api, token or token_file), else the
embedded cluster in ./.fairlane and its admin token. Every one takes -o json and -o yaml.

{EXIT_STATUS_HELP}"""

app = cyclopts.App(
    name="fairlane",
    help=HELP,
    help_format="md",
    default_parameter=cyclopts.Parameter(negative_iterable=()),
)
app.command(scenario_app, name="scenario")
app.command(simulate, name="simulate")
app.command(projections_app, name="projections")
register(app)
jobs_cli.register(app)
cluster_view_cli.register(app)
app.command(top)


@app.command
def demo(engine: Literal["core", "live"] = "live") -> None:
    """Play the Run:AI preemption exercise and print the training job's timeline, with the
    reason for its preemption and the job it made room for; then check the example scenarios."""
    configure_logging("warning")
    if not run_demo(Console(soft_wrap=True), engine):
        raise SystemExit(1)


@app.command
def completion(shell: Literal["bash", "zsh", "fish"], /) -> None:
    """Print the shell completion script, for example: eval "$(fairlane completion bash)"."""
    sys.stdout.write(app.generate_completion(prog_name="fairlane", shell=shell))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
