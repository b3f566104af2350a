"""The embedded cluster's own commands: up, down and status (the job, project and view
commands talk to its HTTP API: fairlane/submit_cli.py, fairlane/jobs_cli.py,
fairlane/job_actions_cli.py, fairlane/cluster_view_cli.py, fairlane/nodes_cli.py,
fairlane/events_cli.py)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Literal

import cyclopts
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cluster.cluster_file import DEFAULT_DATA_DIR, ClusterFile, read_cluster, stopped
from cluster.embedded import (
    EmbeddedError,
    down,
    limit_warnings,
    nats_flag_problem,
    started,
    supervisor_status,
    up,
)
from cluster.log_health import LogHealth, describe, look_now
from cluster.supervisor import STABLE_S, ProgramStatus
from cluster.tool_log import log_like_services

console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

Output = Annotated[Literal["text", "json"], cyclopts.Parameter(name=["--output", "-o"])]
DataDir = Annotated[Path, cyclopts.Parameter(name="--data-dir", help="the cluster's data folder")]
NatsUrl = Annotated[
    str | None, cyclopts.Parameter(help="NATS URL; default: the cluster in --data-dir")
]


def register(app: cyclopts.App) -> None:
    app.command(up_command, name="up")
    app.command(down_command, name="down")
    app.command(status_command, name="status")


def up_command(
    *,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    gpus: int | None = None,
    nats: str | None = None,
    postgres: str | None = None,
    detach: bool = False,
    runtime: Literal["process", "docker"] = "process",
    nats_port: int | None = None,
    api_port: int | None = None,
    nodes: int = 1,
    heartbeat_timeout: float | None = None,
    insecure_same_user: bool = False,
) -> None:
    """Start an embedded cluster: nats-server, PostgreSQL, the services and one node executor
    (or --nodes of them; `fairlane node start` adds more later).

    Parameters
    ----------
    data_dir
        Where the servers keep their data and the services their logs.
    gpus
        GPUs this machine declares (default: what NVML finds; required where there is none).
    nats
        Use this NATS server instead of starting one.
    postgres
        Use this PostgreSQL DSN instead of starting one.
    detach
        Return once everything runs (stop it with `fairlane down`); by default `up` stays in
        the foreground and Ctrl-C stops everything.
    runtime
        How the node executor runs jobs: local processes, or Docker containers of each job's
        image (DOCKER_HOST names the engine).
    nats_port
        The port of the nats-server it starts (default: 4222 where free, else any free one).
    api_port
        The HTTP API's port (default: 8080 where free, else any free one).
    nodes
        Node executors to run on this machine, each with --gpus GPUs of its own and a folder
        of its own: the first is named after the host, the others HOST-2, HOST-3, ...
        (needs --gpus above 1 node: NVML would give every node the same GPUs).
    heartbeat_timeout
        Seconds without a node's heartbeat before it is declared lost and its jobs are
        queued again (default 10).
    insecure_same_user
        Run jobs as the user who runs `up`: every job can then read the cluster's
        credentials, tokens and other jobs' files. Only for a machine whose jobs are all
        yours; the default where `up` is not root, which cannot give each job a user of its
        own (as root each job runs as a uid of its own).
    """
    problem = _bad_value(nodes, gpus, heartbeat_timeout, nats)
    if problem is not None:
        err.print(f"[red]error:[/] {escape(problem)}")
        sys.exit(2)
    log_like_services("warning")  # the table below says what started
    same_user = insecure_same_user or os.geteuid() != 0
    if same_user:
        err.print(
            "[yellow]warning:[/] jobs run as this user (--insecure-same-user"
            + ("" if insecure_same_user else ": not root, so no user of their own")
            + "): any job can read the cluster's credentials and tokens and other jobs' "
            "files; fine for a machine whose jobs are all yours"
        )
    extra: list[str] = []

    async def start() -> tuple[ClusterFile, list[ProgramStatus]]:
        info = await up(
            data_dir,
            gpus=gpus,
            nats_url=nats,
            postgres_dsn=postgres,
            runtime=runtime,
            nats_port=nats_port,
            api_port=api_port,
            heartbeat_timeout=heartbeat_timeout,
            insecure_same_user=same_user,
        )
        if nodes > 1 and gpus is not None:
            from cluster.nodes import NodeError, start_node  # noqa: PLC0415  (only for --nodes)

            for i in range(2, nodes + 1):
                name = f"{info.node}-{i}"
                try:
                    await start_node(data_dir, name, gpus=gpus, runtime=runtime)
                except NodeError as e:
                    raise EmbeddedError(f"{e} (`fairlane down` stops what started)") from None
                extra.append(name)
        return info, await started(data_dir)

    async def foreground() -> int:
        """Start, wait for Ctrl-C (or SIGTERM), stop: all in one event loop, so that the
        processes it started are watched by a loop that is still open when they exit."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        if not detach:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
        starting = asyncio.create_task(start())
        await asyncio.wait({starting, asyncio.create_task(stop.wait())},
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        if stop.is_set() and not starting.done():  # stopping half-started would leave orphans
            console.print("stopping once everything has started ...")
        try:
            info, failed = await starting
        except EmbeddedError as e:
            err.print(f"[red]error:[/] {e}")
            return 1
        if stop.is_set():
            await _stop(data_dir)
            return 130
        _print_started(info, failed, data_dir, extra)
        if detach:
            return 1 if failed else 0
        console.print("[dim]Ctrl-C stops everything.[/]")
        await stop.wait()
        await _stop(data_dir)
        return 0

    code = asyncio.run(foreground())
    if code:
        sys.exit(code)


def _bad_value(
    nodes: int, gpus: int | None, heartbeat_timeout: float | None, nats: str | None
) -> str | None:
    """What is wrong with `up`'s values, naming the flag and the value (None: nothing)."""
    if nodes < 1:
        return f"--nodes {nodes}: run at least 1 node"
    if nodes > 1 and gpus is None:
        return f"--nodes {nodes} needs --gpus N: each node declares its own"
    if heartbeat_timeout is not None and not 0 < heartbeat_timeout <= 86_400:
        return f"--heartbeat-timeout {heartbeat_timeout:g}: not in (0, 86400]"
    return None if nats is None else nats_flag_problem(nats)


def without_password(dsn: str) -> str:
    """A DSN as it may be shown: a password in it replaced by ***."""
    return re.sub(r"^([a-z]+://[^:/@]*:)[^@]+@", r"\1***@", dsn)


async def _stop(data_dir: Path) -> None:
    console.print("stopping ...")
    stopped = await down(data_dir)
    console.print(f"stopped: {', '.join(stopped) or 'nothing'}")


def _print_started(
    info: ClusterFile, failed: list[ProgramStatus], data_dir: Path, extra: list[str]
) -> None:
    title = "Fairlane is up" if not failed else "Fairlane started, but not everything is up"
    table = Table(title=title, title_justify="left")
    table.add_column("what")
    table.add_column("where")
    table.add_row("NATS (JetStream)", info.nats_url)
    if info.credentials_dir:
        table.add_row("NATS credentials", f"{info.credentials_dir} (one user per service)")
    table.add_row("PostgreSQL", without_password(info.postgres_uri))
    table.add_row("node executor", f"node {info.node}, pool default")
    for node in extra:
        table.add_row("node executor", f"node {node}, pool default (fairlane node stop {node})")
    if info.api_url:
        table.add_row("dashboard", f"{info.api_url}/ui/ (sign in with the admin token)")
        table.add_row("HTTP API", f"{info.api_url} (docs: {info.api_url}/docs)")
        table.add_row("admin token", f"in {info.admin_token_file} (mode 0600)")
    for name, pid in info.pids.items():
        table.add_row(name, f"pid {pid}, log {_log_of(name, info.data_dir)}")
    for program in supervisor_status(data_dir):
        table.add_row(program.name, _program_state(program, info.data_dir))
    console.print(table)
    if info.api_url:  # (a table cell may be cut in a narrow terminal: the address whole)
        console.print(f"Dashboard: {info.api_url}/ui/", soft_wrap=True)
    for program in failed:
        err.print(
            f"[red]error:[/] {program.name} failed to start (exit status {program.last_exit}); "
            f"restarting it with backoff. Its log: {info.data_dir}/logs/{program.name}.log"
        )
        for line in _tail(Path(info.data_dir) / "logs" / f"{program.name}.log"):
            err.print(f"  {line}", markup=False)


def _log_of(name: str, data_dir: str) -> str:
    """Where a program `up` started writes its log."""
    return f"{data_dir}/logs/{name}.log"


def _program_state(program: ProgramStatus, data_dir: str) -> str:
    where = f"log {data_dir}/logs/{program.name}.log"
    restarts = f", restarted {program.restarts}x" if program.restarts else ""
    last = f", last exit {program.last_exit}" if program.last_exit is not None else ""
    if program.state == "running":
        starting = " (its last run failed to start)" if program.failed_to_start else ""
        return f"running{starting}, pid {program.pid}{restarts}{last}, {where}"
    why = "failed to start" if program.failed_to_start else "exited"
    return f"{program.state} ({why}{last}){restarts}, {where}"


def _troubled(program: ProgramStatus) -> bool:
    """Not running, or it exited within the last STABLE_S (it may be crash-looping)."""
    recently = program.exited_at is not None and time.time() - program.exited_at < STABLE_S
    return program.state != "running" or program.failed_to_start or recently


def _tail(path: Path, lines: int = 5) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def status_command(*, data_dir: DataDir = DEFAULT_DATA_DIR) -> None:
    """What the embedded cluster in --data-dir runs: each service, its restarts, how far behind
    the read models are, and warnings: the event log's limits, events a service set aside."""
    info = read_cluster(data_dir.resolve())
    if info is None:
        err.print(f"[red]error:[/] no cluster runs from {data_dir}")
        sys.exit(1)
    table = Table(title=f"Fairlane at {info.nats_url}", title_justify="left")
    table.add_column("what")
    table.add_column("state")
    dead = stopped(info)
    for name, pid in info.pids.items():
        table.add_row(name, f"pid {pid}" + (" [red]not running[/]" if name in dead else ""))
    programs = supervisor_status(data_dir)
    for program in programs:
        table.add_row(program.name, _program_state(program, info.data_dir))
    console.print(table)
    health = look_now(info)
    lines, warnings = describe(health) if isinstance(health, LogHealth) else ([], [health])
    for line in lines:
        console.print(line)
    for warning in [*limit_warnings(data_dir), *warnings]:
        err.print(f"[yellow]warning:[/] {warning}")
    if dead or any(_troubled(p) for p in programs):
        sys.exit(1)


def down_command(*, data_dir: DataDir = DEFAULT_DATA_DIR) -> None:
    """Stop the embedded cluster started from --data-dir."""
    stopped = asyncio.run(down(data_dir))
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
