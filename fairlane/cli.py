"""The `fairlane` command line."""

from __future__ import annotations

import sys
from typing import Literal

import cyclopts

from fairlane.output import EXIT_STATUS_HELP

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
# Every command is imported only when it runs (an import path, with its help here): a
# command's startup pays for its own module alone, and `fairlane --help` for none.
EVERYDAY: tuple[tuple[str, str, str], ...] = (
    ("fairlane.submit_cli:submit", "submit", "Submit a job."),
    ("fairlane.jobs_cli:list_jobs", "list", "Jobs, in submission order."),
    ("fairlane.jobs_cli:describe", "describe",
     "A job: its state, GPUs, attempts and why it waits or failed; --events, its timeline."),
    ("fairlane.jobs_cli:logs", "logs", "A job's output, as its workload wrote it."),
    ("fairlane.job_actions_cli:delete", "delete",
     "Delete (cancel) jobs; running ones are stopped."),
    ("fairlane.job_actions_cli:pause", "pause",
     "Pause a job: it checkpoints, gives its GPUs back and waits until resumed."),
    ("fairlane.job_actions_cli:resume", "resume", "Resume a paused job: it queues again for GPUs."),
    ("fairlane.job_actions_cli:update", "update", "Change a waiting or running job's priority."),
    ("fairlane.cluster_view_cli:projects", "projects",
     "Projects per pool: quota, weight, limit, priority, fair share, GPUs in use."),
    ("fairlane.cluster_view_cli:project_app", "project",
     "Set a project's quota, weight, limit, priority."),
    ("fairlane.cluster_view_cli:pool_app", "pool", "Pools and their scheduler settings."),
    ("fairlane.nodes_cli:nodes", "nodes",
     "Nodes: pool, GPUs, free GPUs, and their state (ready, cordoned, drained or lost)."),
    ("fairlane.nodes_cli:node_app", "node",
     "Add nodes to a cluster and stop them; take them out of service and back."),
    ("fairlane.volumes_cli:volumes_app", "volumes",
     "Host folders jobs may mount (--volume): allow, deny, list."),
    ("fairlane.nodes_cli:cluster_info", "cluster-info",
     "The cluster at a glance: each pool's nodes, GPUs and queue, and the nodes."),
    ("fairlane.events_cli:events", "events",
     "Events, newest last, each with its reason: the cluster's, or a job's, project's or node's."),
    ("fairlane.top:top", "top", "A live view of the pools, the projects and the queue."),
    ("fairlane.access_cli:login", "login",
     "Save the API's URL, your token and your project in the config file."),
    ("fairlane.access_cli:whoami", "whoami",
     "Who your token says you are: its projects, admin or not, when it expires."),
    ("fairlane.access_cli:token_app", "token", "API tokens (admin): create, list, revoke."),
)  # fmt: skip
for path, name, summary in EVERYDAY:
    app.command(path, name=name, help=summary)
app.command(
    "fairlane.scenario_cli:scenario_app",
    name="scenario",
    help="Run scenario files (YAML) on the core or live engine and check their expectations.",
)
app.command(
    "fairlane.simulate_cli:simulate",
    name="simulate",
    help="Replay a real trace through the policy: waits, utilisation, preemptions.",
)
app.command(
    "fairlane.projections_cli:projections_app",
    name="projections",
    help="The PostgreSQL read models: rebuild them from the whole log.",
)
app.command(
    "fairlane.cluster_cli:up_command",
    name="up",
    help="Start an embedded cluster: nats-server, PostgreSQL, the services and one node executor.",
)
app.command(
    "fairlane.cluster_cli:down_command",
    name="down",
    help="Stop the embedded cluster in --data-dir, its workloads included.",
)
app.command(
    "fairlane.cluster_cli:status_command",
    name="status",
    help="The embedded cluster's services: running, restarts, last exit.",
)
app.command(
    "fairlane.demo:demo_command",
    name="demo",
    help="Play the Run:AI preemption exercise on a private cluster and print what the API tells.",
)
app.command(
    "fairlane.audit_cli:log_app",
    name="log",
    help="The cluster's event log: export it as JSON lines.",
)
app.command(
    "fairlane.audit_cli:audit_command",
    name="audit",
    help="Re-derive every decision on the log with the policy and report any that differs.",
)
app.command(
    "fairlane.whatif_cli:whatif",
    name="whatif",
    help="Replay the recorded workload under changed settings, side by side with what happened.",
)
app.command(
    "fairlane.deploy_cli:deploy_app",
    name="deploy",
    help="Compose deployments: NATS credentials, stream provisioning, migrations.",
)


@app.command
def completion(shell: Literal["bash", "zsh", "fish"], /) -> None:
    """Print the shell completion script, for example: eval "$(fairlane completion bash)"."""
    sys.stdout.write(app.generate_completion(prog_name="fairlane", shell=shell))


def _whole_help_for(args: list[str]) -> None:
    """The command being run is registered again without its one-line summary: the summary
    is for the list of commands, and would otherwise replace, on the command's own --help
    page, all its docstring says (its examples, its parameters' prose)."""
    for path, name, _ in EVERYDAY:
        if args[:1] == [name]:
            del app[name]
            app.command(path, name=name)


def main() -> None:
    _whole_help_for(sys.argv[1:])
    app()


if __name__ == "__main__":
    main()
