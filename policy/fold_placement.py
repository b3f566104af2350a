"""The fold's handlers for a job's way to GPUs: submitted, admitted or rejected, its priority
changed, GPUs held for it (a nomination) and placed (a placement, or more replicas for a
running elastic job). The fold referees the decisions here: one on a cordoned node, a taken
GPU or a taken host port has no effect."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Final

from events import (
    Event,
    JobAdmitted,
    JobNominated,
    JobPriorityChanged,
    JobRejected,
    JobScheduled,
    JobSubmitted,
    Replica,
)
from policy.cluster_data import UNKNOWN_JOB, ClusterData, Handler, Refusal
from policy.records import FINAL_PHASES, Job, gpus_in


def _job_submitted(state: ClusterData, e: JobSubmitted) -> Refusal:
    known = state.jobs.get(e.job_id)
    if known is not None and known.phase != "rejected":
        return "job already submitted"
    job = Job(id=e.job_id, seq=state._job_seq, spec=e.spec, submitted_at=e.time)
    if known is not None:  # the name of a rejected job, used again: a new job
        job.resubmitted_after = known.rejected_at
    state._job_seq += 1
    state.jobs[e.job_id] = job
    state._settle(job)
    return None


def _job_admitted(state: ClusterData, e: JobAdmitted) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return UNKNOWN_JOB
    if job.phase != "submitted":
        return f"job is {job.phase}, not submitted"
    job.project, job.priority, job.preemptible = e.project, e.priority, e.preemptible
    job.gpus, job.replicas, job.min_replicas = e.gpus, e.replicas, e.min_replicas
    job.pools, job.node = e.pools, e.node
    job.preemption_delay_s, job.min_runtime_s = e.preemption_delay_s, e.min_runtime_s
    if job.spec.checkpoint is not None:
        job.save_s, job.restore_s = job.spec.checkpoint.save_s, job.spec.checkpoint.restore_s
    job.phase, job.pending_since = "pending", e.time
    state.share_values(job)
    return None


def _job_rejected(state: ClusterData, e: JobRejected) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return UNKNOWN_JOB
    if job.phase != "submitted":
        return f"job is {job.phase}, not submitted"
    job.phase, job.reject_reason, job.rejected_at = "rejected", e.reason, state.position
    state._settle(job)
    return None


def _job_priority_changed(state: ClusterData, e: JobPriorityChanged) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return UNKNOWN_JOB
    if job.phase in FINAL_PHASES:
        return f"job is {job.phase}"
    job.priority = e.priority
    return None


def _job_nominated(state: ClusterData, e: JobNominated) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return UNKNOWN_JOB
    refusal = _nomination_refusal(job, e)
    if refusal is not None:
        return refusal
    job.nominations += 1  # counted even when refused: the next nomination gets a fresh id
    job.last_nomination_id = e.id
    if _on_cordoned_node(state, e.replicas):
        return _CORDONED
    refusal = _port_clash(state, job, e.replicas) or _over_quota(state, job, e.pool, e.replicas)
    if refusal is not None:
        return refusal
    if not state._reserve(job, e.replicas, e.victims):
        return "a GPU it holds is taken, held for another job, or gone"
    job.nomination, job.nomination_pool = tuple(state.shared(e.replicas)), e.pool
    job.nomination_id = e.id
    state.note_unpreemptible(job)
    return None


def _nomination_refusal(job: Job, e: JobNominated) -> Refusal:
    """Why a nomination cannot hold GPUs for `job`, checked before anything is counted."""
    if job.phase not in ("pending", "starting", "running"):
        return f"job is {job.phase}"
    if job.nomination:
        return "job already has GPUs held for it"
    if e.id == job.last_nomination_id:
        return "refused already"
    if len(job.held) + len(e.replicas) > job.replicas:  # held is empty while pending
        if job.phase == "pending":
            return "more replicas than the job has"
        return "decided before the job was placed some other way"
    return None


def _job_scheduled(state: ClusterData, e: JobScheduled) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return UNKNOWN_JOB
    if e.scale_up:
        return _job_scaled_up(state, job, e)
    refusal = _placement_refusal(state, job, e) or _over_quota(state, job, e.pool, e.replicas)
    if refusal is not None:
        return refusal
    if not state._take(job, e.replicas):
        return _GPUS_TAKEN  # decided on a state the log has since moved past: no effect
    job.attempt, job.pool, job.held = e.attempt, sys.intern(e.pool), state.shared(e.replicas)
    state._count_held(job, gpus_in(e.replicas))
    state.note_unpreemptible(job)
    job.phase, job.started_at = "starting", None
    state._drop_nomination(job)
    job.stop_replicas, job.stop_reason, job.lost_node, job.drained = 0, "", False, False
    return None


def _placement_refusal(state: ClusterData, job: Job, e: JobScheduled) -> Refusal:
    """Why a placement of a pending job is refused before its GPUs are looked at."""
    if job.phase != "pending":
        return f"job is {job.phase}, not pending"
    if e.attempt != job.attempt + 1:
        # decided before an attempt that has since been made: applied, it made that attempt's
        # number again (its reports were the new one's), and its id was the earlier
        # placement's, which the stream drops as a repeat
        return f"attempt {e.attempt}, not the job's next ({job.attempt + 1})"
    if len(e.replicas) > job.replicas:
        return "more replicas than the job has"
    if _on_cordoned_node(state, e.replicas):
        return _CORDONED
    return _port_clash(state, job, e.replicas)


def _job_scaled_up(state: ClusterData, job: Job, e: JobScheduled) -> Refusal:
    """More replicas for a running elastic job: they join its running attempt."""
    if job.phase not in ("starting", "running") or e.attempt != job.attempt:
        return "not the job's running attempt"
    if len(job.held) + len(e.replicas) > job.replicas:
        return "more replicas than the job has"
    if _on_cordoned_node(state, e.replicas):
        return _CORDONED
    refusal = _port_clash(state, job, e.replicas) or _over_quota(state, job, e.pool, e.replicas)
    if refusal is not None:
        return refusal
    taken = state._take(job, e.replicas)
    if taken:
        job.held.extend(state.shared(e.replicas))
        state._count_held(job, gpus_in(e.replicas))
        state.note_unpreemptible(job)
    state._drop_nomination(job)
    return None if taken else _GPUS_TAKEN


def _over_quota(state: ClusterData, job: Job, pool: str, replicas: Sequence[Replica]) -> Refusal:
    """Rule 3, refereed: in a fair-share pool a non-preemptible job gets GPUs (placed, or
    held for it) only while its project's non-preemptible usage there stays within quota.
    The policy decides so; this keeps a decision made on a view the log has moved past
    (another decider's landed meanwhile) from taking the project over it. Starting on GPUs
    held for the job passed that when they were held for it."""
    if job.preemptible or state.pool_settings(pool).type != "fair_share":
        return None
    if job.nomination_pool == pool and all(r in job.nomination for r in replicas):
        return None  # its own nomination starting
    project = state.projects.get(job.project)
    quota = project.in_pool(pool).quota if project is not None else 0
    use = state.unpreemptible_use(job.project, pool, but=job.id)
    if use + len(replicas) * job.gpus > quota:
        return f"non-preemptible work over project {job.project!r}'s quota of {quota} in {pool!r}"
    return None


def _on_cordoned_node(state: ClusterData, replicas: Sequence[Replica]) -> bool:
    for r in replicas:
        node = state.nodes.get(r.node)
        if node is not None and node.cordoned:
            return True
    return False


_CORDONED: Final = "a node it names is cordoned"


def _port_clash(state: ClusterData, job: Job, replicas: Sequence[Replica]) -> Refusal:
    """Why these replicas of `job` cannot publish its host ports: a node they name publishes
    one already (for another job, or another replica of this one; a node publishes a host
    port once)."""
    ports = job.spec.host_ports()
    if not ports:
        return None
    taken = state.ports_taken(but=job.id)
    own = [r.node for r in job.held]
    for r in replicas:
        if r.node in own:
            return f"host port {ports[0]} is published on node {r.node!r} by another replica"
        own.append(r.node)
        for port in ports:
            other = taken.get(r.node, {}).get(port)
            if other is not None:
                return f"host port {port} is taken on node {r.node!r} by job {other!r}"
    return None


_GPUS_TAKEN: Final = "a GPU it names is taken, held for another job, or gone"


HANDLERS: Final[dict[type[Event], Handler]] = {
    JobSubmitted: _job_submitted,
    JobAdmitted: _job_admitted,
    JobRejected: _job_rejected,
    JobNominated: _job_nominated,
    JobScheduled: _job_scheduled,
    JobPriorityChanged: _job_priority_changed,
}
