"""What the cluster holds, through the HTTP API: projects (and setting them), pools, nodes,
and the events, past or live."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import cyclopts
from rich.markup import escape
from rich.table import Table

from fairlane.api_options import Connection, connected
from fairlane.client import Api
from fairlane.output import (
    USAGE,
    MaybeWhole,
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


def projects(
    name: str | None = None,
    /,
    *,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Projects per pool: quota, over-quota weight, limit, priority, fair share, GPUs in use,
    and whether they are over quota.

    ```
    fairlane projects
    fairlane projects team-a -o yaml
    ```

    Parameters
    ----------
    name
        Only this project.
    """
    with errors_said(), connected(connection) as api:
        found = [api.get(f"/v1/projects/{name}")] if name else api.get("/v1/projects")
        emit(found, output, projects_table)


def projects_table(found: list[dict[str, Any]]) -> None:
    if not found:
        console.print("no projects")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("PROJECT")
    table.add_column("POOL")
    for column in ("QUOTA", "WEIGHT", "LIMIT", "PRIORITY", "FAIR SHARE", "IN USE"):
        table.add_column(column, justify="right")
    table.add_column("OVER QUOTA")
    for project in found:
        for p in project["pools"]:
            over = "[yellow]yes[/]" if p["over_quota"] else "no"
            table.add_row(
                escape(project["name"]),
                escape(p["pool"]),
                str(p["quota"]),
                str(p["over_quota_weight"]),
                "-" if p["limit"] is None else str(p["limit"]),
                str(p["priority"]),
                str(p["fair_share"]),
                str(p["usage"]),
                over,
            )
    console.print(table)


def project_set(
    name: str,
    /,
    *,
    quota: MaybeWhole = None,
    pool: str | None = None,
    weight: MaybeWhole = None,
    limit: MaybeWhole = None,
    no_limit: bool = False,
    priority: MaybeWhole = None,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Create or change a project in one pool (admin token); what is not given keeps its value.

    ```
    fairlane project set team-a --quota 4 --weight 1 --limit 6
    ```

    Parameters
    ----------
    quota
        Guaranteed GPUs.
    pool
        The pool (default: the default compute pool).
    weight
        Over-quota weight: its share of idle GPUs beyond quotas (0: none).
    limit
        Hard cap on GPUs.
    no_limit
        Remove the limit.
    priority
        Project priority (higher is served first).
    """
    body: dict[str, Any] = {"no_limit": no_limit}
    given = {"pool": pool, "quota": quota, "over_quota_weight": weight, "limit": limit}
    body.update({k: v for k, v in {**given, "priority": priority}.items() if v is not None})
    with (
        errors_said(),
        connected(connection) as api,
        flags_named(body, {"over_quota_weight": "--weight"}),
    ):
        answer = api.put(f"/v1/projects/{name}", body)
        emit(answer, output, lambda a: _configured(f"project {name}", a))


def pool_set(
    name: str,
    /,
    *,
    scheduler: Literal["fair_share", "priority", "round_robin"] | None = None,
    fitting: Literal["best", "worst"] = "best",
    victim_order: Literal["newest", "cost"] = "newest",
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Create a pool or set its own scheduler settings (they replace the cluster's as a whole;
    admin token).

    ```
    fairlane pool set default --scheduler fair_share --fitting best --victim-order cost
    ```

    Parameters
    ----------
    scheduler
        The pool's scheduler; leave out to follow the cluster's settings.
    fitting
        best packs, worst spreads (with --scheduler).
    victim_order
        newest, or cost (least lost work) (with --scheduler).
    """
    body = {"scheduler": scheduler, "fitting": fitting, "victim_order": victim_order}
    with errors_said(), connected(connection) as api, flags_named(body):
        answer = api.put(f"/v1/pools/{name}", body)
        emit(answer, output, lambda a: _configured(f"pool {name}", a))


project_app = cyclopts.App(name="project", help="Set a project's quota, weight, limit, priority.")
project_app.command(project_set, name="set")
pool_app = cyclopts.App(name="pool", help="Pools and their scheduler settings.")
pool_app.command(pool_set, name="set")


def _configured(what: str, answer: dict[str, Any]) -> None:
    event = answer.get("event", {})
    if "terms" in event:  # a project: its terms in each pool
        parts = [
            f"in {pool}: quota {t['quota']}, weight {t['over_quota_weight']}, "
            f"limit {'none' if t['limit'] is None else t['limit']}, priority {t['priority']}"
            for pool, t in event["terms"].items()
        ]
        text = "; ".join(parts)
    else:
        settings = event.get("scheduler")
        text = f"scheduler {_pairs(settings)}" if settings else "follows the cluster's settings"
    console.print(f"{escape(what)} configured {escape(text)} [dim]({answer.get('type')})[/]")


def _pairs(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in values.items())


def nodes(*, connection: Connection | None = None, output: Output = "table") -> None:
    """Nodes: pool, GPUs, free GPUs, lost or not.

    fairlane nodes
    """
    with errors_said(), connected(connection) as api:
        emit(api.get("/v1/nodes"), output, _nodes_table)


def _nodes_table(found: list[dict[str, Any]]) -> None:
    if not found:
        console.print("no nodes")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("NODE")
    table.add_column("POOL")
    table.add_column("GPUS", justify="right")
    table.add_column("FREE", justify="right")
    table.add_column("STATE")
    for n in found:
        lost = "[red]lost[/]" if n["lost"] else "[green]ready[/]"
        table.add_row(escape(n["node"]), escape(n["pool"]), str(n["gpus"]), str(n["free"]), lost)
    console.print(table)


def cluster_info(*, connection: Connection | None = None, output: Output = "table") -> None:
    """The cluster at a glance: each pool's nodes, GPUs (free, allocated) and queue, and the
    nodes.

    ```
    fairlane cluster-info -o json
    ```
    """
    with errors_said(), connected(connection) as api:
        info = {"api": api.target.api, "pools": api.get("/v1/pools"), "nodes": api.get("/v1/nodes")}
        emit(info, output, _cluster_table)


def _cluster_table(info: dict[str, Any]) -> None:
    console.print(f"Fairlane API at {escape(info['api'])}")
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("POOL")
    for column in ("NODES", "GPUS", "FREE", "ALLOCATED", "QUEUED JOBS"):
        table.add_column(column, justify="right")
    for p in info["pools"]:
        table.add_row(
            escape(p["pool"]),
            str(p["nodes"]),
            str(p["gpus"]),
            str(p["free"]),
            str(p["allocated"]),
            str(p["queued_jobs"]),
        )
    console.print(table)
    console.print()
    _nodes_table(info["nodes"])


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
    if job:
        path = f"/v1/jobs/{job}/timeline"
    elif project:
        path = f"/v1/projects/{project}/timeline"
    elif node:
        path = f"/v1/nodes/{node}/timeline"
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
