"""What a deployment outside the embedded cluster (deploy/compose.yaml) needs done once: its
secrets, the stream and buckets, and the read models' schema (`fairlane deploy`).

The secrets are made by the same code as the embedded cluster's (services/runtime/auth.py),
so a compose deployment has the same least privilege. Compose secrets without swarm are bind
mounts that keep the host file's owner and mode, and the containers run as users of their
own, so the files are readable by all (0644) inside a folder only its owner may enter
(0700): nobody else on the host reaches them, and each container is given only its own file.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Final

from cluster.provision import provision
from services.api.tokens import admin_token_file
from services.runtime.auth import ADMIN, Cluster, credentials_dir, credentials_from_env, write_auth
from services.runtime.connection import connect
from services.runtime.postgres import connect_pool, migrate
from services.runtime.retry import RetryPolicy

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


REPLICAS: Final = (1, 3, 5)


class DeployError(RuntimeError):
    """A step cannot be done as asked; the message names the flag or setting."""


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


async def provision_deployed(nats: str, replicas: int, max_bytes: int) -> None:
    """The stream and buckets, as the admin user FAIRLANE_NATS_CREDENTIALS names, waiting
    while the servers elect their JetStream leaders."""
    creds = credentials_from_env()
    if creds is None or creds.user != ADMIN:
        raise DeployError("FAIRLANE_NATS_CREDENTIALS must name the admin's file")
    if replicas not in REPLICAS:
        raise DeployError(f"--replicas {replicas}: use 1, 3 or 5")
    nc = await connect(nats, "fairlane-provision", retry_for=WAIT_FOR_SERVERS_S)
    try:
        policy = RetryPolicy(max_wait_s=2.0, give_up_after_s=WAIT_FOR_SERVERS_S)
        js = nc.jetstream()
        await policy.run(lambda: provision(js, max_bytes, replicas=replicas), "provision")
    finally:
        await nc.close()


async def migrate_read_models(postgres: str) -> list[str]:
    """The read models' SQL migrations not applied yet, applied; their names."""
    pool = await connect_pool(postgres, retry_for=WAIT_FOR_SERVERS_S, max_size=1)
    try:
        async with pool.acquire() as conn:
            return await migrate(conn)
    finally:
        await pool.close()
