"""`fairlane projections rebuild`: the read models made again from the whole log."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Annotated

import cyclopts
from rich.console import Console

from fairlane.cluster_file import DEFAULT_DATA_DIR, read_cluster
from services.projector.service import DEFAULT_NAME, Projector
from services.runtime.auth import load_credentials
from services.runtime.connection import NotAuthorized, connect
from services.runtime.eventlog import JetStreamLog
from services.runtime.main import configure_logging

projections_app = cyclopts.App(name="projections", help="The PostgreSQL read models.")
console = Console(highlight=False, soft_wrap=True)


@projections_app.command
def rebuild(
    *,
    data_dir: Annotated[Path, cyclopts.Parameter(name="--data-dir")] = DEFAULT_DATA_DIR,
    nats: str | None = None,
    postgres: str | None = None,
    name: str = DEFAULT_NAME,
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
    configure_logging("warning")
    running = read_cluster(data_dir.resolve())
    nats = nats or (running.nats_url if running else None)
    postgres = postgres or (running.postgres_uri if running else None)
    if nats is None or postgres is None:
        console.print(f"[red]error:[/] no cluster runs from {data_dir}: give --nats and --postgres")
        sys.exit(1)
    credentials = None  # with --nats: FAIRLANE_NATS_CREDENTIALS, if set
    if running is not None and running.credentials_dir and nats == running.nats_url:
        credentials = load_credentials(Path(running.credentials_dir) / "projector.json")

    async def go(nats_url: str, dsn: str) -> int:
        nc = await connect(nats_url, "fairlane-rebuild", retry_for=5, credentials=credentials)
        log = JetStreamLog(nc)
        try:
            return await Projector(log, dsn, name=name).rebuild()
        finally:
            await log.nc.close()

    began = time.perf_counter()
    try:
        last = asyncio.run(go(nats, postgres))
    except (NotAuthorized, ConnectionError, OSError, TimeoutError) as e:
        console.print(f"[red]error:[/] cannot reach the log at {nats}: {e}")
        sys.exit(1)
    elapsed = time.perf_counter() - began
    console.print(f"rebuilt the read models from {last} events in {elapsed:.1f}s")
