"""What the cluster holds, through the HTTP API: projects (and setting them), pools, nodes,
and the events, past or live."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Annotated, Any, Final, Literal

import cyclopts
from rich.markup import escape
from rich.table import Table

from fairlane import gpus_cli
from fairlane.api_options import Connection, connected
from fairlane.client import Api
from fairlane.output import USAGE, Output, clock, console, emit, errors_said, fail, to_yaml
from fairlane.timeline import details, print_timeline

EVENTS_MAX = 10_000


def register(app: cyclopts.App) -> None:
    app.command(projects)
    project = cyclopts.App(name="project", help="Set a project's quota, weight, limit, priority.")
    project.command(project_set, name="set")
    app.command(project)
    pool = cyclopts.App(name="pool", help="Pools and their scheduler settings.")
    pool.command(pool_set, name="set")
    app.command(pool)
    app.command(nodes)
    node = cyclopts.App(name="node", help="Take a node out of service and back: cordon, drain.")
    node.command(node_cordon, name="cordon")
    node.command(node_drain, name="drain")
    node.command(node_uncordon, name="uncordon")
    app.command(node)
    app.command(cluster_info, name="cluster-info")
    app.command(events)


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
    quota: int | None = None,
    pool: str | None = None,
    weight: int | None = None,
    limit: int | None = None,
    no_limit: bool = False,
    priority: int | None = None,
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
    with errors_said(), connected(connection) as api:
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
    with errors_said(), connected(connection) as api:
        answer = api.put(f"/v1/pools/{name}", body)
        emit(answer, output, lambda a: _configured(f"pool {name}", a))


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
    """Nodes: pool, GPUs, free GPUs, their state (ready, cordoned, drained or lost) and GPU
    utilization; then each GPU: utilization, memory, temperature, power and the job holding it
    (as the node's executor last sampled them through NVML; "unknown" where it could not).

    fairlane nodes
    """
    with errors_said(), connected(connection) as api:
        found = gpus_cli.with_gpus(api.get("/v1/nodes"), gpus_cli.report(api))
        emit(found, output, _nodes_table)


def node_cordon(
    name: str,
    /,
    *,
    reason: str = "",
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Cordon a node (admin token): it takes no new work; what runs there keeps running.

    ```
    fairlane node cordon gpu-3 --reason "flaky fan"
    ```

    Parameters
    ----------
    reason
        Why, kept on the node's timeline.
    """
    _node_service(name, "cordon", reason, connection, output)


def node_drain(
    name: str,
    /,
    *,
    reason: str = "",
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Drain a node (admin token): it takes no new work, and its jobs save a checkpoint, stop
    (reason `drain` on their timeline) and resume elsewhere by the usual rules.

    ```
    fairlane node drain gpu-3 --reason "driver upgrade"
    ```

    Parameters
    ----------
    reason
        Why, kept on the node's timeline.
    """
    _node_service(name, "drain", reason, connection, output)


def node_uncordon(
    name: str,
    /,
    *,
    reason: str = "",
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Put a cordoned or drained node back in service (admin token).

    ```
    fairlane node uncordon gpu-3
    ```

    Parameters
    ----------
    reason
        Why, kept on the node's timeline.
    """
    _node_service(name, "uncordon", reason, connection, output)


def _node_service(
    name: str, verb: str, reason: str, connection: Connection | None, output: Output
) -> None:
    with errors_said(), connected(connection) as api:
        answer = api.post(f"/v1/nodes/{name}/{verb}", {"reason": reason})
        emit(answer, output, lambda a: _node_said(name, verb, a))


def _node_said(name: str, verb: str, answer: dict[str, Any]) -> None:
    done = {"cordon": "cordoned", "drain": "drained", "uncordon": "back in service"}[verb]
    console.print(f"node {escape(name)} {done} [dim]({answer.get('type')})[/]")


_NODE_STATES: Final = {
    "cordoned": "[yellow]cordoned[/]",
    "drained": "[yellow]drained[/]",
}


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
    table.add_column("GPU UTIL", justify="right")
    for n in found:
        state = _NODE_STATES.get(n.get("cordon", ""), "[green]ready[/]")
        if n["lost"]:
            state = "[red]lost[/]"
        util = gpus_cli.percent(gpus_cli.node_utilization(n)) if "devices" in n else "unknown"
        table.add_row(
            escape(n["node"]), escape(n["pool"]), str(n["gpus"]), str(n["free"]), state, util
        )
    console.print(table)
    gpus_cli.print_gpus([n for n in found if "devices" in n])


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
    since: float | None = None,
    limit: int = 100,
    follow: Annotated[bool, cyclopts.Parameter(name=["--follow", "-f"])] = False,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Events in log order, each with its reason: the whole cluster's, or one job's, project's
    or node's; --follow prints new ones as they happen (Ctrl-C stops).

    ```
    fairlane events --job train-1
    fairlane events --type JobPreempted --type JobPreemptionRequested
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
        Only events from this Unix time on.
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
    with errors_said(), connected(connection) as api:
        if not follow:
            found = _past(api, path, limit, types=event_type, since=since)
            emit(found, output, print_timeline)
            return
        with contextlib.suppress(KeyboardInterrupt):
            _follow(api, job, project, node, event_type, output)


def _past(api: Api, path: str, limit: int, **filters: Any) -> list[dict[str, Any]]:
    """The first `limit` events that match (pages of 500)."""
    items: list[dict[str, Any]] = []
    after: int | None = None
    while len(items) < limit:
        page = api.get(path, limit=min(500, limit - len(items)), after=after, type=filters["types"],
                       since=filters["since"])  # fmt: skip
        items += page["items"]
        after = page["next"]
        if after is None:
            break
    return items


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
