"""For workloads: put your own events on your job's timeline, through your executor.

Standard library only, so a training script can use it inside any container:

    from fairlane import workload

    start = workload.resume_step()                   # where a resumed attempt picks up
    workload.progress(step=100, epoch=1, metrics={"loss": 0.42})
    workload.checkpoint_saved(step=100, size_bytes=52_428_800)
    workload.message("warm-up done")

Each call posts one event to the executor that started this attempt, through the Unix socket
in `FAIRLANE_EVENTS` with the attempt's token from `FAIRLANE_EVENTS_TOKEN`; the executor checks
the token and records the event on the job's timeline (`JobProgress`, `JobCheckpointed`,
`JobMessage`), attributed to the workload. Outside Fairlane (no such variables) the calls do
nothing and return None. An event the executor refuses (a bad value, an attempt that has
ended) raises `EventRefused` with its reason; a connection that fails, or an executor that asks to
wait (429, 503), is tried again a few times with the same event id, so the event is recorded
at most once, then raises.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

SOCKET_ENV = "FAIRLANE_EVENTS"
TOKEN_ENV = "FAIRLANE_EVENTS_TOKEN"
TRIES = 5
TIMEOUT_S = 10.0
#: Answers worth trying again a little later: too many events, the attempt still starting.
AGAIN = (429, 503)


class EventRefused(Exception):
    """The executor refused the event (`status` is its HTTP status)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=TIMEOUT_S)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT_S)
        sock.connect(self.path)
        self.sock = sock


def attempt() -> int:
    """This attempt's number (1, 2, ...)."""
    return int(os.environ.get("FAIRLANE_ATTEMPT", "1"))


def resumed() -> bool:
    """Whether this attempt follows a preemption (resume from the checkpoint)."""
    return os.environ.get("FAIRLANE_RESUMED") == "1"


def checkpoint_dir() -> Path:
    """The job's checkpoint folder: the same on every attempt."""
    return Path(os.environ.get("FAIRLANE_CHECKPOINT_DIR", "."))


def touch_checkpoint_marker() -> None:
    """The older way to say "checkpoint saved": the executor watches this file's mtime."""
    (checkpoint_dir() / ".checkpoint").touch()


def send(kind: str, **fields: Any) -> str | None:
    """Post one event; returns its id on the timeline (None outside Fairlane)."""
    path, token = os.environ.get(SOCKET_ENV), os.environ.get(TOKEN_ENV)
    if not path or not token:
        return None
    body = json.dumps({"id": uuid.uuid4().hex, "kind": kind, **fields}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    for attempt_no in range(TRIES):
        connection = _UnixConnection(path)
        try:
            connection.request("POST", "/v1/events", body=body, headers=headers)
            response = connection.getresponse()
            answer = json.loads(response.read() or b"{}")
        except (OSError, http.client.HTTPException, ValueError):
            if attempt_no == TRIES - 1:
                raise
            time.sleep(0.2 * 2**attempt_no)
            continue
        finally:
            connection.close()
        if response.status == 202:
            return str(answer.get("id", ""))
        if response.status in AGAIN and attempt_no < TRIES - 1:
            time.sleep(0.2 * 2**attempt_no)
            continue
        raise EventRefused(response.status, str(answer.get("error", response.reason)))
    return None  # not reached: the last try returns or raises


def progress(
    step: int | None = None, epoch: int | None = None, metrics: dict[str, float] | None = None
) -> str | None:
    """How far the workload got: a step, an epoch, and numbers such as the loss."""
    return send("progress", step=step, epoch=epoch, metrics=metrics or {})


def checkpoint_saved(step: int | None = None, size_bytes: int | None = None) -> str | None:
    """A checkpoint was saved (cost-aware preemption counts the work since the last one)."""
    return send("checkpoint", step=step, size_bytes=size_bytes)


def message(text: str) -> str | None:
    """A line on the job's timeline."""
    return send("message", text=text)
