"""Connecting to NATS as this process's own user, through restarts of the server."""

from __future__ import annotations

import nats
import structlog
from nats.aio.client import Client

from services.runtime.auth import Credentials, credentials_from_env
from services.runtime.retry import RetryPolicy

log = structlog.get_logger("fairlane.connection")


async def connect(
    url: str, name: str, retry_for: float = 30.0, credentials: Credentials | None = None
) -> Client:
    """Connect, retrying the first connection (nats-py does not), and never give up later.

    `url` may name several servers of one cluster, comma-separated: the first that answers
    is used, the others when it goes away. `credentials` default to the file named by
    FAIRLANE_NATS_CREDENTIALS, if any (a server without authentication takes a connection
    without them)."""
    servers = [u.strip() for u in url.split(",") if u.strip()]
    creds = credentials or credentials_from_env()
    auth: dict[str, str] = {}
    if creds is not None:
        auth = {"user": creds.user, "password": creds.password, "inbox_prefix": creds.inbox_prefix}

    async def on_error(e: Exception) -> None:  # instead of nats-py's traceback on every retry
        log.warning("nats connection trouble", client=name, error=str(e) or repr(e))

    client: list[Client] = []  # filled in once connected

    async def on_disconnected() -> None:
        if client and (client[0].is_closed or client[0].is_draining):
            return  # closed on purpose: nothing to warn about
        log.warning("disconnected from nats", client=name)

    async def on_reconnected() -> None:
        log.info("reconnected to nats", client=name)

    async def attempt() -> Client:
        nc = await nats.connect(
            servers,
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=2,
            error_cb=on_error,
            disconnected_cb=on_disconnected,
            reconnected_cb=on_reconnected,
            **auth,
        )
        client.append(nc)
        return nc

    def unreachable(e: BaseException) -> bool:
        return isinstance(e, OSError | nats.errors.NoServersError | TimeoutError)

    policy = RetryPolicy(first_wait_s=0.2, max_wait_s=1.0, give_up_after_s=retry_for)
    return await policy.run(attempt, f"connect to {url}", retry_if=unreachable)
