"""`fairlane top`: a live view of the pools, the projects and the queue, redrawn in place.

Reads the API every --interval seconds; `q` (or Ctrl-C) quits. While the API cannot be
reached the last view stays, with the error above it, and reading goes on.
"""

from __future__ import annotations

import contextlib
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from rich.console import Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from fairlane import gpus_cli
from fairlane.api_options import Connection, connected
from fairlane.client import Api, CliError
from fairlane.output import USAGE, ago, console, errors_said, fail, state

#: Pending jobs whose reason is looked up each round (one request each).
REASONS_MAX: Final = 8
JOBS_SHOWN: Final = 15


@dataclass
class Snapshot:
    pools: list[dict[str, Any]] = field(default_factory=list)
    projects: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    #: `GET /v1/gpus`: the nodes' GPUs as last sampled, and the jobs' utilization
    gpus: dict[str, Any] = field(default_factory=lambda: {"nodes": [], "jobs": []})
    taken_at: float = 0.0


def top(
    *,
    interval: float = 2.0,
    once: bool = False,
    connection: Connection | None = None,
) -> None:
    """A live view of pools, projects and the queue that refreshes in place (q quits).

    ```
    fairlane top --interval 1
    ```

    Parameters
    ----------
    interval
        Seconds between refreshes (0.2 to 60).
    once
        Draw the view once and exit (for scripts and terminals that cannot redraw).
    """
    if not 0.2 <= interval <= 60:
        fail(f"--interval must be between 0.2 and 60 seconds, got {interval}", USAGE)
    with errors_said(), connected(connection) as api:
        if once:
            console.print(render(read(api), api.target.api, None))
            return
        _live(api, interval)


def _live(api: Api, interval: float) -> None:
    snapshot, error = Snapshot(), None
    with _keys() as key, Live(console=console, screen=True, auto_refresh=False) as live:
        while True:
            try:
                snapshot, error = read(api), None
            except CliError as e:
                error = str(e)
            live.update(render(snapshot, api.target.api, error), refresh=True)
            if key(interval) in ("q", "Q"):
                return


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """A function that waits up to its timeout for a key press and returns it (or '')."""
    if not sys.stdin.isatty():

        def sleep(timeout: float) -> str:
            time.sleep(timeout)
            return ""

        yield sleep
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)

    def key(timeout: float) -> str:
        ready, _, _ = select.select([fd], [], [], timeout)
        return sys.stdin.read(1) if ready else ""

    try:
        tty.setcbreak(fd)
        yield key
    except KeyboardInterrupt:
        pass
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def read(api: Api) -> Snapshot:
    jobs = api.get("/v1/jobs", limit=500)["items"]
    live = [j for j in jobs if j["state"] not in ("completed", "cancelled", "failed", "rejected")]
    reasons: dict[str, str] = {}
    for job in [j for j in live if j["state"] in ("pending", "submitted")][:REASONS_MAX]:
        reason = api.get(f"/v1/jobs/{job['job_id']}").get("pending_reason")
        if reason:
            reasons[job["job_id"]] = reason["message"]
    gpus = gpus_cli.report(api)
    return Snapshot(
        pools=api.get("/v1/pools"),
        projects=api.get("/v1/projects"),
        jobs=gpus_cli.jobs_with_gpus(live, gpus),
        reasons=reasons,
        gpus=gpus,
        taken_at=time.time(),
    )


def render(s: Snapshot, where: str, error: str | None) -> RenderableType:
    title = Text.assemble(
        ("Fairlane top", "bold"),
        f"  {where}  ",
        (time.strftime("%H:%M:%S", time.localtime(s.taken_at)) if s.taken_at else "", "dim"),
        ("   q quits", "dim"),
    )
    parts: list[RenderableType] = [title]
    if error:
        parts.append(Text(f"error: {error} (retrying)", style="red"))
    parts += [_pools(s), _nodes(s), _projects(s), _queue(s)]
    return Group(*parts)


def _pools(s: Snapshot) -> Table:
    table = Table(title="Pools", title_justify="left", header_style="bold", expand=False)
    table.add_column("POOL")
    for column in ("NODES", "GPUS", "ALLOCATED", "FREE", "QUEUED"):
        table.add_column(column, justify="right")
    table.add_column("USE")
    for p in s.pools:
        table.add_row(
            escape(p["pool"]),
            str(p["nodes"]),
            str(p["gpus"]),
            str(p["allocated"]),
            str(p["free"]),
            str(p["queued_jobs"]),
            _bar(p["allocated"], p["gpus"]),
        )
    return table


def _nodes(s: Snapshot) -> Table:
    """Each node's GPUs: how many are held, and each one's utilization and memory."""
    table = Table(title="Nodes", title_justify="left", header_style="bold")
    table.add_column("NODE")
    table.add_column("STATE")
    table.add_column("HELD", justify="right")
    table.add_column("GPU UTIL", justify="right")
    table.add_column("GPUS (utilization, memory)")
    for n in s.gpus["nodes"]:
        state = "[red]lost[/]" if n["lost"] else n["cordon"] or "ready"
        why = gpus_cli.not_sampled(n)
        each = "  ".join(
            f"{d['index']}:{gpus_cli.percent(d['utilization'])}"
            f" {gpus_cli.memory(d['memory_used_mb'], d['memory_total_mb'])}"
            for d in n["devices"]
        )
        if why is not None:  # a row of "unknown unknown" for every GPU says less than why
            each = f"no readings: {why}"
        table.add_row(
            escape(n["node"]),
            state,
            f"{n['gpus'] - n['free']}/{n['gpus']}",
            gpus_cli.percent(gpus_cli.node_utilization(n)),
            escape(each),
        )
    return table


def _bar(used: int, total: int, width: int = 16) -> str:
    if total <= 0:
        return ""
    filled = round(width * min(used, total) / total)
    return f"[green]{'█' * filled}[/][dim]{'·' * (width - filled)}[/] {used / total:.0%}"


def _projects(s: Snapshot) -> Table:
    table = Table(title="Projects", title_justify="left", header_style="bold")
    table.add_column("PROJECT")
    table.add_column("POOL")
    for column in ("QUOTA", "FAIR SHARE", "IN USE"):
        table.add_column(column, justify="right")
    table.add_column("OVER QUOTA")
    for project in s.projects:
        for p in project["pools"]:
            over = "[yellow]yes[/]" if p["over_quota"] else "no"
            table.add_row(
                escape(project["name"]),
                escape(p["pool"]),
                str(p["quota"]),
                str(p["fair_share"]),
                str(p["usage"]),
                over,
            )
    return table


def _queue(s: Snapshot) -> Table:
    table = Table(title="Jobs", title_justify="left", header_style="bold")
    for column in ("JOB", "PROJECT", "STATE", "GPUS", "GPU UTIL", "PRIO", "SINCE", "WHY PENDING"):
        table.add_column(column, overflow="fold" if column == "WHY PENDING" else "ellipsis")
    order = {"running": 0, "starting": 0, "stopping": 1, "pending": 2, "submitted": 2}
    shown = sorted(s.jobs, key=lambda j: (order.get(j["state"], 3), -j["priority"]))
    for j in shown[:JOBS_SHOWN]:
        table.add_row(
            escape(j["job_id"]),
            escape(j["project"]),
            state(j["state"]),
            f"{j['gpus_held']}/{j['gpus'] * j['replicas']}",
            gpus_cli.job_utilization(j),
            str(j["priority"]),
            ago(j["state_since"], s.taken_at or None),
            escape(s.reasons.get(j["job_id"], "")),
        )
    if len(shown) > JOBS_SHOWN:
        table.caption = f"and {len(shown) - JOBS_SHOWN} more (fairlane list)"
    return table
