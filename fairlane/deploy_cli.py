"""`fairlane deploy`: what a deployment outside the embedded cluster (deploy/compose.yaml) needs
done once: its secrets, the stream and buckets, and the read models' schema.

- `secrets DIR`: the nats-server authorization config (and the same with the cluster's
  authenticated routes, for compose.cluster.yaml) and one credentials file per NATS user,
  made by the same code as the embedded cluster's (services/runtime/auth.py), so a compose
  deployment has the same least privilege; plus PostgreSQL's password and the API's admin
  token. Existing secrets are kept (running containers keep working). Compose secrets without
  swarm are bind mounts that keep the host file's owner and mode, and the containers run as
  users of their own, so the files are readable by all (0644) inside a folder only its owner
  may enter (0700): nobody else on the host reaches them, and each container is given only
  its own file.
- `provision`: the stream, the lease bucket and the snapshot store, as the admin user, waiting
  while the servers elect their JetStream leaders.
- `migrate`: the SQL migrations of the read models (the projector also applies them; doing it
  once before anything starts keeps the API from starting on an empty database).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from pathlib import Path
from typing import Annotated, Final

import asyncpg
import cyclopts
from rich.console import Console

from services.api.tokens import admin_token_file
from services.runtime.auth import (
    ADMIN,
    Cluster,
    credentials_dir,
    credentials_from_env,
    write_auth,
)
from services.runtime.connection import connect
from services.runtime.main import configure_logging
from services.runtime.postgres import connect_pool, migrate
from services.runtime.provision import DEFAULT_MAX_BYTES, provision
from services.runtime.retry import RetryPolicy

deploy_app = cyclopts.App(name="deploy", help="One-time steps of a compose deployment.")
console = Console(highlight=False, soft_wrap=True)

#: The files `secrets` writes, relative to its folder (deploy/compose.yaml names them).
NATS_CONFIG = "nats-server.conf"
#: The same users, and the cluster block of compose.cluster.yaml's three servers: their routes
#: log in (the flags `--cluster` and `--routes` would drop that: a `--cluster` URL without a
#: user clears the config's route login, so that file gives none)
NATS_CLUSTER_CONFIG = "nats-cluster.conf"
COMPOSE_CLUSTER: Final = Cluster(
    name="fairlane", listen="0.0.0.0:6222", routes=["nats:6222", "nats-2:6222", "nats-3:6222"]
)
POSTGRES_PASSWORD = "postgres-password"
API_ADMIN_TOKEN = "api-admin-token"
#: How long `provision` and `migrate` wait for their servers.
WAIT_FOR_SERVERS_S = 120.0


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


def write_secrets(folder: Path, nodes: list[str]) -> list[Path]:
    """Every secret a compose deployment needs, under `folder`; returns the files."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    files = list(write_auth(folder, folder / NATS_CONFIG, nodes).values())
    write_auth(folder, folder / NATS_CLUSTER_CONFIG, nodes, cluster=COMPOSE_CLUSTER)
    files += [folder / NATS_CONFIG, folder / NATS_CLUSTER_CONFIG]
    password = folder / POSTGRES_PASSWORD
    if not password.exists():
        fd = os.open(password, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
    files.append(password)
    admin_token_file(folder / API_ADMIN_TOKEN)
    files.append(folder / API_ADMIN_TOKEN)
    os.chmod(credentials_dir(folder), 0o755)  # the folder above keeps others out
    for path in files:
        os.chmod(path, 0o644)
    return files


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
    configure_logging("info")
    creds = credentials_from_env()
    if creds is None or creds.user != ADMIN:
        console.print("[red]error:[/] FAIRLANE_NATS_CREDENTIALS must name the admin's file")
        sys.exit(1)
    if replicas not in (1, 3, 5):
        console.print(f"[red]error:[/] --replicas {replicas}: use 1, 3 or 5")
        sys.exit(1)

    async def go() -> None:
        nc = await connect(nats, "fairlane-provision", retry_for=WAIT_FOR_SERVERS_S)
        try:
            policy = RetryPolicy(max_wait_s=2.0, give_up_after_s=WAIT_FOR_SERVERS_S)
            js = nc.jetstream()
            await policy.run(lambda: provision(js, max_bytes, replicas=replicas), "provision")
        finally:
            await nc.close()

    asyncio.run(go())
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
    configure_logging("info")

    async def go() -> list[str]:
        pool = await connect_pool(postgres, retry_for=WAIT_FOR_SERVERS_S, max_size=1)
        try:
            async with pool.acquire() as conn:
                return await migrate(conn)
        finally:
            await pool.close()

    try:
        applied = asyncio.run(go())
    except (OSError, asyncpg.PostgresError) as e:
        console.print(f"[red]error:[/] migrations on {postgres}: {e}")
        sys.exit(1)
    console.print(f"schema up to date ({len(applied)} migration(s) applied)")
