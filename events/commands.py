"""Commands: what users (the CLI, the API) ask of admission and the quota ledger.

Commands travel by NATS request/reply on subjects outside the event stream; the answer is a
`Reply` holding the resulting event, or an error that names the bad value. Commands are not
facts: only the events they lead to are stored.
"""

from __future__ import annotations

from typing import Final

import msgspec

from events.catalogue import AnyEvent
from events.model import JobSpec, PriorityClass, SchedulerSettings

ADMISSION_SUBJECT: Final = "fl-cmd.admission"
LEDGER_SUBJECT: Final = "fl-cmd.ledger"


class Command(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=True
):
    actor: str = "user"


class SubmitJob(Command, frozen=True, kw_only=True):
    job_id: str
    spec: JobSpec
    #: The same key twice is one job: a retried submission is answered with the first verdict.
    idempotency_key: str | None = None


class CancelJob(Command, frozen=True, kw_only=True):
    job_id: str


class PauseJob(Command, frozen=True, kw_only=True):
    job_id: str


class ResumeJob(Command, frozen=True, kw_only=True):
    job_id: str


class SetProject(Command, frozen=True, kw_only=True):
    """Create or change a project in one pool; fields left out keep their values."""

    project: str
    pool: str | None = None  # None: the default compute pool
    quota: int | None = None
    over_quota_weight: int | None = None
    limit: int | None = None
    no_limit: bool = False
    priority: int | None = None


class ConfigureCluster(Command, frozen=True, kw_only=True):
    """Cluster-wide settings; everything is replaced (omitted fields take their defaults)."""

    scheduler: SchedulerSettings = SchedulerSettings()
    preemption_grace_s: float = 30.0
    priority_classes: tuple[PriorityClass, ...] = ()
    default_compute_pool: str | None = None
    default_aux_pool: str | None = None


class HoldScheduling(Command, frozen=True, kw_only=True):
    """Hold (or release) all placements and preemptions."""

    held: bool
    reason: str = ""


class SetPool(Command, frozen=True, kw_only=True):
    pool: str
    scheduler: SchedulerSettings | None = None


AnyCommand = (
    SubmitJob
    | CancelJob
    | PauseJob
    | ResumeJob
    | SetProject
    | SetPool
    | ConfigureCluster
    | HoldScheduling
)

#: The commands the quota ledger answers (on LEDGER_SUBJECT); admission answers the others.
LEDGER_COMMANDS: Final = (SetProject, SetPool, ConfigureCluster, HoldScheduling)


def service_subject(command: AnyCommand) -> str:
    """The subject of the service that answers `command`."""
    return LEDGER_SUBJECT if isinstance(command, LEDGER_COMMANDS) else ADMISSION_SUBJECT


class Reply(msgspec.Struct, frozen=True, omit_defaults=True):
    ok: bool
    event: AnyEvent | None = None
    error: str = ""
    #: The service could not reach the log just now: the same command may be sent again
    #: (with its idempotency key, a submission stays one job).
    retryable: bool = False


_command_decoder: msgspec.json.Decoder[AnyCommand] = msgspec.json.Decoder(AnyCommand)
_reply_decoder: msgspec.json.Decoder[Reply] = msgspec.json.Decoder(Reply)


def decode_command(data: bytes) -> AnyCommand:
    return _command_decoder.decode(data)


def decode_reply(data: bytes) -> Reply:
    return _reply_decoder.decode(data)
