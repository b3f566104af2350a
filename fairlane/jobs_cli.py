"""Job commands, through the HTTP API: submit, list, describe, logs, delete, update, pause and
resume."""

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

from fairlane import gpus_cli
from fairlane.api_options import Connection, connected
from fairlane.client import (
    PROJECT_ENV,
    Api,
    ApiError,
    CliError,
    closest,
    config_path,
    default_project,
)
from fairlane.output import (
    USAGE,
    MaybeGpus,
    MaybeWhole,
    Output,
    Whole,
    ago,
    console,
    duration,
    emit,
    err,
    errors_said,
    fail,
    flags_named,
    parse_when,
    state,
)
from fairlane.timeline import fold_progress, left_out, past_events, print_timeline
from fairlane.volumes_cli import parse_volume

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
#: The flag of each submit request field not spelt `--field-name` (for errors that name it).
SUBMIT_FLAGS = {
    "job_id": "JOB",
    "pools": "--pool",
    "preemption_delay_s": "--preemption-delay",
    "min_runtime_s": "--min-runtime",
    "grace_s": "--grace",
    "ports": "--port",
    "volumes": "--volume",
    "working_dir": "--working-dir",
}


def submit(
    job_id: str | None = None,
    /,
    *workload: str,
    file: Annotated[Path | None, cyclopts.Parameter(name=["--file", "-f"])] = None,
    project: str | None = None,
    job_class: Annotated[str | None, cyclopts.Parameter(name="--class")] = None,
    priority: MaybeWhole = None,
    gpus: MaybeGpus = None,
    replicas: MaybeWhole = None,
    min_replicas: MaybeWhole = None,
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
    volume: list[str] | None = None,
    idempotency_key: str | None = None,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Submit a job.

    Everything after `--` is the workload's command, dash-led arguments included:

    ```
    fairlane submit train-1 --project team-a --class train --gpus 2 -- python3 train.py --lr 0.1
    fairlane submit -f job.yaml --gpus 4
    ```

    A job spec file (-f) holds the same fields as the flags, spelt as they are (`name` for the
    job's name): `name: train-1`, `gpus: 2`, `command: [python3, train.py]`, `env: {A: "1"}`.
    Flags given as well win over the file.

    Parameters
    ----------
    job_id
        A unique name: letters, digits, '-' and '_' (or `name` in the file).
    file
        A job spec in YAML: the same fields as the flags.
    workload
        The workload's command and its arguments (after `--`); default: the built-in workload.
    project
        The project (team) the job belongs to (default: FAIRLANE_PROJECT, else `project:` in
        the config file, as `fairlane login --project` saves it).
    job_class
        Priority class: train, interactive, build, inference (or the cluster's own).
    priority
        An explicit priority instead of a class (higher is more important).
    gpus
        Whole GPUs per replica (0: CPU only; default 1).
    replicas
        Replicas, placed together as one gang (default 1).
    min_replicas
        Fewer than replicas makes the job elastic.
    pool
        Pools to try in order (repeat the flag).
    node
        Run only on this node.
    image
        The container image the command runs in (nodes whose executor runs `--runtime docker`;
        refused where the nodes run processes, as `fairlane up` starts them by default).
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
    volume
        HOST:CONTAINER[:ro|rw] (or HOST for the same path): a folder of the node each replica's
        container sees, read-only unless `:rw` (repeat the flag). Only under the folders an
        admin allows (`fairlane volumes list`); refused where the nodes run processes.
    idempotency_key
        Submitting again with the same key returns the first answer instead of a second job.
    """
    given: dict[str, Any] = {}
    with errors_said():
        if file is not None:
            from fairlane.job_file import job_fields  # noqa: PLC0415 (msgspec, YAML: slow)

            given = job_fields(file)
        job_id = job_id or given.get("name")
        if not job_id:
            raise CliError("name the job: submit NAME, or `name:` in the file (-f)", USAGE)
        project = project or given.get("project") or _project_or_fail()
    argv = [*(command or ()), *workload] or _as_list(given.get("command"))
    body: dict[str, Any] = {
        "job_id": job_id,
        "project": project,
        "gpus": _first(gpus, given.get("gpus"), 1),
        "replicas": _first(replicas, given.get("replicas"), 1),
        "command": argv,
        "pools": pool or _as_list(given.get("pool")),
    }
    optional = {
        "class": _first(job_class, given.get("class")),
        "priority": _first(priority, given.get("priority")),
        "min_replicas": _first(min_replicas, given.get("min-replicas")),
        "node": _first(node, given.get("node")),
        "image": _first(image, given.get("image")),
        "preemptible": _first(preemptible, given.get("preemptible")),
        "preemption_delay_s": _first(preemption_delay, given.get("preemption-delay")),
        "min_runtime_s": _first(min_runtime, given.get("min-runtime")),
        "grace_s": _first(grace, given.get("grace")),
        "idempotency_key": _first(idempotency_key, given.get("idempotency-key")),
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    from_file = given.get("env")
    if isinstance(from_file, dict):
        body["env"] = {str(k): str(v) for k, v in from_file.items()}
    elif from_file:
        env = [*_as_list(from_file), *(env or [])]
    if env:
        body["env"] = {**body.get("env", {}), **_environment(env)}
    if port:
        body["ports"] = _ports(port)
    volumes = [*_as_list(given.get("volume")), *(volume or [])]
    if volumes:
        body["volumes"] = [parse_volume(v) for v in volumes]
    sent = {**body, "volumes": volumes}  # (errors show the values as given)
    with errors_said(), connected(connection) as api, flags_named(sent, SUBMIT_FLAGS):
        folder = _working_dir(
            _first(working_dir, given.get("working-dir")),
            local=_on_this_machine(api.target.api),
            image=body.get("image"),
        )
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


def _first(*values: Any) -> Any:
    """The first value given (a flag's, then the file's, then a default)."""
    return next((v for v in values if v is not None), None)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _project_or_fail() -> str:
    found = default_project()
    if found is None:
        raise CliError(
            f"which project? give --project NAME (or set {PROJECT_ENV}, or project: in the "
            f"config file {config_path()}: fairlane login --project NAME)",
            USAGE,
        )
    return found[0]


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
        "JobPriorityChanged": "changed",
        "ProjectConfigured": "configured",
        "PoolConfigured": "configured",
    }.get(kind, kind)
    detail = ""
    if kind == "JobAdmitted":
        detail = f" (priority {event.get('priority')}, pool {', '.join(event.get('pools', []))})"
    elif kind == "JobPriorityChanged":
        detail = f": priority {event.get('priority')}"
    console.print(f"{escape(what)} {words}{escape(detail)} [dim]({kind})[/]")


def list_jobs(
    *,
    project: str | None = None,
    all_projects: bool = False,
    job_state: Annotated[JobState | None, cyclopts.Parameter(name="--state")] = None,
    pool: str | None = None,
    limit: Whole = 500,
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
        Only this project's jobs (default: FAIRLANE_PROJECT, else `project:` in the config
        file, else every project).
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
        with errors_said():
            project = (default_project() or (None, ""))[0]
    sent = {"project": project, "state": job_state, "pool": pool, "limit": limit}
    with errors_said(), connected(connection) as api, flags_named(sent):
        jobs = _all_jobs(api, limit, project=project, state=job_state, pool=pool)
        jobs = gpus_cli.jobs_with_gpus(jobs, gpus_cli.report(api))  # utilization, idle flag
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
    table.add_column("GPU UTIL", justify="right", no_wrap=True)
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
            gpus_cli.job_utilization(j),
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
    event_type: Annotated[list[str] | None, cyclopts.Parameter(name="--type")] = None,
    limit: Whole = 50,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """A job: its state, GPUs, attempts, why it waits, and for a failed one its exit code, the
    reason and the last lines of its output; with --events, its newest events with the reason
    for each decision (progress reports folded into the latest).

    ```
    fairlane describe train-1 --events
    fairlane describe train-1 --events --type JobPreempted --limit 10
    ```

    With -o json or yaml: the job (with `failure` for a failed one), or
    {"job": ..., "events": [...]} with --events.

    Parameters
    ----------
    events
        Also the job's events, each with its reason and the job it made room for.
    event_type
        With --events, only events of this type (repeat the flag).
    limit
        With --events, at most this many of its newest events (1 to 2000), once progress
        reports are folded.
    """
    if not 1 <= limit <= DESCRIBE_EVENTS_MAX:
        fail(f"--limit must be between 1 and {DESCRIBE_EVENTS_MAX}, got {limit}", USAGE)
    with errors_said(), connected(connection) as api, flags_named({"type": event_type}):
        job = job_or_suggest(api, job_id)
        if job["state"] == "failed":
            job = {**job, "failure": _failure(api, job)}
        if not events:
            emit(job, output, _describe_table)
            return
        path = f"/v1/jobs/{job_id}/timeline"
        found, more = past_events(api, path, DESCRIBE_EVENTS_MAX, types=event_type)
        folded = fold_progress(found)
        emit({"job": job, "events": folded[-limit:]}, output, _describe_with_events)
        if more or len(folded) > limit:
            err.print(f"[dim]{left_out(min(limit, len(folded)), None)}[/]")


#: Lines of a failed job's output that `describe` shows.
FAILURE_LINES = 10


def _failure(api: Api, job: dict[str, Any]) -> dict[str, Any]:
    """Why a failed job failed: its last attempt's exit code and reason, and the last lines
    of that attempt's output."""
    path = f"/v1/jobs/{job['job_id']}"
    page = api.get(f"{path}/timeline", type=["JobFailed"], newest=True, limit=1)
    failed = page["items"][-1]["event"] if page["items"] else {}
    try:
        text = api.get_text(f"{path}/logs", attempt=job["attempt"] or None, max_bytes=16384)
    except ApiError:  # no output kept (or none yet): the exit code and reason still say why
        text = ""
    return {
        "attempt": failed.get("attempt", job["attempt"]),
        "exit_code": failed.get("exit_code", 1),  # (the log leaves out the default, 1)
        "reason": failed.get("reason", ""),
        "output_tail": text.splitlines()[-FAILURE_LINES:],
    }


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
    if job.get("volumes"):
        rows.append(("Volumes", escape(", ".join(job["volumes"]))))
    reason = job.get("pending_reason")
    if reason:
        rows.append(
            ("Why pending", f"[yellow]{escape(reason['message'])}[/] [dim]({reason['code']})[/]")
        )
    if job.get("reject_reason"):
        rows.append(("Rejected", f"[red]{escape(job['reject_reason'])}[/]"))
    failure = job.get("failure")
    if failure:
        why = f"exit code {failure['exit_code']}" + (
            f": {failure['reason']}" if failure["reason"] else ""
        )
        rows.append(("Failed", f"[red]{escape(why)}[/] (attempt {failure['attempt']})"))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    if failure:
        console.print()
        if failure["output_tail"]:
            console.print(f"[bold]Last lines of its output[/] (fairlane logs {job['job_id']}):")
            for line in failure["output_tail"]:
                console.print("  " + escape(line))
        else:
            console.print("[dim]it wrote no output[/]")


def logs(
    job_id: str,
    /,
    *,
    attempt: MaybeWhole = None,
    follow: Annotated[bool, cyclopts.Parameter(name=["--follow", "-f"])] = False,
    tail: MaybeWhole = None,
    since: str | None = None,
    connection: Connection | None = None,
) -> None:
    """A job's output, as its workload wrote it (every replica's; lines prefixed by replica
    where there are several).

    ```
    fairlane logs train-1 --attempt 1
    fairlane logs train-1 --tail 20 -f
    fairlane logs train-1 --since 10m
    ```

    Parameters
    ----------
    attempt
        Which attempt (default: the latest).
    follow
        Keep printing output as it comes, until the attempt ends (Ctrl-C stops).
    tail
        Only its last this many lines (with --follow: then what comes).
    since
        Only what it wrote from this time on (10m, 2h, 1d ago; 2026-11-25T14:00; Unix
        seconds), to the second or so the node ships output in.
    """
    if attempt is not None and attempt < 1:
        fail(f"--attempt must be 1 or more, got {attempt}", USAGE)
    if tail is not None and tail < 0:
        fail(f"--tail must be 0 or more, got {tail}", USAGE)
    sent = {"attempt": attempt, "since": since}
    with errors_said(), connected(connection) as api, flags_named(sent):
        start = parse_when(since, "--since") if since is not None else None
        job = job_or_suggest(api, job_id)
        out = sys.stdout.buffer
        path = f"/v1/jobs/{job_id}/logs"
        try:
            if follow and job["attempt"] == 0:  # not started yet: wait for it
                err.print(f"[dim]waiting for {escape(job_id)} to start ({job['state']}) ...[/]")
                while job["attempt"] == 0 and job["state"] in WAITING:
                    time.sleep(1.0)
                    job = api.get(f"/v1/jobs/{job_id}")
            written = 0
            if tail is not None:  # the end of what there is, then (following) what comes
                now = time.time()
                text = api.get_text(path, attempt=attempt, since=start)
                last = text.splitlines(keepends=True)[-tail:] if tail else []
                written += out.write("".join(last).encode())
                out.flush()
                start = now
            if tail is None or follow:
                for chunk in api.stream(path, attempt=attempt, follow=follow, since=start):
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


def _command(api: Api, job_id: str, verb: str) -> dict[str, Any]:
    """Delete, pause or resume a job: the API's answer; an unknown job's error names the
    closest job names."""
    try:
        if verb == "delete":
            answer: dict[str, Any] = api.delete(f"/v1/jobs/{job_id}")
        else:
            answer = api.post(f"/v1/jobs/{job_id}/{verb}")
    except ApiError as e:
        if e.status == 404 and e.field == "job_id":
            raise CliError(f"{e}{closest(job_id, api.job_names())}") from None
        raise
    return answer


def _act(job_id: str, verb: str, connection: Connection | None, output: Output) -> None:
    with errors_said(), connected(connection) as api:
        answer = _command(api, job_id, verb)
        emit(answer, output, lambda a: _said(a, f"job {job_id}"))


#: States from which a job will not run again: `delete --all` leaves them be.
FINISHED = frozenset({"completed", "failed", "cancelled", "rejected"})


def delete(
    *job_ids: Annotated[str, cyclopts.Parameter(name="JOB")],
    all_jobs: Annotated[bool, cyclopts.Parameter(name="--all", negative="")] = False,
    project: str | None = None,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Delete (cancel) jobs; running ones are stopped.

    ```
    fairlane delete train-1 train-2
    fairlane delete --all --project team-a
    ```

    With -o json or yaml: each deletion's answer, in order.

    Parameters
    ----------
    job_ids
        The jobs to delete.
    all_jobs
        Every job of the project that has not finished (--project, else the default project).
    project
        With --all: the project (default: FAIRLANE_PROJECT, else `project:` in the config).
    """
    if all_jobs == bool(job_ids):
        fail("name the jobs to delete, or give --all (with --project)", USAGE)
    if project is not None and not all_jobs:
        fail("--project goes with --all; named jobs are deleted whatever their project", USAGE)
    with errors_said(), connected(connection) as api:
        if all_jobs:
            project = project or _project_or_fail()
            with flags_named({"project": project}):
                found = _all_jobs(api, 10_000, project=project)
            job_ids = tuple(j["job_id"] for j in found if j["state"] not in FINISHED)
            if not job_ids:
                err.print(f"project {escape(project)} has no job left to delete")
        answers: list[dict[str, Any]] = []
        failed: list[str] = []
        for job_id in job_ids:
            try:
                answers.append(_command(api, job_id, "delete"))
            except CliError as e:  # say so and go on with the others
                err.print(f"[red]error:[/] job {escape(job_id)}: {escape(str(e))}")
                failed.append(job_id)
        emit(answers, output, _all_said)
    if failed:
        sys.exit(1)


def _all_said(answers: list[dict[str, Any]]) -> None:
    for answer in answers:
        _said(answer, f"job {answer.get('event', {}).get('job_id', '')}")


def update(
    job_id: str,
    /,
    *,
    priority: MaybeWhole = None,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Change a waiting or running job: its priority (the policy weighs it from its next
    cycle on; higher is more important).

    ```
    fairlane update train-1 --priority 80
    ```

    Parameters
    ----------
    priority
        The job's new priority.
    """
    if priority is None:
        fail("say what to change: --priority N", USAGE)
    body = {"priority": priority}
    with errors_said(), connected(connection) as api, flags_named(body):
        try:
            answer = api.patch(f"/v1/jobs/{job_id}", body)
        except ApiError as e:
            if e.status == 404 and e.field == "job_id":
                raise CliError(f"{e}{closest(job_id, api.job_names())}") from None
            raise
        emit(answer, output, lambda a: _said(a, f"job {job_id}"))


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
