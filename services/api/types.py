"""What the API takes and gives, as msgspec structs (its OpenAPI schema is made from these).

Every input is bounded: names by the same pattern the services accept, counts and pages by
ranges, lists by length.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from events.commands import (
    MAX_COMMAND_ARGS,
    MAX_ENV,
    MAX_POOLS,
    MAX_PORTS,
    MAX_VOLUMES,
    NO_NUL,
    Duration,
    GpuCount,
    Gpus,
    Priority,
    Replicas,
    Text,
    Weight,
    WorkingDir,
)
from policy.commands.names import PATTERN as NAME_PATTERN

Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
Count = Annotated[int, msgspec.Meta(ge=0, le=100_000)]
EnvKey = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$(?!\n)")]


class Error(msgspec.Struct):
    """Every error: what went wrong, and the field it is about where there is one."""

    error: str
    status: int
    field: str | None = None


class VolumeRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A host folder each replica's container mounts: the node's `host` path at `container`
    (default: the same path), read-only unless `read_only` is false. Admission checks both
    paths and the cluster's allowlist, and names the value."""

    host: Text
    container: Text | None = None
    read_only: bool = True


class VolumeGrantView(msgspec.Struct):
    """A host path prefix jobs may mount (and what is under it)."""

    prefix: str
    read_write: bool


class VolumeAllowRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A host path prefix to allow (again: its mode changes)."""

    host_prefix: Text
    read_write: bool = False


class PortRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A port each replica publishes on its node: the node's `host` port reaches the
    workload's `container` port (default: the same). Admission checks the range (1..65535)
    and names the value."""

    host: Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
    container: Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)] | None = None


class SubmitRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A job to submit. Its bounds are the commands' own (`events/commands.py`), said once, so
    what the API takes is what admission takes."""

    job_id: Name
    project: Name
    gpus: Gpus = 1
    replicas: Replicas = 1
    min_replicas: Replicas | None = None
    job_class: Name | None = msgspec.field(default=None, name="class")
    priority: Priority | None = None
    pools: Annotated[list[Name], msgspec.Meta(max_length=MAX_POOLS)] = []
    node: Name | None = None
    command: Annotated[list[Text], msgspec.Meta(max_length=MAX_COMMAND_ARGS)] = []
    image: Text | None = None
    #: the workload's environment (Fairlane's own FAIRLANE_* and GPU variables win)
    env: Annotated[dict[EnvKey, Text], msgspec.Meta(max_length=MAX_ENV)] = {}
    preemptible: bool | None = None
    preemption_delay_s: Duration = 0.0
    min_runtime_s: Duration = 0.0
    grace_s: Duration | None = None
    #: where the workload runs on its node: an absolute path
    working_dir: WorkingDir | None = None
    #: ports each replica publishes on its node (an interactive job's notebook, say)
    ports: Annotated[list[PortRequest], msgspec.Meta(max_length=MAX_PORTS)] = []
    #: host folders each replica's container mounts (Docker runtime; the cluster's allowlist)
    volumes: Annotated[list[VolumeRequest], msgspec.Meta(max_length=MAX_VOLUMES)] = []
    idempotency_key: Annotated[str, msgspec.Meta(max_length=256, pattern=NO_NUL)] | None = None


class ProjectRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A project's terms in one pool; what is left out keeps its value. Its bounds are the
    command's own (`events/commands.py`), as the submission's are."""

    pool: Name | None = None
    quota: GpuCount | None = None
    over_quota_weight: Weight | None = None
    limit: GpuCount | None = None
    no_limit: bool = False
    priority: Priority | None = None


class PoolRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The pool's own scheduler settings (replacing the cluster's), or none to follow them."""

    scheduler: Literal["fair_share", "priority", "round_robin"] | None = None
    fitting: Literal["best", "worst"] = "best"
    victim_order: Literal["newest", "cost"] = "newest"
    #: Rule 11: the half-life of the usage history the fair share weighs, in seconds (None: off;
    #: the bounds are the command's, whose error names the value)
    usage_half_life_s: float | None = None
    usage_k: float = 1.0


class NodeServiceRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Why a node is taken out of service or put back (kept on its timeline)."""

    reason: Annotated[str, msgspec.Meta(max_length=1000)] = ""


class JobUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """What may change of a job once submitted."""

    priority: Priority


class TokenRequest(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    projects: Annotated[list[Name], msgspec.Meta(max_length=1000)] = []
    admin: bool = False
    #: Seconds from now until the token is refused (a minute to ten years); none: never.
    expires_in_s: Annotated[float, msgspec.Meta(ge=60, le=10 * 365 * 86400)] | None = None


class TokenCreated(msgspec.Struct):
    name: str
    token: str  # shown once; only its hash is kept
    projects: list[str]
    admin: bool
    expires_at: float | None = None


class TokenInfo(msgspec.Struct, omit_defaults=True):
    name: str
    projects: list[str]
    admin: bool
    #: Unix seconds; left out: never (or, from /v1/token, not said)
    expires_at: float | None = None
    #: Unix seconds (in the token list)
    created_at: float | None = None


class Whoami(msgspec.Struct):
    """The caller, as its token says."""

    name: str
    admin: bool
    #: the projects it may act on and read (every project for an admin token)
    projects: list[str]
    expires_at: float | None


class Accepted(msgspec.Struct):
    """A command's result: the event it led to (see the event catalogue)."""

    type: str
    event: dict[str, Any]


class PendingReason(msgspec.Struct):
    code: str
    message: str


class Job(msgspec.Struct):
    job_id: str
    project: str
    pool: str | None
    pools: list[str]
    state: str
    priority: int
    preemptible: bool
    gpus: int
    replicas: int
    min_replicas: int
    attempt: int
    gpus_held: int
    nodes: list[str]
    submitted_at: float
    state_since: float
    queued_s: float
    running_s: float
    gpu_hours: float
    preemptions: int
    first_started_at: float | None
    last_seq: int
    #: why the policy leaves it waiting (no_fit, limit, quota, preemption_delay, held,
    #: nominated, no_pool); "" when it is not pending or the next cycle starts it
    waiting: str = ""
    #: ports each replica publishes on its node (`HOST:CONTAINER`), and while it holds
    #: replicas where they are reached (`http://<node address>:<host port>`)
    ports: list[str] = []
    urls: list[str] = []
    #: host folders its containers mount, `HOST:CONTAINER:ro` or `:rw`
    volumes: list[str] = []


class JobDetail(Job, kw_only=True):
    pending_reason: PendingReason | None = None
    reject_reason: str | None = None


class JobPage(msgspec.Struct):
    items: list[Job]
    #: Pass as `after` for the next page; None on the last page.
    next: int | None


class TimelineEntry(msgspec.Struct):
    seq: int
    time: float
    type: str
    actor: str
    job_id: str | None
    project: str | None
    pool: str | None
    nodes: list[str]
    reason: str | None
    for_job: str | None
    #: False for a decision that had no effect: the log had moved past the state it was
    #: made on.
    applied: bool
    event: dict[str, Any]
    #: with `rederive=true`, for a decision: what the policy, re-run on the state it was made
    #: from, says of it (`matches`, `differs`, `not_derived`, `other_version`, `other_actor`)
    rederived: str | None = None


class TimelinePage(msgspec.Struct):
    items: list[TimelineEntry]
    #: Pass as `after` for the next page (as `before` for the earlier page of a `newest`
    #: one); None on the last page.
    next: int | None


class ProjectPool(msgspec.Struct):
    project: str
    pool: str
    quota: int
    over_quota_weight: int
    limit: int | None
    priority: int
    usage: int
    fair_share: int
    over_quota: bool
    #: rule 11: its decayed usage U, a part of the pool's decayed GPU-seconds (None: the pool
    #: has no usage half-life)
    decayed_usage: float | None = None


class ProjectThen(msgspec.Struct):
    """A project's terms and usage in one pool as they stood at a log position (without its
    fair share, which depends on every other project too)."""

    pool: str
    quota: int
    over_quota_weight: int
    limit: int | None
    priority: int
    usage: int
    over_quota: bool


class OverQuotaPeriod(msgspec.Struct):
    pool: str
    started_at: float
    ended_at: float | None


class Project(msgspec.Struct):
    name: str
    pools: list[ProjectPool]
    over_quota_periods: list[OverQuotaPeriod]


class Node(msgspec.Struct):
    node: str
    pool: str
    gpus: int
    free: int
    lost: bool
    #: '' in service, 'cordoned' (no new work) or 'drained' (no work at all)
    cordon: str = ""


class Pool(msgspec.Struct):
    pool: str
    nodes: int
    gpus: int
    free: int
    allocated: int
    queued_jobs: int


class Preemption(msgspec.Struct):
    seq: int
    victim: str
    attempt: int
    reason: str
    beneficiary: str | None
    pool: str | None
    gpus: int
    requested_at: float
    preempted_at: float | None
    checkpointed: bool | None
    work_lost_gpu_s: float | None


class Health(msgspec.Struct):
    projected_seq: int
    log_seq: int
