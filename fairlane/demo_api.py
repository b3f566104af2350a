"""The Run:AI exercise on a private embedded cluster, played and told through its HTTP API.

Two projects with 4 guaranteed GPUs each on one 8-GPU node: a training job of project-a takes
all 8 over quota; an interactive workspace of project-b reclaims its 4; once the workspace is
deleted the training job comes back with all 8. After each step the demo waits until the API
shows the step's outcome (or says what it saw instead), prints every project's usage, and at
the end the training job's timeline with the reason for its preemption.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from rich.console import Console

from cluster.embedded import down, up
from fairlane.client import Api, CliError, Target
from fairlane.cluster_view_cli import projects_table
from fairlane.timeline import print_timeline

TRAINING: Final = "large-training-job"
WORKSPACE: Final = "jupyter-workspace"
WAIT_S: Final = 90.0


def play_through_api(console: Console) -> bool:
    return asyncio.run(_play(console))


async def _play(console: Console) -> bool:
    """Start, play, stop in one event loop (the processes `up` starts are watched by it while
    they run); the exercise itself talks to the API from a thread."""
    with tempfile.TemporaryDirectory(prefix="fairlane-demo-") as folder:
        data = Path(folder) / "fl"
        with console.status("starting the cluster ..."):
            # its own scripted jobs in a private folder of this run: no tenant to keep apart,
            # and the interpreter that runs them may sit where no other user can read
            info = await up(data, gpus=8, insecure_same_user=True)
        try:
            token = Path(info.admin_token_file).read_text().strip()
            with Api(Target(info.api_url, token, "the demo's cluster")) as api:
                return await asyncio.to_thread(_exercise, console, api)
        except CliError as e:
            console.print(f"[red]the demo's cluster failed: {e}[/]")
            return False
        finally:
            with console.status("stopping the cluster ..."):
                await down(data)


def _exercise(console: Console, api: Api) -> bool:
    _until(api, "the node to register", lambda: len(api.get("/v1/nodes")) == 1)
    for project in ("project-a", "project-b"):
        api.put(f"/v1/projects/{project}", {"quota": 4})
    console.print("  projects: project-a and project-b, quota 4 GPUs each; one node of 8 GPUs")
    ok = True

    def step(what: str, expect: str, holds: Callable[[], bool]) -> None:
        nonlocal ok
        console.print(f"  [bold]{what}[/]")
        seen = _until(api, expect, holds)
        ok = ok and seen
        console.print(f"    {'[green]holds[/]' if seen else '[red]did not happen[/]'}: {expect}")
        projects_table(api.get("/v1/projects"))

    api.post("/v1/jobs", {"job_id": TRAINING, "project": "project-a", "class": "train", "gpus": 8})
    step(
        f"submit {TRAINING} (project-a, train, 8 GPUs)",
        "it runs on all 8 GPUs, 4 of them over quota",
        lambda: _job(api, TRAINING)["state"] == "running" and _usage(api) == (8, 0),
    )
    workspace = {"job_id": WORKSPACE, "project": "project-b", "class": "interactive", "gpus": 4}
    api.post("/v1/jobs", workspace)
    step(
        f"submit {WORKSPACE} (project-b, interactive, 4 GPUs)",
        f"{TRAINING} is preempted and waits; the workspace runs on project-b's quota",
        lambda: (
            _job(api, WORKSPACE)["state"] == "running"
            and _job(api, TRAINING)["state"] == "pending"
            and _usage(api) == (0, 4)
        ),
    )
    reason = (_job(api, TRAINING).get("pending_reason") or {}).get("message", "")
    console.print(f"    why {TRAINING} waits: [yellow]{reason}[/]")
    api.delete(f"/v1/jobs/{WORKSPACE}")
    step(
        f"delete {WORKSPACE}",
        f"{TRAINING} comes back on all 8 GPUs (attempt 2)",
        lambda: _job(api, TRAINING)["attempt"] == 2 and _usage(api) == (8, 0),
    )
    timeline = api.get(f"/v1/jobs/{TRAINING}/timeline", limit=500)["items"]
    print_timeline(timeline, title=f"Timeline of {TRAINING} (from the API)", job=False)
    return ok


def _job(api: Api, job_id: str) -> dict[str, Any]:
    found: dict[str, Any] = api.get(f"/v1/jobs/{job_id}")
    return found


def _usage(api: Api) -> tuple[int, int]:
    usage = {p["name"]: sum(pool["usage"] for pool in p["pools"]) for p in api.get("/v1/projects")}
    return usage.get("project-a", 0), usage.get("project-b", 0)


def _until(api: Api, what: str, holds: Callable[[], bool]) -> bool:
    """Whether `holds` came true within WAIT_S (the read models follow the log closely, but
    a preemption takes the workload's checkpoint and the grace period)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            if holds():
                return True
        except CliError:  # not projected yet (a job submitted a moment ago)
            pass
        time.sleep(0.3)
    return False
