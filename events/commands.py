"""Commands: what users (the CLI, the API) ask of admission and the quota ledger.

Commands travel by NATS request/reply on subjects outside the event stream; the answer is a
`Reply` holding the resulting event, or an error that names the bad value. Commands are not
facts: only the events they lead to are stored.

Every number and name a command carries is bounded (the bounds below, checked as the command
is decoded, before anything is stored): a value out of bounds is refused with a message naming
the field, e.g. `Expected `int` <= 4096 - at `$.spec.gpus``. The bounds are generous for any
real cluster and keep what is stored within what every reader (the snapshot encoder's 64-bit
integers among them) can hold.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from events.catalogue import AnyEvent
from events.model import JobSpec, PortMapping, PriorityClass, SchedulerSettings

ADMISSION_SUBJECT: Final = "fl-cmd.admission"
LEDGER_SUBJECT: Final = "fl-cmd.ledger"

#: Names: projects, pools, nodes, jobs, classes, actors.
MAX_NAME: Final = 128
#: GPUs per replica (a replica runs on one node).
MAX_GPUS: Final = 4096
MAX_REPLICAS: Final = 100_000
#: Quotas and limits, in GPUs; weights.
MAX_GPUS_TOTAL: Final = 10_000_000
MAX_WEIGHT: Final = 1_000_000
#: Job, class and project priorities: from -MAX_PRIORITY to MAX_PRIORITY.
MAX_PRIORITY: Final = 1_000_000
#: Durations (runtime, delays, grace, checkpoint intervals), in seconds: 10 years.
MAX_DURATION_S: Final = 10 * 366 * 86_400.0
MAX_POOLS: Final = 64
MAX_PORTS: Final = 64
#: Volumes a job mounts, and host path prefixes the cluster allows.
MAX_VOLUMES: Final = 32
MAX_VOLUME_GRANTS: Final = 256
MAX_PRIORITY_CLASSES: Final = 256
MAX_COMMAND_ARGS: Final = 1024
MAX_TEXT: Final = 4096
#: A job's spec, encoded: every event that carries it (the submission, each placement's relay
#: to a node) must fit in one bus message (1 MiB by default) with room to spare; a spec just
#: under that limit was stored, and its relay could then never be written.
MAX_SPEC_BYTES: Final = 64 * 1024

#: Text holds anything but the NUL character: PostgreSQL's text refuses it (a NUL stored in
#: the log froze the read models), and a process's arguments and environment cannot hold it.
NO_NUL: Final = r"^[^\x00]*$"

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME, pattern=NO_NUL)]
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT, pattern=NO_NUL)]
MAX_ENV: Final = 256
#: KEY=VALUE, the key a shell variable name
ENV_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_]{0,127}=[^\x00]*$"
EnvEntry = Annotated[str, msgspec.Meta(max_length=MAX_TEXT, pattern=ENV_PATTERN)]
#: What msgspec says of a value that breaks a pattern, and what a person reads instead.
_PATTERNS_SAID: Final = {
    f"`str` matching regex {NO_NUL!r}": "text without the NUL character (\\u0000)",
    f"`str` matching regex {ENV_PATTERN!r}": (
        "KEY=VALUE, KEY a shell variable name, without the NUL character (\\u0000)"
    ),
}
#: an absolute path (PATH_MAX long at most)
WorkingDir = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT, pattern=r"^/[^\x00]*$")]
Gpus = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPUS)]
Replicas = Annotated[int, msgspec.Meta(ge=1, le=MAX_REPLICAS)]
GpuCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPUS_TOTAL)]
Weight = Annotated[int, msgspec.Meta(ge=0, le=MAX_WEIGHT)]
Priority = Annotated[int, msgspec.Meta(ge=-MAX_PRIORITY, le=MAX_PRIORITY)]
Duration = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_DURATION_S)]


class Command(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=True
):
    actor: Name = "user"


class SubmitJob(Command, frozen=True, kw_only=True):
    job_id: Name
    spec: JobSpec
    #: The same key twice is one job: a retried submission is answered with the first verdict.
    idempotency_key: Annotated[str, msgspec.Meta(max_length=256, pattern=NO_NUL)] | None = None


class CancelJob(Command, frozen=True, kw_only=True):
    job_id: Name


class PauseJob(Command, frozen=True, kw_only=True):
    job_id: Name


class ResumeJob(Command, frozen=True, kw_only=True):
    job_id: Name


class SetProject(Command, frozen=True, kw_only=True):
    """Create or change a project in one pool; fields left out keep their values."""

    project: Name
    pool: Name | None = None  # None: the default compute pool
    quota: GpuCount | None = None
    over_quota_weight: Weight | None = None
    limit: GpuCount | None = None  # at least the quota
    no_limit: bool = False
    priority: Priority | None = None


class ConfigureCluster(Command, frozen=True, kw_only=True):
    """Cluster-wide settings; everything is replaced (omitted fields take their defaults)."""

    scheduler: SchedulerSettings = SchedulerSettings()
    preemption_grace_s: Duration = 30.0
    priority_classes: Annotated[
        tuple[PriorityClass, ...], msgspec.Meta(max_length=MAX_PRIORITY_CLASSES)
    ] = ()
    default_compute_pool: Name | None = None
    default_aux_pool: Name | None = None


class HoldScheduling(Command, frozen=True, kw_only=True):
    """Hold (or release) all placements and preemptions."""

    held: bool
    reason: Text = ""


class SetPool(Command, frozen=True, kw_only=True):
    pool: Name
    scheduler: SchedulerSettings | None = None


class CordonNode(Command, frozen=True, kw_only=True):
    """Take a node out of service: no new work goes there; with `drain`, its jobs are also
    asked to checkpoint and stop, and resume elsewhere."""

    node: Name
    drain: bool = False
    reason: Text = ""


class UncordonNode(Command, frozen=True, kw_only=True):
    """Put a cordoned or drained node back in service."""

    node: Name
    reason: Text = ""


class AllowVolume(Command, frozen=True, kw_only=True):
    """Let jobs mount a host folder and what is under it (read-only unless `read_write`);
    allowing a prefix again changes its mode. Recorded as `VolumesConfigured`."""

    #: an absolute path (admission's decider says why another is refused, naming it)
    host_prefix: Text
    read_write: bool = False


class DenyVolume(Command, frozen=True, kw_only=True):
    """Take a host prefix off the allowlist (jobs admitted before keep their mounts)."""

    host_prefix: Text


class SetJobPriority(Command, frozen=True, kw_only=True):
    """Change a job's priority while it may still run (waiting, or running: the policy weighs
    it at its next cycle); recorded as `JobPriorityChanged`."""

    job_id: Name
    priority: Priority


AnyCommand = (
    SubmitJob
    | CancelJob
    | PauseJob
    | ResumeJob
    | SetProject
    | SetPool
    | ConfigureCluster
    | HoldScheduling
    | CordonNode
    | UncordonNode
    | SetJobPriority
    | AllowVolume
    | DenyVolume
)

#: The commands the quota ledger answers (on LEDGER_SUBJECT); admission answers the others.
LEDGER_COMMANDS: Final = (
    SetProject,
    SetPool,
    ConfigureCluster,
    HoldScheduling,
    CordonNode,
    UncordonNode,
    AllowVolume,
    DenyVolume,
)


def service_subject(command: AnyCommand) -> str:
    """The subject of the service that answers `command`."""
    return LEDGER_SUBJECT if isinstance(command, LEDGER_COMMANDS) else ADMISSION_SUBJECT


class Reply(msgspec.Struct, frozen=True, omit_defaults=True):
    ok: bool
    event: AnyEvent | None = None
    error: str = ""
    #: a refusal's `events.refusals.RefusalCode` and the request field it is about (a plain
    #: string, as in `JobRejected`; None from a service that gave no code)
    code: str | None = None
    field: str | None = None
    #: The service could not reach the log just now: the same command may be sent again
    #: (with its idempotency key, a submission stays one job).
    retryable: bool = False


class _CheckpointBounds(msgspec.Struct, frozen=True):
    every_s: Duration
    save_s: Duration = 0.0
    restore_s: Duration = 0.0


class _VolumeBounds(msgspec.Struct, frozen=True, array_like=True):
    host: Text
    container: Text
    read_only: bool = True


class _JobSpecBounds(msgspec.Struct, frozen=True):
    """The bounds of a `JobSpec`'s fields (the spec itself is an event value type, defined
    with the events: this checks it without changing it; fields not named are not bounded)."""

    project: Name
    priority_class: Name | None = None
    priority: Priority | None = None
    gpus: Gpus = 1
    replicas: Replicas = 1
    min_replicas: Replicas | None = None
    pools: Annotated[tuple[Name, ...], msgspec.Meta(max_length=MAX_POOLS)] = ()
    node: Name | None = None
    preemption_delay_s: Duration = 0.0
    min_runtime_s: Duration = 0.0
    command: Annotated[tuple[Text, ...], msgspec.Meta(max_length=MAX_COMMAND_ARGS)] = ()
    image: Text | None = None
    env: Annotated[tuple[EnvEntry, ...], msgspec.Meta(max_length=MAX_ENV)] = ()
    grace_s: Duration | None = None
    duration_s: Duration | None = None
    checkpoint: _CheckpointBounds | None = None
    working_dir: WorkingDir | None = None
    #: how many, not their values: admission refuses a port out of range, naming it
    ports: Annotated[tuple[PortMapping, ...], msgspec.Meta(max_length=MAX_PORTS)] = ()
    #: how many and how long; whether admission allows them is its rule
    volumes: Annotated[tuple[_VolumeBounds, ...], msgspec.Meta(max_length=MAX_VOLUMES)] = ()


class _PriorityClassBounds(msgspec.Struct, frozen=True):
    name: Name
    priority: Priority


def check_bounds(command: AnyCommand) -> None:
    """Raise msgspec.ValidationError, naming the field, for a value out of bounds: for a
    command built in Python (a decoded one had its own fields checked by the decoder)."""
    try:
        msgspec.json.decode(msgspec.json.encode(command), type=type(command))
        _check_values(command)
    except msgspec.ValidationError as e:
        raise clearer(e) from None


def _check_values(command: AnyCommand) -> None:
    """The fields of the value types a command carries, and what no annotation says alone."""
    match command:
        case SubmitJob(spec=spec):  # (min_replicas <= replicas is admission's rule)
            _convert(spec, _JobSpecBounds, "$.spec")
            _check_spec_size(spec)
        case ConfigureCluster(priority_classes=classes):
            for i, priority_class in enumerate(classes):
                _convert(priority_class, _PriorityClassBounds, f"$.priority_classes[{i}]")
        case _:
            pass


def _check_spec_size(spec: JobSpec) -> None:
    size = len(msgspec.json.encode(spec))
    if size <= MAX_SPEC_BYTES:
        return
    fields = msgspec.structs.asdict(spec)
    largest = max(fields, key=lambda name: len(msgspec.json.encode(fields[name])))
    raise msgspec.ValidationError(
        f"Expected a job spec of at most {MAX_SPEC_BYTES} bytes encoded, got {size} bytes"
        f" (its largest field, `{largest}`, is {len(msgspec.json.encode(fields[largest]))}"
        f" bytes) - at `$.spec.{largest}`"
    )


def _convert(value: object, bounds: type[msgspec.Struct], at: str) -> None:
    try:
        msgspec.convert(value, bounds, from_attributes=True)
    except msgspec.ValidationError as e:
        raise msgspec.ValidationError(str(e).replace("`$", f"`{at}", 1)) from None


_command_decoder: msgspec.json.Decoder[AnyCommand] = msgspec.json.Decoder(AnyCommand)
_reply_decoder: msgspec.json.Decoder[Reply] = msgspec.json.Decoder(Reply)


def decode_command(data: bytes) -> AnyCommand:
    """Decode a command and check its bounds (msgspec.DecodeError / ValidationError)."""
    try:
        command = _command_decoder.decode(data)
        _check_values(command)
    except msgspec.ValidationError as e:
        raise clearer(e) from None
    return command


def clearer(error: msgspec.ValidationError) -> msgspec.ValidationError:
    """`error` in words a person reads (a NUL is named as such, not as a regex)."""
    said = in_words(str(error))
    return error if said == str(error) else msgspec.ValidationError(said)


def in_words(message: str) -> str:
    """A validation message with the text patterns said in words."""
    for regex, meant in _PATTERNS_SAID.items():
        message = message.replace(regex, meant)
    return message


def decode_reply(data: bytes) -> Reply:
    return _reply_decoder.decode(data)
