"""Why a job is not running, in words a person reads.

For a pending job the reason is the policy's own: the projector runs a scheduling cycle on the
state at the end of each batch and stores the code the plan gives each job it leaves waiting
(`policy.pool_cycle.WaitReason`). This module only puts that code into words, with the numbers
of the read models (the project's standing in the pool, the pool's free GPUs, the job's last
preemption) so the message says how far the job is from running.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.api.types import PendingReason


@dataclass(frozen=True, slots=True)
class Standing:
    """What the message is made from."""

    state: str
    waiting: str  # the policy's reason code; "" when the next cycle starts the job
    preemptible: bool
    gpus_wanted: int  # min replicas x GPUs per replica
    pool: str | None
    pool_free: int | None  # None: the pool is not known (no node registered in it)
    project: str
    usage: int
    quota: int
    limit: int | None
    fair_share: int
    last_preemption: tuple[str, str | None] | None  # (reason, for job) of the last attempt
    ports: tuple[str, ...] = ()  # HOST:CONTAINER each replica publishes on its node


_NOT_PENDING = {
    "submitted": ("admission", "waiting for admission to check it"),
    "paused": ("paused", "paused by its user; resume it to queue it again"),
    "stopping": ("stopping", "its last attempt is stopping"),
}


def pending_reason(s: Standing) -> PendingReason | None:
    if s.state in _NOT_PENDING:
        return PendingReason(*_NOT_PENDING[s.state])
    if s.state != "pending":
        return None
    preempted = ""
    if s.last_preemption is not None:
        reason, for_job = s.last_preemption
        preempted = f"; it was preempted ({reason}" + (f", for {for_job})" if for_job else ")")
    code, message = _words(s)
    return PendingReason(code, message + preempted)


def _words(s: Standing) -> tuple[str, str]:  # noqa: PLR0911 (one case per reason code)
    """The policy's code, said with the numbers that explain it."""
    where = f"in {s.pool}" if s.pool else "in its pools"
    holds = f"project {s.project} holds {s.usage} GPUs {where}"
    match s.waiting:
        case "held":
            return "held", "scheduling is held by an operator; no job starts until it is released"
        case "nominated":
            return "gpus_being_freed", "GPUs are held for it while the jobs preempted for it stop"
        case "no_pool":
            return "no_pool", "no pool it may run in has nodes that could hold it"
        case "limit":
            return "project_limit", (
                f"{holds}; {s.gpus_wanted} more would pass its limit of {s.limit}"
            )
        case "quota":
            return "non_preemptible_over_quota", (
                f"non-preemptible work runs only within quota: {holds} against a quota of"
                f" {s.quota}, the job needs {s.gpus_wanted}"
            )
        case "preemption_delay":
            return "preemption_delay", (
                "it may take GPUs from other jobs only once its preemption delay has passed"
            )
        case "no_fit":
            return _no_fit(s, holds)
        case _:
            return "next_cycle", "it fits: the next scheduling cycle starts it"


def _no_fit(s: Standing, holds: str) -> tuple[str, str]:
    free = f"{s.pool_free} free GPUs" if s.pool_free is not None else "no free GPUs"
    needs = f"{_where_free(s, free)}, the job needs {s.gpus_wanted}"
    if s.ports and (s.pool_free or 0) >= s.gpus_wanted:
        hosts = ", ".join(p.partition(":")[0] for p in s.ports)
        return "ports_taken", (
            f"{needs}, but a replica goes only to a node where its host ports ({hosts}) are"
            " free, one replica a node: it waits for such a node"
        )
    if s.usage + s.gpus_wanted > s.fair_share:
        return "fair_share_reached", (
            f"{needs}, and {holds}: with it the project would hold"
            f" {s.usage + s.gpus_wanted}, beyond its fair share of {s.fair_share}, so it may"
            " not take GPUs from other jobs; it waits for free GPUs"
        )
    return "insufficient_gpus", f"{needs}, and no running job may be preempted to make room"


def _where_free(s: Standing, free: str) -> str:
    return f"pool {s.pool} has {free}" if s.pool else f"its pools have {free}"
