"""Nodes, through the HTTP API and on this machine: the cluster at a glance, the nodes, starting
and stopping one here, its credentials, taking it out of service and back."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import cyclopts
from rich.markup import escape
from rich.table import Table

from cluster.cluster_file import DEFAULT_DATA_DIR
from fairlane import gpus_cli
from fairlane.api_options import Connection, connected
from fairlane.client import named
from fairlane.output import (
    USAGE,
    Output,
    console,
    emit,
    errors_said,
    fail,
)


def nodes(*, connection: Connection | None = None, output: Output = "table") -> None:
    """Nodes: pool, GPUs, free GPUs, their state (ready, cordoned, drained or lost) and GPU
    utilization; then each GPU: utilization, memory, temperature, power and the job holding it
    (as the node's executor last sampled them through NVML; "unknown" where it could not).

    fairlane nodes
    """
    with errors_said(), connected(connection) as api:
        found = gpus_cli.with_gpus(api.get("/v1/nodes"), gpus_cli.report(api))
        emit(found, output, nodes_table)


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
        answer = api.post(f"/v1/nodes/{named('NAME', name)}/{verb}", {"reason": reason})
        emit(answer, output, lambda a: _node_said(name, verb, a))


def _node_said(name: str, verb: str, answer: dict[str, Any]) -> None:
    done = {"cordon": "cordoned", "drain": "drained", "uncordon": "back in service"}[verb]
    console.print(f"node {escape(name)} {done} [dim]({answer.get('type')})[/]")


_NODE_STATES: Final = {
    "cordoned": "[yellow]cordoned[/]",
    "drained": "[yellow]drained[/]",
}


def nodes_table(found: list[dict[str, Any]]) -> None:
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
    nodes_table(info["nodes"])


node_app = cyclopts.App(
    name="node", help="Add nodes to a cluster and stop them; take them out of service and back."
)
node_app.command(node_start, name="start")
node_app.command(node_stop, name="stop")
node_app.command(node_credentials, name="credentials")
node_app.command(node_cordon, name="cordon")
node_app.command(node_drain, name="drain")
node_app.command(node_uncordon, name="uncordon")
