"""The workload events endpoint: an HTTP server on a Unix socket, one per executor.

Each replica gets the socket's path (`FAIRLANE_EVENTS`) and its attempt's token
(`FAIRLANE_EVENTS_TOKEN`) in its environment; `fairlane.workload` posts to
`POST /v1/events` with `Authorization: Bearer <token>`. A Unix socket, not a port: it needs no
network in the container (its folder is mounted at the same path) and nothing off the node can
reach it. Answers: 202 with the event's id once it is in the log; 400 for a body that is not a
workload event (the reason names the field); 401 for an unknown token; 409 for an attempt that
has ended; 429 past a replica's budget of events; 503 while the attempt's start is not yet
in the log after STARTED_WAIT_S (the workload may try again).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import tempfile
import time
from pathlib import Path
from typing import Final

from aiohttp import web

from services.executor.actuator import Actuator
from services.executor.nodework import NodeWork, desired
from services.executor.workload_events import MAX_BODY, EventRefused, job_event, parse

SOCKET_ENV: Final = "FAIRLANE_EVENTS"
SOCKET_NAME: Final = "events.sock"
#: A Unix socket's path is at most 108 bytes on Linux; keep a margin.
MAX_SOCKET_PATH: Final = 100
#: Events one replica may send: a burst of BURST, then RATE a second (more is refused, 429),
#: so a runaway loop in a workload cannot flood the log.
BURST: Final = 100.0
RATE: Final = 10.0
#: How long an event waits for its attempt's `JobStarted` to be in the log.
STARTED_WAIT_S: Final = 30.0


class Budget:
    """A token bucket per replica."""

    def __init__(self) -> None:
        self.left: dict[str, tuple[float, float]] = {}  # token -> (events left, as of when)

    def take(self, token: str, now: float) -> bool:
        left, then = self.left.get(token, (BURST, now))
        left = min(BURST, left + (now - then) * RATE)
        if left < 1.0:
            self.left[token] = (left, now)
            return False
        self.left[token] = (left - 1.0, now)
        return True

    def forget(self, token: str) -> None:
        self.left.pop(token, None)


def endpoint_dir(data_dir: Path) -> Path:
    """The folder of the executor's socket: in its data folder, or (where that path would be
    too long for a socket) a folder in the temp dir named after it, the same on every run."""
    beside = data_dir / "endpoint"
    if len(str(beside / SOCKET_NAME)) <= MAX_SOCKET_PATH:
        return beside
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"fairlane-{digest}"


class Endpoint:
    """Serves one executor's workloads: the actuator knows their tokens and publishes for
    them; `work` is the node's work, as the executor folds it."""

    def __init__(self, actuator: Actuator, work: NodeWork) -> None:
        self.actuator, self.work = actuator, work
        self.path = endpoint_dir(actuator.data_dir) / SOCKET_NAME
        self.budget = Budget()
        self.accepted = 0
        self.refused = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)  # left by an earlier run
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/v1/events", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.path)).start()
        # Workloads may run as any user in their container, or as their job's own uid
        # (`identity`), who pass through the folder (the socket is all there is in it) but
        # list nothing; the token is the check.
        self.path.chmod(0o666)
        self.path.parent.chmod(0o711)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(OSError):
            self.path.unlink()
            self.path.parent.rmdir()  # only if nothing else is left in it

    async def handle(self, request: web.Request) -> web.Response:
        try:
            event_id = await self._accept(request)
        except EventRefused as e:
            self.refused += 1
            self.actuator.logger.warning("workload event refused", status=e.status, reason=e.reason)
            return web.json_response({"error": e.reason}, status=e.status)
        self.accepted += 1
        return web.json_response({"id": event_id}, status=202)

    async def _accept(self, request: web.Request) -> str:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        ok = token.isascii() and token
        handle = self.actuator.by_token(token) if ok else None
        if handle is None:
            stale = self.actuator.stale.get(token)
            if stale is not None:
                self.budget.forget(token)
                raise EventRefused(409, f"attempt {stale[1]} of job {stale[0]} has ended")
            raise EventRefused(401, "unknown token: not an attempt running on this node")
        job_id, attempt = handle.job_id, handle.attempt
        if not self.budget.take(token, time.monotonic()):
            raise EventRefused(429, f"too many events from job {job_id}: at most {RATE:g} a second")
        body = parse(await request.read())
        job = self.work.jobs.get(job_id)
        if handle.finished.is_set() or not desired(job, attempt, handle.replica):
            raise EventRefused(409, f"attempt {attempt} of job {job_id} has ended")
        started = self.actuator.started.get((job_id, attempt))
        if started is not None and not started.is_set():
            # after the attempt's `JobStarted`, so the timeline reads in order
            try:
                async with asyncio.timeout(STARTED_WAIT_S):
                    await started.wait()
            except TimeoutError:
                raise EventRefused(503, f"attempt {attempt} of job {job_id} is starting") from None
        event = job_event(body, job_id, attempt, self.actuator.clock.now())
        await self.actuator.publish(event)
        if body.kind == "checkpoint":
            self.actuator.saved(handle)  # its folder is stored at the next poll
        return event.id
