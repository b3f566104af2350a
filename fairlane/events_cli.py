"""The cluster's events, past or live, through the HTTP API (`fairlane events`)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import cyclopts
from rich.markup import escape

from fairlane.api_options import Connection, connected
from fairlane.client import Api, named
from fairlane.output import (
    USAGE,
    Output,
    Whole,
    clock,
    console,
    emit,
    err,
    errors_said,
    fail,
    flags_named,
    parse_when,
    to_yaml,
)
from fairlane.timeline import details, left_out, past_events, print_timeline

EVENTS_MAX = 10_000


def events(
    *,
    job: str | None = None,
    project: str | None = None,
    node: str | None = None,
    event_type: Annotated[list[str] | None, cyclopts.Parameter(name="--type")] = None,
    since: str | None = None,
    limit: Whole = 100,
    follow: Annotated[bool, cyclopts.Parameter(name=["--follow", "-f"])] = False,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Events, each with its reason: the newest of the whole cluster's, or of one job's,
    project's or node's, oldest first; a line on stderr says when earlier (or later) ones
    were left out. --follow prints new ones as they happen (Ctrl-C stops).

    ```
    fairlane events --job train-1
    fairlane events --since 1h --type JobPreempted --type JobPreemptionRequested
    fairlane events --follow -o json
    ```

    Parameters
    ----------
    job
        Only this job's events.
    project
        Only this project's events and its jobs'.
    node
        Only this node's events and its jobs'.
    event_type
        Only events of this type (repeat the flag).
    since
        The first events from this time on (10m, 2h, 1d ago; 2026-11-25T14:00; Unix seconds)
        instead of the newest.
    limit
        At most this many past events (1 to 10000); with --follow, the last this many first.
    """
    if sum(x is not None for x in (job, project, node)) > 1:
        fail("give at most one of --job, --project and --node", USAGE)
    if not 1 <= limit <= EVENTS_MAX:
        fail(f"--limit must be between 1 and {EVENTS_MAX}, got {limit}", USAGE)
    path = "/v1/timeline"
    with errors_said():  # (`--job ''` is a bad name, not no filter: it listed every event)
        if job is not None:
            path = f"/v1/jobs/{named('--job', job)}/timeline"
        elif project is not None:
            path = f"/v1/projects/{named('--project', project)}/timeline"
        elif node is not None:
            path = f"/v1/nodes/{named('--node', node)}/timeline"
    sent = {"type": event_type, "since": since, "limit": limit, "job_id": job, "name": project}
    flags = {"job_id": "--job", "name": "--project"}
    with errors_said(), connected(connection) as api, flags_named(sent, flags):
        if not follow:
            start = parse_when(since, "--since") if since is not None else None
            found, more = past_events(api, path, limit, types=event_type, since=start)
            emit(found, output, print_timeline)
            if more:
                err.print(f"[dim]{left_out(len(found), since)}[/]")
            return
        with contextlib.suppress(KeyboardInterrupt):
            _follow(api, job, project, node, event_type, output)


def _follow(
    api: Api,
    job: str | None,
    project: str | None,
    node: str | None,
    types: list[str] | None,
    output: str,
) -> None:
    """The live stream (server-sent events), filtered here for what the stream cannot."""
    for kind, event in _sse(api.stream("/v1/events", job=job)):
        if types and kind not in types:
            continue
        if project and event.get("project") != project:
            continue
        if node and node not in json.dumps(event):
            continue
        if output == "table":
            entry = {"type": kind, "event": event, "time": event.get("time", 0), "applied": True}
            what = str(event.get("job_id") or event.get("project") or event.get("node") or "-")
            console.print(
                f"{clock(entry['time'])}  {kind:24} {escape(what):24} {escape(details(entry))}"
            )
        elif output == "json":
            sys.stdout.write(json.dumps({"type": kind, "event": event}) + "\n")
        else:
            sys.stdout.write("---\n" + to_yaml({"type": kind, "event": event}))
        sys.stdout.flush()


def _sse(chunks: Iterator[bytes]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event type, event) from a server-sent event stream."""
    buffer = b""
    for chunk in chunks:
        buffer += chunk
        while b"\n\n" in buffer or b"\r\n\r\n" in buffer:
            block, _, buffer = buffer.replace(b"\r\n", b"\n").partition(b"\n\n")
            kind, data = "", []
            for line in block.decode(errors="replace").splitlines():
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())
            if kind and data:
                yield kind, json.loads("\n".join(data))
