"""Job commands, through the HTTP API: submit, list, describe, logs, delete, pause, resume."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

import cyclopts
from rich.markup import escape
from rich.table import Table

from fairlane.api_options import Connection, connected
from fairlane.client import Api, ApiError, CliError, closest
from fairlane.output import (
    USAGE,
    Output,
    ago,
    console,
    duration,
    emit,
    err,
    errors_said,
    fail,
    state,
)
from fairlane.timeline import print_timeline

JobState = Literal[
    "submitted", "pending", "starting", "running", "stopping", "paused",
    "completed", "failed", "cancelled", "rejected",
]  # fmt: skip
#: States of a job that may still start.
WAITING = frozenset({"submitted", "pending", "paused"})
#: The longest `--working-dir` (PATH_MAX; the API's and the services' bound too).
MAX_WORKING_DIR: Final = 4096
#: Most events `describe --events` shows (the API pages them; `events --job` goes further).
DESCRIBE_EVENTS_MAX = 2000


def register(app: cyclopts.App) -> None:
    for command in (submit, list_jobs, describe, logs, delete, pause, resume):
        name = "list" if command is list_jobs else None
        app.command(command, name=name)


def submit(
    job_id: str,
    /,
    *workload: str,
    project: str,
    job_class: Annotated[str | None, cyclopts.Parameter(name="--class")] = None,
    priority: int | None = None,
    gpus: int = 1,
    replicas: int = 1,
    min_replicas: int | None = None,
    pool: list[str] | None = None,
    node: str | None = None,
    image: str | None = None,
    command: list[str] | None = None,
    env: Annotated[list[str] | None, cyclopts.Parameter(name=["--env", "-e"])] = None,
    preemptible: bool | None = None,
    preemption_delay: float | None = None,
    min_runtime: float | None = None,
    grace: float | None = None,
    working_dir: str | None = None,
    port: list[str] | None = None,
    idempotency_key: str | None = None,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Submit a job.

    Everything after `--` is the workload's command, dash-led arguments included:

    ```
    fairlane submit train-1 --project team-a --class train --gpus 2 -- python3 train.py --lr 0.1
    ```

    Parameters
    ----------
    job_id
        A unique name: letters, digits, '-' and '_'.
    workload
        The workload's command and its arguments (after `--`); default: the built-in workload.
    project
        The project (team) the job belongs to.
    job_class
        Priority class: train, interactive, build, inference (or the cluster's own).
    priority
        An explicit priority instead of a class (higher is more important).
    gpus
        GPUs per replica (0: CPU only).
    replicas
        Replicas, placed together as one gang.
    min_replicas
        Fewer than replicas makes the job elastic.
    pool
        Pools to try in order (repeat the flag).
    node
        Run only on this node.
    image
        The container image the command runs in (nodes whose executor runs `--runtime docker`).
    command
        The workload's command, one flag per argument (or give it after `--`).
    env
        KEY=VALUE for the workload's environment (repeat the flag).
    preemptible
        Whether it may be preempted (default: from its class).
    preemption_delay
        Seconds it waits pending before it may preempt others.
    min_runtime
        Seconds it runs before it may be preempted.
    grace
        Seconds between SIGTERM and SIGKILL when it is stopped (default: the cluster's).
    working_dir
        The folder the workload runs in on its node (its checkpoint folder is only named in
        FAIRLANE_CHECKPOINT_DIR). Default: with no --image and the cluster on this machine,
        the folder `submit` is run in; with an image, the image's own.
    port
        HOST:CONTAINER (or PORT for both): each replica publishes it on its node, shown as a
        URL by describe and list (repeat the flag). A job waits for a node where its host
        ports are free.
    idempotency_key
        Submitting again with the same key returns the first answer instead of a second job.
    """
    argv = [*(command or ()), *workload]
    body: dict[str, Any] = {
        "job_id": job_id,
        "project": project,
        "gpus": gpus,
        "replicas": replicas,
        "command": argv,
        "pools": pool or [],
    }
    optional = {
        "class": job_class,
        "priority": priority,
        "min_replicas": min_replicas,
        "node": node,
        "image": image,
        "preemptible": preemptible,
        "preemption_delay_s": preemption_delay,
        "min_runtime_s": min_runtime,
        "grace_s": grace,
        "idempotency_key": idempotency_key,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if env:
        body["env"] = _environment(env)
    if port:
        body["ports"] = _ports(port)
    with errors_said(), connected(connection) as api:
        folder = _working_dir(working_dir, local=_on_this_machine(api.target.api), image=image)
        if folder is not None:
            body["working_dir"] = folder
        answer = api.post("/v1/jobs", body)
        emit(answer, output, lambda a: _said(a, f"job {job_id}"))


LOCAL_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_PORT: Final = 65535


def _on_this_machine(api_url: str) -> bool:
    """Whether the API (so, for `fairlane up`, the whole cluster) runs on this machine."""
    return urlsplit(api_url).hostname in LOCAL_HOSTS


def _working_dir(given: str | None, local: bool, image: str | None) -> str | None:
    """The job's working directory: checked here where the nodes share this machine's
    folders, before anything is sent (elsewhere the node's executor says so if it is not
    there)."""
    if given is None:
        return os.getcwd() if local and image is None else None
    if len(given) > MAX_WORKING_DIR:
        fail(f"--working-dir is longer than {MAX_WORKING_DIR} characters", USAGE)
    if not local:
        if not given.startswith("/"):
            fail(f"--working-dir must be an absolute path on the nodes, got {given!r}", USAGE)
        return given
    folder = Path(given).expanduser().absolute()
    if not folder.is_dir():
        fail(f"--working-dir {given!r}: no such directory on this machine", USAGE)
    return str(folder)


def _environment(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            fail(f"--env takes KEY=VALUE, got {pair!r}", USAGE)
        env[key] = value
    return env


def _ports(given: list[str]) -> list[dict[str, int]]:
    """`--port HOST:CONTAINER` or `--port PORT`, each a number in 1..65535, no host port
    twice (a node publishes it once)."""
    ports: list[dict[str, int]] = []
    for value in given:
        host, colon, container = value.partition(":")
        try:
            pair = (int(host), int(container) if colon else int(host))
        except ValueError:
            fail(f"--port takes HOST:CONTAINER or PORT, got {value!r}", USAGE)
        if not all(1 <= p <= MAX_PORT for p in pair):
            fail(f"--port {value!r}: ports are between 1 and {MAX_PORT}", USAGE)
        if any(p["host"] == pair[0] for p in ports):
            fail(f"--port {value!r}: host port {pair[0]} is given twice", USAGE)
        ports.append({"host": pair[0], "container": pair[1]})
    return ports


def _said(answer: dict[str, Any], what: str) -> None:
    """A command's answer in words: the event it led to."""
    event = answer.get("event", {})
    kind = answer.get("type", "")
    words = {
        "JobAdmitted": "admitted",
        "JobSubmitted": "submitted",
        "JobCancelled": "deleted",
        "JobPaused": "paused",
        "JobResumed": "resumed",
        "ProjectConfigured": "configured",
        "PoolConfigured": "configured",
    }.get(kind, kind)
    detail = ""
    if kind == "JobAdmitted":
        detail = f" (priority {event.get('priority')}, pool {', '.join(event.get('pools', []))})"
    console.print(f"{escape(what)} {words}{escape(detail)} [dim]({kind})[/]")


def list_jobs(
    *,
    project: str | None = None,
    all_projects: bool = False,
    job_state: Annotated[JobState | None, cyclopts.Parameter(name="--state")] = None,
    pool: str | None = None,
    limit: int = 500,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Jobs, in submission order.

    ```
    fairlane list --project team-a --state running
    ```

    Parameters
    ----------
    project
        Only this project's jobs (default: FAIRLANE_PROJECT, else every project).
    all_projects
        Every project's jobs, whatever FAIRLANE_PROJECT says.
    job_state
        Only jobs in this state.
    pool
        Only jobs in this pool.
    limit
        At most this many jobs (1 to 10000).
    """
    if not 1 <= limit <= 10_000:
        fail(f"--limit must be between 1 and 10000, got {limit}", USAGE)
    if project is None and not all_projects:
        project = os.environ.get("FAIRLANE_PROJECT") or None
    with errors_said(), connected(connection) as api:
        jobs = _all_jobs(api, limit, project=project, state=job_state, pool=pool)
        emit(jobs, output, _jobs_table)


def _all_jobs(api: Api, limit: int, **filters: Any) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    after: int | None = None
    while len(jobs) < limit:
        page = api.get("/v1/jobs", limit=min(500, limit - len(jobs)), after=after, **filters)
        jobs += page["items"]
        after = page["next"]
        if after is None:
            break
    return jobs


def _jobs_table(jobs: list[dict[str, Any]]) -> None:
    if not jobs:
        console.print("no jobs")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    # names whole (up to 48 characters): the other columns give way first
    for column, key in (("JOB", "job_id"), ("PROJECT", "project")):
        table.add_column(column, no_wrap=True, min_width=min(48, max(len(j[key]) for j in jobs)))
    table.add_column("STATE", no_wrap=True, min_width=9)
    table.add_column("FOR", justify="right", no_wrap=True)
    for column in ("GPUS", "REPLICAS", "POOL", "NODES", "ATTEMPT"):
        table.add_column(column)
    table.add_column("PREEMPTED", justify="right")
    urls = any(j.get("ports") for j in jobs)  # a column only where a job publishes ports
    if urls:
        table.add_column("URL", no_wrap=True)
    now = time.time()
    for j in jobs:
        replicas = str(j["replicas"])
        if j["min_replicas"] != j["replicas"]:
            replicas += f" (min {j['min_replicas']})"
        table.add_row(
            escape(j["job_id"]),
            escape(j["project"]),
            state(j["state"]),
            duration(now - j["state_since"]),
            f"{j['gpus_held']}/{j['gpus'] * j['replicas']}",
            replicas,
            escape(j["pool"] or "-"),
            escape(",".join(j["nodes"]) or "-"),
            str(j["attempt"]),
            str(j["preemptions"]),
            *([_urls(j)] if urls else []),
        )
    console.print(table)


def _urls(job: dict[str, Any]) -> str:
    """Where a job's ports are reached, or its ports while it runs nowhere."""
    if job.get("urls"):
        return escape(" ".join(job["urls"]))
    return escape(" ".join(job.get("ports", ()))) or "-"


def job_or_suggest(api: Api, job_id: str) -> dict[str, Any]:
    """The job, or an error naming the closest job names."""
    try:
        found: dict[str, Any] = api.get(f"/v1/jobs/{job_id}")
    except ApiError as e:
        if e.status == 404:
            raise CliError(f"no job named {job_id!r}{closest(job_id, api.job_names())}") from None
        raise
    return found


def describe(
    job_id: str,
    /,
    *,
    events: bool = False,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """A job: its state, GPUs, attempts and why it waits; with --events, its timeline with the
    reason for each decision.

    ```
    fairlane describe train-1 --events
    ```

    With -o json or yaml: the job, or {"job": ..., "events": [...]} with --events.

    Parameters
    ----------
    events
        Also the job's events, each with its reason and the job it made room for.
    """
    with errors_said(), connected(connection) as api:
        job = job_or_suggest(api, job_id)
        if not events:
            emit(job, output, _describe_table)
            return
        timeline = _job_events(api, job_id)
        emit({"job": job, "events": timeline}, output, _describe_with_events)


def _job_events(api: Api, job_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after: int | None = None
    while len(items) < DESCRIBE_EVENTS_MAX:
        page = api.get(f"/v1/jobs/{job_id}/timeline", limit=500, after=after)
        items += page["items"]
        after = page["next"]
        if after is None:
            break
    return items


def _describe_with_events(data: dict[str, Any]) -> None:
    _describe_table(data["job"])
    console.print()
    print_timeline(data["events"], title="Events", job=False)


def _describe_table(job: dict[str, Any]) -> None:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    requested = job["gpus"] * job["replicas"]
    rows = [
        ("Job", escape(job["job_id"])),
        ("Project", escape(job["project"])),
        ("State", f"{state(job['state'])} since {ago(job['state_since'])}"),
        ("Priority", f"{job['priority']}" + ("" if job["preemptible"] else " (non-preemptible)")),
        ("GPUs", f"{job['gpus']} x {job['replicas']} = {requested}, holding {job['gpus_held']}"),
        ("Pool", escape(job["pool"] or ", ".join(job["pools"]) or "-")),
        ("Nodes", escape(", ".join(job["nodes"]) or "-")),
        ("Attempt", str(job["attempt"])),
        ("Queued", duration(job["queued_s"])),
        ("Ran", f"{duration(job['running_s'])} ({job['gpu_hours']:.2f} GPU hours)"),
        ("Preempted", f"{job['preemptions']} time(s)"),
    ]  # fmt: skip
    if job.get("ports"):
        rows.append(("Ports", escape(", ".join(job["ports"]))))
        rows.append(("URL", escape(" ".join(job.get("urls") or ())) or "- (not running)"))
    reason = job.get("pending_reason")
    if reason:
        rows.append(
            ("Why pending", f"[yellow]{escape(reason['message'])}[/] [dim]({reason['code']})[/]")
        )
    if job.get("reject_reason"):
        rows.append(("Rejected", f"[red]{escape(job['reject_reason'])}[/]"))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)


def logs(
    job_id: str,
    /,
    *,
    attempt: int | None = None,
    follow: Annotated[bool, cyclopts.Parameter(name=["--follow", "-f"])] = False,
    connection: Connection | None = None,
) -> None:
    """A job's output, as its workload wrote it (every replica's; lines prefixed by replica
    where there are several).

    ```
    fairlane logs train-1 --attempt 1
    fairlane logs train-1 -f
    ```

    Parameters
    ----------
    attempt
        Which attempt (default: the latest).
    follow
        Keep printing output as it comes, until the attempt ends (Ctrl-C stops).
    """
    if attempt is not None and attempt < 1:
        fail(f"--attempt must be 1 or more, got {attempt}", USAGE)
    with errors_said(), connected(connection) as api:
        job = job_or_suggest(api, job_id)
        out = sys.stdout.buffer
        try:
            if follow and job["attempt"] == 0:  # not started yet: wait for it
                err.print(f"[dim]waiting for {escape(job_id)} to start ({job['state']}) ...[/]")
                while job["attempt"] == 0 and job["state"] in WAITING:
                    time.sleep(1.0)
                    job = api.get(f"/v1/jobs/{job_id}")
            written = 0
            for chunk in api.stream(f"/v1/jobs/{job_id}/logs", attempt=attempt, follow=follow):
                written += out.write(chunk)
                out.flush()
        except KeyboardInterrupt:
            out.flush()
            return
        if not written:  # say so on stderr: an empty screen reads like a broken command
            err.print(f"[dim]{_no_output(job_id, attempt or job['attempt'])}[/]")


def _no_output(job_id: str, attempt: int) -> str:
    text = f"attempt {attempt} of {escape(job_id)} has written no output yet"
    if attempt > 1:
        earlier = "--attempt 1" if attempt == 2 else f"--attempt 1 to {attempt - 1}"
        text += f" (earlier attempts: {earlier})"
    return text


def _act(job_id: str, verb: str, connection: Connection | None, output: Output) -> None:
    with errors_said(), connected(connection) as api:
        try:
            if verb == "delete":
                answer = api.delete(f"/v1/jobs/{job_id}")
            else:
                answer = api.post(f"/v1/jobs/{job_id}/{verb}")
        except ApiError as e:
            if e.status == 404 and e.field == "job_id":
                raise CliError(f"{e}{closest(job_id, api.job_names())}") from None
            raise
        emit(answer, output, lambda a: _said(a, f"job {job_id}"))


def delete(
    job_id: str, /, *, connection: Connection | None = None, output: Output = "table"
) -> None:
    """Delete (cancel) a job; a running one is stopped.

    fairlane delete train-1
    """
    _act(job_id, "delete", connection, output)


def pause(
    job_id: str, /, *, connection: Connection | None = None, output: Output = "table"
) -> None:
    """Pause a job: it checkpoints, gives its GPUs back and waits until resumed.

    fairlane pause train-1
    """
    _act(job_id, "pause", connection, output)


def resume(
    job_id: str, /, *, connection: Connection | None = None, output: Output = "table"
) -> None:
    """Resume a paused job: it queues again for GPUs.

    fairlane resume train-1
    """
    _act(job_id, "resume", connection, output)
