"""What the cluster holds, through the HTTP API: projects (and setting them), pools, nodes,
and the events, past or live."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import cyclopts
from rich.markup import escape
from rich.table import Table

from cluster.cluster_file import DEFAULT_DATA_DIR
from events.units import parse_duration
from fairlane import gpus_cli
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
from policy.decay import settings_problem

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
    table.add_column("U", justify="right")  # rule 11: decayed usage, a part of the pool
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
                _part(p.get("decayed_usage")),
            )
    console.print(table)


def _part(u: float | None) -> str:
    return "-" if u is None else f"{100 * u:.0f}%"


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
    usage_half_life: str | None = None,
    usage_k: float = 1.0,
    connection: Connection | None = None,
    output: Output = "table",
) -> None:
    """Create a pool or set its own scheduler settings (they replace the cluster's as a whole;
    admin token).

    ```
    fairlane pool set default --scheduler fair_share --fitting best --victim-order cost
    fairlane pool set default --usage-half-life 2h --usage-k 1
    ```

    Parameters
    ----------
    scheduler
        The pool's scheduler; leave out to follow the cluster's settings.
    fitting
        best packs, worst spreads (with --scheduler).
    victim_order
        newest, or cost (least lost work) (with --scheduler).
    usage_half_life
        Time-aware fairness (rule 11): the half-life of the usage history the fair share
        weighs (2h, 1d, ...); a project that used much of the pool lately gets a smaller share.
    usage_k
        How strongly the history moves the shares (0: not at all; default 1).
    """
    body: dict[str, Any] = {"scheduler": scheduler, "fitting": fitting}
    body["victim_order"] = victim_order
    if usage_half_life is not None or usage_k != 1.0:
        body.update(_usage_settings(usage_half_life, usage_k))
    with errors_said(), connected(connection) as api, flags_named(body):
        answer = api.put(f"/v1/pools/{name}", body)
        emit(answer, output, lambda a: _configured(f"pool {name}", a))


def _usage_settings(half_life: str | None, k: float) -> dict[str, Any]:
    """Rule 11's settings as the API takes them, checked here first so that a bad value is
    named as it was typed."""
    seconds = None
    if half_life is not None:
        try:
            seconds = parse_duration(half_life)
        except ValueError as e:
            fail(f"--usage-half-life: {e}", USAGE)
    problem = settings_problem(seconds, k)
    if problem is not None:
        fail(f"--usage-half-life {half_life}, --usage-k {k}: {problem}", USAGE)
    return {"usage_half_life_s": seconds, "usage_k": k}


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


DataDir = Annotated[Path, cyclopts.Parameter(name="--data-dir")]


def node_start(
    name: str,
    /,
    *,
    gpus: int | None = None,
    pool: str = "default",
    data_dir: DataDir = DEFAULT_DATA_DIR,
    nats: str | None = None,
    credentials: Path | None = None,
    runtime: Literal["process", "docker"] = "process",
    address: str | None = None,
    foreground: bool = False,
) -> None:
    """Start a node executor on this machine and return once its node has registered.

    For the embedded cluster in --data-dir (`fairlane up`), the node is supervised with the
    cluster's services (restarted if it exits, stopped by `fairlane down`); its NATS user is
    added to the cluster's nats-server. For a cluster elsewhere, give its --nats URL and the
    node's --credentials file (`fairlane node credentials NAME` on the cluster's machine, or
    `fairlane deploy secrets DIR --node NAME`); a supervisor of the node's own runs it from
    --data-dir. Each node has its own folder (`DIR/nodes/NAME`) and its own declared GPUs.

    ```
    fairlane node start gpu-2 --gpus 2
    fairlane node start gpu-3 --gpus 1 --pool a100
    fairlane node start gpu-4 --gpus 8 --nats nats://head:4222 --credentials executor-gpu-4.json
    ```

    Parameters
    ----------
    name
        The node's name: letters, digits, '-' and '_' (1 to 128); not one that runs already.
    gpus
        GPUs the node declares: its GPU indexes 0..N-1, its own whichever other nodes run on
        this machine (default: what NVML finds, for a node with a machine to itself).
    pool
        The pool the node belongs to.
    data_dir
        The embedded cluster's folder; with --nats, where the node keeps its files.
    nats
        Join the cluster at this NATS URL instead of the embedded one (needs --credentials).
    credentials
        With --nats: the node's NATS credentials file (its user is `executor-NAME`).
    runtime
        How the node runs jobs: local processes, or Docker containers of each job's image.
    address
        Where other nodes reach this one (a gang's MASTER_ADDR; default 127.0.0.1).
    foreground
        Stay attached after it registered; Ctrl-C stops the node.
    """
    if (nats is None) != (credentials is None):
        fail(
            "--nats URL and --credentials FILE go together (for a cluster elsewhere); "
            "without both, the node joins the embedded cluster in --data-dir",
            USAGE,
        )
    from cluster import nodes  # noqa: PLC0415  (NATS and the supervisor: only when run)

    async def start() -> nodes.StartedNode:
        if nats is not None and credentials is not None:
            return await nodes.start_remote_node(
                data_dir,
                name,
                nats_url=nats,
                credentials=credentials,
                gpus=gpus,
                pool=pool,
                runtime=runtime,
                address=address,
            )
        return await nodes.start_node(
            data_dir, name, gpus=gpus, pool=pool, runtime=runtime, address=address
        )

    try:
        started = asyncio.run(start())
    except nodes.NodeError as e:
        fail(str(e), e.code)
    offers = "GPUs from NVML" if gpus is None else f"{gpus} GPU(s)"
    console.print(
        f"node {escape(name)} registered: pool {escape(pool)}, {offers}, cluster "
        f"{escape(started.nats_url)}; files {escape(str(started.data_dir))}, log "
        f"{escape(str(started.log))}"
    )
    if not foreground:
        console.print(f"[dim]`fairlane node stop {escape(name)}` stops it.[/]")
        return
    console.print("[dim]Ctrl-C stops the node.[/]")
    asyncio.run(_until_interrupted())
    node_stop(name, data_dir=data_dir)


async def _until_interrupted() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def node_stop(name: str, /, *, data_dir: DataDir = DEFAULT_DATA_DIR) -> None:
    """Stop a node started from --data-dir (the embedded cluster's own node too).

    Its executor stops its workloads (SIGTERM, then SIGKILL after the jobs' grace) and exits;
    the node watcher declares the node lost once its heartbeat timeout passes (`fairlane up
    --heartbeat-timeout`, default 10 s), and its jobs are queued again and resume elsewhere
    from their last stored checkpoint. `fairlane node drain NAME` first stops them with a
    fresh checkpoint.

    ```
    fairlane node stop gpu-2
    ```

    Parameters
    ----------
    name
        The node's name.
    data_dir
        The folder the node was started from.
    """
    from cluster import nodes  # noqa: PLC0415  (NATS and the supervisor: only when run)

    try:
        where = asyncio.run(nodes.stop_node(data_dir, name))
    except nodes.NodeError as e:
        fail(str(e), e.code)
    console.print(
        f"node {escape(name)} stopped (it ran in {escape(where)}); it is declared lost once "
        "its heartbeat timeout passes, and its jobs are queued again"
    )


def node_credentials(
    name: str,
    /,
    *,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    output_file: Annotated[Path | None, cyclopts.Parameter(name=["--output-file", "-O"])] = None,
) -> None:
    """Add a node's NATS user to the embedded cluster and say where its credentials are.

    The cluster in --data-dir gets the user `executor-NAME` (kept if it has one) and its
    nats-server reads its users again; the credentials file is for `fairlane node start NAME
    --nats URL --credentials FILE` on another machine.

    ```
    fairlane node credentials gpu-4 -O executor-gpu-4.json
    ```

    Parameters
    ----------
    name
        The node's name.
    data_dir
        The embedded cluster's folder.
    output_file
        Also write the credentials to this file (mode 0600); keep it secret.
    """
    from cluster import nodes  # noqa: PLC0415  (NATS: only when run)

    try:
        path, url = asyncio.run(nodes.node_credentials(data_dir, name))
    except nodes.NodeError as e:
        fail(str(e), e.code)
    if output_file is not None:
        try:
            fd = os.open(output_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(path.read_bytes())
            os.chmod(output_file, 0o600)
        except OSError as e:
            fail(f"--output-file {output_file}: {e.strerror or e}")
        path = output_file
    console.print(
        f"NATS user executor-{escape(name)} may connect to {escape(url)}; its credentials: "
        f"{escape(str(path))} (mode 0600, keep it secret). On the node's machine:\n"
        f"  fairlane node start {escape(name)} --gpus N --nats {escape(url)} --credentials FILE"
    )


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


project_app = cyclopts.App(name="project", help="Set a project's quota, weight, limit, priority.")
project_app.command(project_set, name="set")
pool_app = cyclopts.App(name="pool", help="Pools and their scheduler settings.")
pool_app.command(pool_set, name="set")
node_app = cyclopts.App(
    name="node", help="Add nodes to a cluster and stop them; take them out of service and back."
)
node_app.command(node_start, name="start")
node_app.command(node_stop, name="stop")
node_app.command(node_credentials, name="credentials")
node_app.command(node_cordon, name="cordon")
node_app.command(node_drain, name="drain")
node_app.command(node_uncordon, name="uncordon")
