"""`fairlane deploy`: what a deployment outside the embedded cluster (deploy/compose.yaml) needs
done once: its secrets, the stream and buckets, and the read models' schema.

- `secrets DIR`: the nats-server authorization config (and the same with the cluster's
  authenticated routes, for compose.cluster.yaml) and one credentials file per NATS user,
  made by the same code as the embedded cluster's; plus PostgreSQL's password and the API's
  admin token (cluster/deploy.py says why the files are as they are). Existing secrets are
  kept (running containers keep working).
- `provision`: the stream, the lease bucket and the snapshot store, as the admin user, waiting
  while the servers elect their JetStream leaders.
- `migrate`: the SQL migrations of the read models (the projector also applies them; doing it
  once before anything starts keeps the API from starting on an empty database).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import asyncpg
import cyclopts
from rich.console import Console

from cluster.deploy import (
    DeployError,
    migrate_read_models,
    provision_deployed,
    write_secrets,
)
from cluster.provision import DEFAULT_MAX_BYTES
from cluster.tool_log import log_like_services

deploy_app = cyclopts.App(name="deploy", help="One-time steps of a compose deployment.")
console = Console(highlight=False, soft_wrap=True)


@deploy_app.command(name="secrets")
def secrets_command(
    folder: Path,
    *,
    node: Annotated[list[str] | None, cyclopts.Parameter(name="--node")] = None,
) -> None:
    """Write the NATS users' credentials and server config, PostgreSQL's password and the
    API's admin token into FOLDER (kept where they exist already).

    Parameters
    ----------
    folder
        Where to write them (made with mode 0700).
    node
        A node executor's node name (one NATS user each); repeat for several. Default:
        node-1 and node-2, the executors of compose.yaml. Nodes added before keep their
        users: run it again with only the new node's name to add one.
    """
    nodes = node or ["node-1", "node-2"]
    written = write_secrets(folder, nodes)
    for path in written:
        console.print(str(path))


@deploy_app.command(name="provision")
def provision_command(
    *,
    nats: Annotated[str, cyclopts.Parameter(env_var="FAIRLANE_NATS_URL")],
    replicas: int = 1,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> None:
    """Create the stream, the lease bucket and the snapshot store (or bring the stream's
    limits to these), as the admin user named by FAIRLANE_NATS_CREDENTIALS.

    Parameters
    ----------
    nats
        NATS URL (several, comma-separated, for a cluster); default: FAIRLANE_NATS_URL.
    replicas
        Copies of the stream and buckets (3 on a three-node cluster).
    max_bytes
        The stream's size limit.
    """
    log_like_services("info")
    try:
        asyncio.run(provision_deployed(nats, replicas, max_bytes))
    except DeployError as e:
        console.print(f"[red]error:[/] {e}")
        sys.exit(1)
    console.print(f"stream and buckets ready ({replicas} replica(s))")


@deploy_app.command(name="migrate")
def migrate_command(
    *, postgres: Annotated[str, cyclopts.Parameter(env_var="FAIRLANE_POSTGRES_DSN")]
) -> None:
    """Apply the read models' SQL migrations not applied yet (PGPASSWORD or a .pgpass file
    supply the password when the DSN has none).

    Parameters
    ----------
    postgres
        PostgreSQL DSN; default: FAIRLANE_POSTGRES_DSN.
    """
    log_like_services("info")
    try:
        applied = asyncio.run(migrate_read_models(postgres))
    except (OSError, asyncpg.PostgresError) as e:
        console.print(f"[red]error:[/] migrations on {postgres}: {e}")
        sys.exit(1)
    console.print(f"schema up to date ({len(applied)} migration(s) applied)")
