"""Jobs as they are, through the HTTP API: list, describe and logs."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any, Literal

import cyclopts
from rich.markup import escape
from rich.table import Table

from fairlane import gpus_cli
from fairlane.api_options import Connection, connected
from fairlane.client import (
    Api,
    ApiError,
    CliError,
    closest,
    default_project,
    named,
)
from fairlane.output import (
    USAGE,
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

JobState = Literal[
    "submitted", "pending", "starting", "running", "stopping", "paused",
    "completed", "failed", "cancelled", "rejected",
]  # fmt: skip
#: States of a job that may still start.
WAITING = frozenset({"submitted", "pending", "paused"})
#: Most events `describe --events` shows (the API pages them; `events --job` goes further).
DESCRIBE_EVENTS_MAX = 2000


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
        jobs = listed(api, limit, project=project, state=job_state, pool=pool)
        jobs = gpus_cli.jobs_with_gpus(jobs, gpus_cli.report(api))  # utilization, idle flag
        emit(jobs, output, _jobs_table)


def listed(api: Api, limit: int, **filters: Any) -> list[dict[str, Any]]:
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
        found: dict[str, Any] = api.get(f"/v1/jobs/{named('JOB', job_id)}")
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
