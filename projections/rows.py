"""The rows of the read models, one struct per table (see projections/migrations/)."""

from __future__ import annotations

import msgspec


class TimelineRow(msgspec.Struct, frozen=True):
    """One event as a person reads it: what, when, about whom, why, and whether it took effect
    (`applied`: False for a decision the fold refused because the log had moved past it)."""

    seq: int
    time: float
    type: str
    event_id: str
    actor: str
    causation: str | None
    job_id: str | None
    project: str | None
    pool: str | None
    nodes: tuple[str, ...]
    reason: str | None
    for_job: str | None
    applied: bool
    data: str  # the event itself, JSON


class JobRow(msgspec.Struct, frozen=True):
    """A job as it stands. Times are accounted up to `accounted_at`; a reader adds the time
    since then to the current state's clock (queued while submitted or pending, running while
    running, GPU-seconds while holding GPUs)."""

    job_id: str
    order: int
    project: str
    pool: str | None
    pools: tuple[str, ...]
    state: str
    priority: int
    preemptible: bool
    gpus: int
    replicas: int
    min_replicas: int
    attempt: int
    gpus_held: int
    nodes: tuple[str, ...]
    submitted_at: float
    state_since: float
    queued_s: float
    running_s: float
    gpu_s: float
    accounted_at: float
    first_started_at: float | None  # submit to first start: the wait people feel
    preemptions: int
    nominated: bool
    stop_reason: str
    reject_reason: str
    #: why the policy leaves it waiting, its own reason code (`policy.pool_cycle.WaitReason`);
    #: "" while it is not pending or the next cycle starts it
    waiting: str
    last_seq: int
    #: the ports each replica publishes on its node, `HOST:CONTAINER`
    ports: tuple[str, ...] = ()
    #: where they are reached while it holds replicas: `http://<node address>:<host port>`
    urls: tuple[str, ...] = ()
    #: the host folders its containers mount, `HOST:CONTAINER:ro` or `:rw`
    volumes: tuple[str, ...] = ()


class NodeRow(msgspec.Struct, frozen=True):
    node: str
    pool: str
    gpus: int
    free: int
    lost: bool
    registered_at: float
    lost_at: float | None
    last_seq: int
    #: '' in service, 'cordoned' (no new work) or 'drained' (its jobs asked to move too)
    cordon: str = ""


class ProjectPoolRow(msgspec.Struct, frozen=True):
    """A project's terms and standing in one pool."""

    project: str
    pool: str
    quota: int
    over_quota_weight: int
    limit: int | None
    priority: int
    usage: int
    fair_share: int
    over_quota: bool
    last_seq: int
    #: rule 11: its decayed usage U of the pool (None: the pool has no half-life)
    decayed_usage: float | None = None


class OverQuotaRow(msgspec.Struct, frozen=True):
    """A period in which a project held more than its quota in a pool (from the ledger's
    `ProjectQuotaCrossed`); `ended_at` is None while it lasts."""

    project: str
    pool: str
    started_seq: int
    started_at: float
    ended_at: float | None
    ended_seq: int | None


class PreemptionRow(msgspec.Struct, frozen=True):
    """A victim asked to make room: for whom, why, and the work it lost (GPU-seconds since its
    last checkpoint or start, 0 if it saved a checkpoint on the way out)."""

    seq: int
    victim: str
    attempt: int
    reason: str
    beneficiary: str | None
    pool: str | None
    replicas: int
    gpus: int
    requested_at: float
    preempted_at: float | None
    checkpointed: bool | None
    work_lost_gpu_s: float | None
