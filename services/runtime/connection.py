"""Connecting to NATS as this process's own user, through restarts of the server."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Final

import nats
import structlog
from nats.aio.client import Client

from services.runtime.auth import Credentials, credentials_from_env
from services.runtime.headers import parse_header_lines
from services.runtime.retry import RetryPolicy

log = structlog.get_logger("fairlane.connection")


#: per client made here: what to tell when it has connected again. A request it had sent
#: (a reader's open pull request) went with the old connection, and the server may be a new
#: one that never heard of it: its sender asks again at once instead of waiting out its own
#: timer (seven seconds for a reader, for every service, after each restart of the server).
_reconnect_listeners: weakref.WeakKeyDictionary[Client, list[Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)


def on_reconnect(nc: Client, listener: Callable[[], None]) -> Callable[[], None]:
    """Call `listener` each time `nc` has connected again (only for a client made by
    `connect`; for any other, never); returns what stops it."""
    listeners = _reconnect_listeners.setdefault(nc, [])
    listeners.append(listener)

    def stop() -> None:
        with contextlib.suppress(ValueError):
            listeners.remove(listener)

    return stop


#: The schemes nats-py connects with (a server named without one is `nats://`).
SCHEMES: Final = ("nats", "tls", "ws", "wss")


def url_problem(url: str) -> str | None:
    """What makes `url` (servers of one cluster, comma-separated) one that no connection could
    use, or None: said at once, where a connection would try it until it gave up."""
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if not servers:
        return "names no server"
    for server in servers:
        parts = urllib.parse.urlsplit(server if "://" in server else f"nats://{server}")
        if parts.scheme not in SCHEMES:
            schemes = ", ".join(f"{scheme}://" for scheme in SCHEMES[1:])
            return f"{server!r} is not a NATS server's address (nats://HOST:PORT, or {schemes})"
        try:
            parts.port  # noqa: B018  (read for the ValueError a bad port raises)
        except ValueError:
            return f"{server!r} has no port number 0 to 65535 after its host"
        if not parts.hostname:
            return f"{server!r} names no host"
    return None


class NoServerAnswered(ConnectionError):
    """No server of the URL took a first connection within the time given (none listens
    there, or a firewall drops what is sent)."""


class NotAuthorized(Exception):
    """The server refused this connection's user or password: retrying cannot help (nats-py
    would retry for ever), so the first connection gives up at once and says who was refused."""


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
    who = f"user {creds.user!r}" if creds is not None else "a client without credentials"
    auth: dict[str, Any] = {}
    if creds is not None:
        auth = {"user": creds.user, "password": creds.password, "inbox_prefix": creds.inbox_prefix}

    client: list[Client] = []  # filled in once connected
    refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def on_error(e: Exception) -> None:  # instead of nats-py's traceback on every retry
        if not client and "authorization violation" in str(e).lower() and not refused.done():
            refused.set_result(str(e))
            return
        log.warning("nats connection trouble", client=name, error=str(e) or repr(e))

    async def on_disconnected() -> None:
        if client and (client[0].is_closed or client[0].is_draining):
            return  # closed on purpose: nothing to warn about
        log.warning("disconnected from nats", client=name)

    async def on_reconnected() -> None:
        log.info("reconnected to nats", client=name)
        for listener in list(_reconnect_listeners.get(client[0], ())) if client else ():
            listener()

    deadline = asyncio.get_running_loop().time() + retry_for

    async def attempt() -> Client:
        # nats-py tries a first connection again and again by itself, without end (the
        # unlimited reconnects asked for below are meant for later ones): `retry_for` ends it
        try:
            async with asyncio.timeout_at(deadline):
                nc = await _unless_refused(refused, who, _connect())
        except TimeoutError:
            raise NoServerAnswered(f"no server answered within {retry_for:g}s") from None
        client.append(nc)
        return nc

    async def _connect() -> Client:
        nc = Client()
        # nats-py's own parse of every message's headers was its largest cost (headers.py)
        nc._parse_header_lines = parse_header_lines  # type: ignore[method-assign]
        await nc.connect(
            servers,
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,  # type: ignore[arg-type]  # seconds; nats-py sleeps a float
            connect_timeout=2,
            error_cb=on_error,
            disconnected_cb=on_disconnected,
            reconnected_cb=on_reconnected,
            **auth,
        )
        return nc

    def unreachable(e: BaseException) -> bool:
        return isinstance(e, OSError | nats.errors.NoServersError | TimeoutError)

    policy = RetryPolicy(first_wait_s=0.2, max_wait_s=1.0, give_up_after_s=retry_for)
    return await policy.run(attempt, f"connect to {url}", retry_if=unreachable)


async def _unless_refused(
    refused: asyncio.Future[str], who: str, connecting: Coroutine[Any, Any, Client]
) -> Client:
    """The connection, or `NotAuthorized` as soon as the server refuses `who`."""
    task = asyncio.ensure_future(connecting)
    either: set[asyncio.Future[Any]] = {task, refused}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
    finally:  # refused, or given up on (a timeout): the connecting stops too
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    raise NotAuthorized(f"the NATS server refused {who}: {refused.result()}")
