"""`fairlane projections rebuild`: the read models made again from the whole log."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Annotated

import cyclopts
from rich.console import Console

from cluster import projections
from cluster.cluster_file import DEFAULT_DATA_DIR, read_cluster
from cluster.tool_log import log_like_services

projections_app = cyclopts.App(name="projections", help="The PostgreSQL read models.")
console = Console(highlight=False, soft_wrap=True)


@projections_app.command
def rebuild(
    *,
    data_dir: Annotated[Path, cyclopts.Parameter(name="--data-dir")] = DEFAULT_DATA_DIR,
    nats: str | None = None,
    postgres: str | None = None,
    name: str = projections.DEFAULT_NAME,
) -> None:
    """Empty the read models and project the whole log again. A projector running beside it
    notices and continues from the rebuilt position.

    Parameters
    ----------
    nats
        NATS URL; default: the cluster in --data-dir.
    postgres
        PostgreSQL DSN; default: the cluster in --data-dir.
    name
        The read models' position name.
    """
    log_like_services("warning")
    running = read_cluster(data_dir.resolve())
    nats = nats or (running.nats_url if running else None)
    postgres = postgres or (running.postgres_uri if running else None)
    if nats is None or postgres is None:
        console.print(f"[red]error:[/] no cluster runs from {data_dir}: give --nats and --postgres")
        sys.exit(1)
    credentials = projections.projector_credentials(running, nats)

    began = time.perf_counter()
    try:
        last = asyncio.run(projections.rebuild(nats, postgres, credentials, name))
    except projections.UNREACHABLE as e:
        console.print(f"[red]error:[/] cannot reach the log at {nats}: {e}")
        sys.exit(1)
    elapsed = time.perf_counter() - began
    console.print(f"rebuilt the read models from {last} events in {elapsed:.1f}s")
