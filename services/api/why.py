"""Why a job is pending, said in one place so that it can follow the policy's own reason codes
once the plan carries them. Until then it is read from the read models: the job's state, its
project's standing in the pool, the pool's free GPUs and the job's last preemption."""

from __future__ import annotations

from dataclasses import dataclass

from services.api.types import PendingReason


@dataclass(frozen=True, slots=True)
class Standing:
    """What the reason is derived from."""

    state: str
    nominated: bool
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


def pending_reason(s: Standing) -> PendingReason | None:
    if s.state == "submitted":
        return PendingReason("admission", "waiting for admission to check it")
    if s.state == "paused":
        return PendingReason("paused", "paused by its user; resume it to queue it again")
    if s.state == "stopping":
        return PendingReason("stopping", "its last attempt is stopping")
    if s.state != "pending":
        return None
    if s.nominated:
        return PendingReason(
            "gpus_being_freed", "GPUs are held for it while the jobs preempted for it stop"
        )
    if s.pool is None or s.pool_free is None:
        return PendingReason("no_pool", "no pool it may run in has any node")
    if s.limit is not None and s.usage + s.gpus_wanted > s.limit:
        return PendingReason(
            "project_limit",
            f"project {s.project} holds {s.usage} GPUs in {s.pool}; {s.gpus_wanted} more would"
            f" pass its limit of {s.limit}",
        )
    if not s.preemptible and s.usage + s.gpus_wanted > s.quota:
        return PendingReason(
            "non_preemptible_over_quota",
            f"non-preemptible work runs only within quota: project {s.project} holds"
            f" {s.usage} of its quota of {s.quota} in {s.pool}, the job needs {s.gpus_wanted}",
        )
    preempted = ""
    if s.last_preemption is not None:
        reason, for_job = s.last_preemption
        preempted = f"; it was preempted ({reason}" + (f", for {for_job})" if for_job else ")")
    if s.gpus_wanted > s.pool_free and s.usage + s.gpus_wanted > s.fair_share:
        return PendingReason(
            "fair_share_reached",
            f"pool {s.pool} has {s.pool_free} free GPUs, the job needs {s.gpus_wanted}, and"
            f" project {s.project} holds {s.usage} against a fair share of {s.fair_share}:"
            f" it may not take GPUs from others{preempted}",
        )
    if s.gpus_wanted > s.pool_free:
        return PendingReason(
            "insufficient_gpus",
            f"pool {s.pool} has {s.pool_free} free GPUs, the job needs {s.gpus_wanted}{preempted}",
        )
    return PendingReason("next_cycle", f"the GPUs are free: waiting for the next cycle{preempted}")
