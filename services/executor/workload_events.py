"""Deciding on an event a workload sends through its executor: the pure part.

A workload reports progress, a checkpoint it saved, or a message (see `fairlane.workload`).
It proves which attempt it is with the token its executor gave that attempt; the job and the
attempt are taken from the token, never from the request, so a workload can only write on its
own job's timeline. An attempt that has ended (the log moved on, or the replica exited) can
write nothing more.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec

from events import Event, JobCheckpointed, JobMessage, JobProgress, ids
from events.commands import NO_NUL, clearer

MAX_BODY: Final = 16 * 1024
MAX_METRICS: Final = 64
ID_PATTERN: Final = r"^[A-Za-z0-9_-]{1,64}$(?!\n)"

# no NUL: the read models store every text of the log, and PostgreSQL refuses it
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=NO_NUL)]
Count = Annotated[int, msgspec.Meta(ge=0)]


class WorkloadEvent(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body a workload posts. `id` is the workload's own (a retry repeats it)."""

    id: Annotated[str, msgspec.Meta(pattern=ID_PATTERN)]
    kind: Literal["progress", "checkpoint", "message"]
    step: Count | None = None
    epoch: Count | None = None
    metrics: Annotated[dict[Name, float], msgspec.Meta(max_length=MAX_METRICS)] = {}
    size_bytes: Count | None = None
    text: Annotated[str, msgspec.Meta(max_length=4000, pattern=NO_NUL)] = ""


_decoder = msgspec.json.Decoder(WorkloadEvent)


class EventRefused(Exception):
    """The request is refused; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def parse(body: bytes) -> WorkloadEvent:
    if len(body) > MAX_BODY:
        raise EventRefused(413, f"an event is at most {MAX_BODY} bytes, this one {len(body)}")
    try:
        event = _decoder.decode(body)
    except msgspec.ValidationError as e:
        raise EventRefused(400, f"not a workload event: {clearer(e)}") from None
    except msgspec.DecodeError as e:
        raise EventRefused(400, f"not a workload event: {e}") from None
    if event.kind == "message" and not event.text:
        raise EventRefused(400, "a message needs its `text`")
    return event


def job_event(request: WorkloadEvent, job_id: str, attempt: int, now: float) -> Event:
    """The job event a checked request becomes, attributed to the workload."""
    event_id = ids.from_workload(job_id, attempt, request.id)
    actor = f"workload/{job_id}/{attempt}"
    match request.kind:
        case "progress":
            return JobProgress(
                id=event_id,
                time=now,
                actor=actor,
                job_id=job_id,
                attempt=attempt,
                step=request.step,
                epoch=request.epoch,
                metrics=dict(request.metrics),
            )
        case "checkpoint":
            return JobCheckpointed(
                id=event_id,
                time=now,
                actor=actor,
                job_id=job_id,
                attempt=attempt,
                step=request.step,
                size_bytes=request.size_bytes,
            )
        case _:
            return JobMessage(
                id=event_id,
                time=now,
                actor=actor,
                job_id=job_id,
                attempt=attempt,
                text=request.text,
            )
