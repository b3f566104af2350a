"""Commands for a running cluster: up, down, and the job and project commands.

Job and configuration commands go to admission and the quota ledger by NATS request/reply
and print the event that resulted, or the error (exit status 1).
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Literal

import cyclopts
import msgspec
import nats.errors as nats_errors
from rich.console import Console
from rich.table import Table

from events import JobSpec, SchedulerSettings
from events.commands import (
    AnyCommand,
    CancelJob,
    PauseJob,
    ResumeJob,
    SetPool,
    SetProject,
    SubmitJob,
)
from fairlane.embedded import (
    DEFAULT_DATA_DIR,
    ClusterFile,
    EmbeddedError,
    alive,
    down,
    limit_warnings,
    read_cluster,
    started,
    supervisor_status,
    up,
)
from fairlane.supervisor import STABLE_S, ProgramStatus
from services.runtime.auth import CLIENT, load_credentials
from services.runtime.client import send
from services.runtime.eventlog import connect
from services.runtime.main import configure_logging

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
    app.command(submit)
    app.command(delete)
    app.command(pause)
    app.command(resume)
    project = cyclopts.App(name="project", help="Projects: quotas, weights, limits, priorities.")
    project.command(project_set, name="set")
    app.command(project)
    pool = cyclopts.App(name="pool", help="Pools and their scheduler settings.")
    pool.command(pool_set, name="set")
    app.command(pool)


def up_command(
    *,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    gpus: int | None = None,
    nats: str | None = None,
    postgres: str | None = None,
    detach: bool = False,
    runtime: Literal["process", "docker"] = "process",
) -> None:
    """Start an embedded cluster: nats-server, PostgreSQL, the services and one node executor.

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
    """

    configure_logging("warning")  # the table below says what started

    async def start() -> tuple[ClusterFile, list[ProgramStatus]]:
        info = await up(data_dir, gpus=gpus, nats_url=nats, postgres_dsn=postgres, runtime=runtime)
        return info, await started(data_dir)

    try:
        info, failed = asyncio.run(start())
    except EmbeddedError as e:
        err.print(f"[red]error:[/] {e}")
        sys.exit(1)
    title = "Fairlane is up" if not failed else "Fairlane started, but not everything is up"
    table = Table(title=title, title_justify="left")
    table.add_column("what")
    table.add_column("where")
    table.add_row("NATS (JetStream)", info.nats_url)
    if info.credentials_dir:
        table.add_row("NATS credentials", f"{info.credentials_dir} (one user per service)")
    table.add_row("PostgreSQL", info.postgres_uri)
    table.add_row("node executor", f"node {info.node}, pool default")
    if info.api_url:
        table.add_row("HTTP API", f"{info.api_url} (docs: {info.api_url}/docs)")
        table.add_row("admin token", f"in {info.admin_token_file} (mode 0600)")
    for name, pid in info.pids.items():
        table.add_row(name, f"pid {pid}, log {info.data_dir}/logs/{name}.log")
    for program in supervisor_status(data_dir):
        table.add_row(program.name, _program_state(program, info.data_dir))
    console.print(table)
    for program in failed:
        err.print(
            f"[red]error:[/] {program.name} failed to start (exit status {program.last_exit}); "
            f"restarting it with backoff. Its log: {info.data_dir}/logs/{program.name}.log"
        )
        for line in _tail(Path(info.data_dir) / "logs" / f"{program.name}.log"):
            err.print(f"  {line}", markup=False)
    if detach:
        if failed:
            sys.exit(1)
        return
    console.print("[dim]Ctrl-C stops everything.[/]")
    _wait_for_signal()
    stopped = asyncio.run(down(data_dir))
    console.print(f"stopped: {', '.join(stopped) or 'nothing'}")


def _wait_for_signal() -> None:
    async def wait() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()

    asyncio.run(wait())


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
    """What the embedded cluster in --data-dir runs: each service, its restarts, and warnings
    about the event log's limits."""
    info = read_cluster(data_dir.resolve())
    if info is None:
        err.print(f"[red]error:[/] no cluster runs from {data_dir}")
        sys.exit(1)
    table = Table(title=f"Fairlane at {info.nats_url}", title_justify="left")
    table.add_column("what")
    table.add_column("state")
    dead = [name for name, pid in info.pids.items() if not alive(pid)]
    for name, pid in info.pids.items():
        table.add_row(name, f"pid {pid}" + (" [red]not running[/]" if name in dead else ""))
    programs = supervisor_status(data_dir)
    for program in programs:
        table.add_row(program.name, _program_state(program, info.data_dir))
    console.print(table)
    for warning in limit_warnings(data_dir):
        err.print(f"[yellow]warning:[/] {warning}")
    if dead or any(_troubled(p) for p in programs):
        sys.exit(1)


def down_command(*, data_dir: DataDir = DEFAULT_DATA_DIR) -> None:
    """Stop the embedded cluster started from --data-dir."""
    stopped = asyncio.run(down(data_dir))
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}")


def submit(
    job_id: str,
    /,
    *,
    project: str,
    gpus: int = 1,
    replicas: int = 1,
    min_replicas: int | None = None,
    job_class: Annotated[str | None, cyclopts.Parameter(name="--class")] = None,
    priority: int | None = None,
    pool: list[str] | None = None,
    node: str | None = None,
    command: list[str] | None = None,
    image: str | None = None,
    idempotency_key: str | None = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    nats: NatsUrl = None,
    output: Output = "text",
) -> None:
    """Submit a job.

    Parameters
    ----------
    job_id
        A unique name: letters, digits, '-' and '_'.
    project
        The project (team) the job belongs to.
    gpus
        GPUs per replica (0: CPU only).
    replicas
        Replicas, placed together as one gang.
    min_replicas
        Fewer than replicas makes the job elastic.
    job_class
        Priority class: train, interactive, build, inference (or the cluster's own).
    priority
        An explicit priority instead of a class (higher is more important).
    pool
        Pools to try in order (repeat the flag).
    node
        Run only on this node.
    command
        The workload's command (repeat the flag per argument); default: the built-in workload.
    image
        The container image the command runs in (nodes whose executor runs `--runtime docker`).
    idempotency_key
        Submitting again with the same key returns the first answer instead of a second job.
    """
    spec = JobSpec(
        project=project,
        priority_class=job_class,
        priority=priority,
        gpus=gpus,
        replicas=replicas,
        min_replicas=min_replicas,
        pools=tuple(pool or ()),
        node=node,
        command=tuple(command or ()),
        image=image,
    )
    _send(
        SubmitJob(job_id=job_id, spec=spec, idempotency_key=idempotency_key), data_dir, nats, output
    )


def delete(
    job_id: str,
    /,
    *,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    nats: NatsUrl = None,
    output: Output = "text",
) -> None:
    """Delete (cancel) a job; a running one is stopped."""
    _send(CancelJob(job_id=job_id), data_dir, nats, output)


def pause(
    job_id: str,
    /,
    *,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    nats: NatsUrl = None,
    output: Output = "text",
) -> None:
    """Pause a job: it checkpoints, gives its GPUs back and waits until resumed."""
    _send(PauseJob(job_id=job_id), data_dir, nats, output)


def resume(
    job_id: str,
    /,
    *,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    nats: NatsUrl = None,
    output: Output = "text",
) -> None:
    """Resume a paused job: it queues again for GPUs."""
    _send(ResumeJob(job_id=job_id), data_dir, nats, output)


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
    data_dir: DataDir = DEFAULT_DATA_DIR,
    nats: NatsUrl = None,
    output: Output = "text",
) -> None:
    """Create or change a project in one pool; what is not given keeps its value.

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
    command = SetProject(
        project=name,
        pool=pool,
        quota=quota,
        over_quota_weight=weight,
        limit=limit,
        no_limit=no_limit,
        priority=priority,
    )
    _send(command, data_dir, nats, output)


def pool_set(
    name: str,
    /,
    *,
    scheduler: Literal["fair_share", "priority", "round_robin"] | None = None,
    fitting: Literal["best", "worst"] = "best",
    victim_order: Literal["newest", "cost"] = "newest",
    data_dir: DataDir = DEFAULT_DATA_DIR,
    nats: NatsUrl = None,
    output: Output = "text",
) -> None:
    """Create a pool or set its own scheduler settings (they replace the cluster's as a whole).

    Parameters
    ----------
    scheduler
        The pool's scheduler; leave out to follow the cluster's settings.
    fitting
        best packs, worst spreads (with --scheduler).
    victim_order
        newest, or cost (least lost work) (with --scheduler).
    """
    settings = (
        SchedulerSettings(type=scheduler, fitting=fitting, victim_order=victim_order)
        if scheduler is not None
        else None
    )
    _send(SetPool(pool=name, scheduler=settings), data_dir, nats, output)


def _send(command: AnyCommand, data_dir: Path, nats: str | None, output: str) -> None:
    configure_logging("error")  # a command's own answer is the output; no connection chatter
    url = nats
    credentials = None
    if url is None:
        running = read_cluster(data_dir.resolve())
        if running is None:
            err.print(f"[red]error:[/] no cluster runs from {data_dir} (start one: fairlane up)")
            sys.exit(1)
        url = running.nats_url
        if running.credentials_dir:  # the client user: commands and their answers only
            credentials = load_credentials(Path(running.credentials_dir) / f"{CLIENT}.json")

    async def go() -> object:
        nc = await connect(url, "fairlane-cli", retry_for=5, credentials=credentials)
        try:
            return await send(nc, command)
        finally:
            await nc.close()

    try:
        reply = asyncio.run(go())
    except msgspec.ValidationError as e:  # out of bounds: refused before it was sent
        err.print(f"[red]error:[/] invalid {type(command).__name__}: {e}")
        sys.exit(1)
    except (nats_errors.NoRespondersError, nats_errors.TimeoutError):
        err.print(
            f"[red]error:[/] no answer to {type(command).__name__} from the cluster at {url}"
            " (is it still starting, or stopped?)"
        )
        sys.exit(1)
    if output == "json":
        sys.stdout.write(msgspec.json.encode(reply).decode() + "\n")
    else:
        ok = getattr(reply, "ok", False)
        event = getattr(reply, "event", None)
        if event is not None:
            console.print(f"{type(event).__name__}: {msgspec.json.encode(event).decode()}")
        if not ok:
            err.print(f"[red]error:[/] {getattr(reply, 'error', '')}")
    if not getattr(reply, "ok", False):
        sys.exit(1)
