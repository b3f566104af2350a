"""Cluster state as a left fold over the event log.

`ClusterState.apply(event)` is the only way state changes, so every service that replays the same
log holds the same state. Objects are mutable for speed (a 15,000-job cycle must stay in
milliseconds); `clone()` gives an independent copy for what-if questions.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from events import (
    ClusterConfigured,
    Event,
    JobAdmitted,
    JobCancelled,
    JobCheckpointed,
    JobCompleted,
    JobFailed,
    JobMessage,
    JobNominated,
    JobPaused,
    JobPreempted,
    JobPreemptionRequested,
    JobPriorityChanged,
    JobProgress,
    JobRejected,
    JobResumed,
    JobScheduled,
    JobStarted,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PoolConfigured,
    PriorityClass,
    ProjectConfigured,
    ProjectTerms,
    Replica,
    SchedulerSettings,
    SchedulingHeld,
    VolumeGrant,
    VolumesConfigured,
    ids,
)
from events.catalogue import MAKES_ROOM
from events.model import ClusterSettings, JobSpec
from policy.decay import Decayed, PoolUsage

JobPhase = Literal[
    "submitted",  # waiting for admission
    "pending",  # admitted, holds nothing (a nomination may hold GPUs for it)
    "starting",  # GPUs allocated, workload not yet reported started
    "running",
    "stopping",  # asked to stop (preempted); goes back to pending once stopped
    "paused",
    "completed",
    "failed",
    "cancelled",
    "rejected",
]
FINAL_PHASES: Final = frozenset({"completed", "failed", "cancelled", "rejected"})
HOLDING_PHASES: Final = frozenset({"starting", "running", "stopping"})


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the fold did with one event: applied, or refused and why (a decision made on a
    state the log has moved past, an event about a job or node it does not know, ...)."""

    applied: bool
    reason: str = ""


APPLIED: Final = Verdict(True)


@dataclass(slots=True)
class Node:
    name: str
    pool: str
    gpus: int
    order: int
    cordoned: bool = False  # takes no new work (an operator's cordon or drain)


@dataclass(slots=True)
class Pool:
    name: str
    order: int
    scheduler: SchedulerSettings | None = None


@dataclass(slots=True)
class Project:
    name: str
    order: int
    terms: dict[str, ProjectTerms] = field(default_factory=dict)

    def in_pool(self, pool: str) -> ProjectTerms:
        return self.terms.get(pool, _NO_TERMS)


_NO_TERMS: Final = ProjectTerms()


class Job(msgspec.Struct, array_like=True):
    """A job as the fold knows it. A msgspec struct rather than a dataclass so that a snapshot
    of 200,000 jobs decodes straight into jobs, in C (see policy/snapshot.py)."""

    id: str
    seq: int
    spec: JobSpec
    submitted_at: float
    phase: JobPhase = "submitted"
    project: str = ""
    priority: int = 0
    preemptible: bool = True
    gpus: int = 1
    replicas: int = 1
    min_replicas: int = 1
    pools: tuple[str, ...] = ()
    node: str | None = None
    preemption_delay_s: float = 0.0
    min_runtime_s: float = 0.0
    reject_reason: str = ""
    #: the log position of the rejection (its stream sequence under a follower)
    rejected_at: int = 0
    #: for a job id used again after a rejection: that rejection's position
    resubmitted_after: int = 0
    # -- the current attempt
    attempt: int = 0
    pool: str | None = None
    held: list[Replica] = msgspec.field(default_factory=list)
    started_at: float | None = None
    pending_since: float = 0.0
    stop_replicas: int = 0  # replicas asked to stop; equal to len(held) for the whole job
    stop_reason: str = ""
    lost_node: bool = False
    # -- a nomination: GPUs held for this job while victims stop
    nomination: tuple[Replica, ...] = ()
    nomination_pool: str | None = None
    nominations: int = 0
    #: the id of the nomination the fold accepted (the causation of its victims' stop requests)
    nomination_id: str = ""
    #: the id of the last nomination counted, applied or refused (a repeat counts once)
    last_nomination_id: str = ""
    #: the id of the last stop request applied (a repeat of it has no second effect)
    stop_id: str = ""
    # -- history the policy weighs
    preemptions: int = 0
    last_checkpoint_at: float | None = None
    save_s: float = 0.0
    restore_s: float = 0.0
    #: a replica is on a drained node: the job is asked to stop (reason `drain`)
    drained: bool = False

    @property
    def elastic(self) -> bool:
        return self.min_replicas < self.replicas

    @property
    def active_replicas(self) -> int:
        """Replicas that hold GPUs and are not being stopped."""
        return len(self.held) - self.stop_replicas

    def gpus_held(self) -> int:
        return len(self.held) * self.gpus


@dataclass(slots=True)
class ClusterState:
    settings: ClusterSettings = field(default_factory=ClusterSettings)
    pools: dict[str, Pool] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    projects: dict[str, Project] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    #: Jobs not yet final, or final but still holding GPUs: what a cycle has to look at.
    live: dict[str, Job] = field(default_factory=dict)
    #: Who holds each GPU (node -> GPU index -> job id): the referee for decisions, which
    #: are applied only if every GPU they hand out is free at that point of the log.
    owners: dict[str, dict[int, str]] = field(default_factory=dict)
    #: GPUs held for a nominee (node -> GPU index -> job id): nobody else may be placed there.
    reserved: dict[str, dict[int, str]] = field(default_factory=dict)
    last_time: float = 0.0
    events_applied: int = 0
    #: The log position of the last event applied (the stream sequence where the caller gives
    #: one, else the count of events applied): what a decision made now is based on.
    position: int = 0
    #: Scheduling held by an operator: no placements, no preemptions (see SchedulingHeld).
    held: bool = False
    #: Rule 11: each pool with a usage half-life, its decayed usage (see policy/decay.py)
    usage: dict[str, PoolUsage] = field(default_factory=dict)
    #: The host path prefixes jobs may mount (the last VolumesConfigured): admission's to read
    volumes: tuple[VolumeGrant, ...] = ()
    _node_seq: int = 0
    _job_seq: int = 0
    #: One object for each distinct pool list of the jobs (see `share_values`): made again
    #: from the jobs, never written to a snapshot
    _pool_lists: dict[tuple[str, ...], tuple[str, ...]] = field(
        default_factory=dict, repr=False, compare=False, metadata={"derived": True}
    )
    #: The live jobs whose replicas publish host ports (few: `ports_taken` reads only these):
    #: made again from the jobs, never written to a snapshot
    _ported: dict[str, Job] = field(
        default_factory=dict, repr=False, compare=False, metadata={"derived": True}
    )

    # -- queries -------------------------------------------------------------------------------

    def compute_pool(self) -> str | None:
        if self.settings.default_compute_pool is not None:
            return self.settings.default_compute_pool
        return next(iter(self.pools), None)

    def aux_pool(self) -> str | None:
        return self.settings.default_aux_pool or self.compute_pool()

    def pool_settings(self, pool: str) -> SchedulerSettings:
        own = self.pools[pool].scheduler if pool in self.pools else None
        return own if own is not None else self.settings.scheduler

    def nodes_in(self, pool: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.pool == pool]

    def priority_class(self, name: str) -> PriorityClass | None:
        return next((c for c in self.settings.priority_classes if c.name == name), None)

    def clone(self) -> ClusterState:
        return copy.deepcopy(self)

    def ports_taken(self, but: str | None = None) -> dict[str, dict[int, str]]:
        """Host ports taken per node (node -> port -> job id), by the replicas jobs hold there
        and those GPUs are held for there (a nomination); `but`: leave that job out."""
        taken: dict[str, dict[int, str]] = {}
        for job in self._ported.values():
            if job.id == but:
                continue
            ports = job.spec.host_ports()
            for r in (*job.held, *job.nomination):
                on_node = taken.setdefault(r.node, {})
                for port in ports:
                    on_node.setdefault(port, job.id)
        return taken

    # -- the fold ------------------------------------------------------------------------------

    def apply(self, event: Event, seq: int | None = None) -> Verdict:
        """Apply one event at log position `seq`, and say whether it took effect. Events about
        unknown jobs or nodes, and decisions the log has moved past, change nothing."""
        self.events_applied += 1
        self.position = self.events_applied if seq is None else seq
        self.last_time = max(self.last_time, event.time)
        handler = _HANDLERS.get(type(event))
        if handler is None:
            return APPLIED
        refused = handler(self, event)
        return APPLIED if refused is None else Verdict(False, refused)

    def apply_all(self, events: list[Event]) -> None:
        for event in events:
            self.apply(event)

    def share_values(self, job: Job) -> None:
        """Make the job's names and numbers that many jobs have in common one object each.

        A cycle reads the project, pools, node and preemption delay of every pending job, and
        a value decoded from an event is an object of its own, somewhere else in memory: a
        pass reading one such value of every job cost 12 to 16 times as much at 60,000 jobs
        as at 15,000 (the processor's cache holds the one, not the other). Shared, they stay
        in cache; the values are unchanged.
        """
        job.project = sys.intern(job.project)
        job.pools = self._pool_lists.setdefault(job.pools, job.pools)
        if job.node is not None:
            job.node = sys.intern(job.node)
        if job.pool is not None:
            job.pool = sys.intern(job.pool)
        job.preemption_delay_s = job.preemption_delay_s or 0.0
        job.min_runtime_s = job.min_runtime_s or 0.0

    def _ensure_pool(self, name: str) -> Pool:
        pool = self.pools.get(name)
        if pool is None:
            pool = self.pools[name] = Pool(name=name, order=len(self.pools))
            self._retune_usage(name)
        return pool

    # -- rule 11: decayed usage ----------------------------------------------------------------

    def _retune_usage(self, pool: str) -> None:
        """Follow the pool's half-life setting from now (`last_time`) on: counting starts from
        zero when it is turned on (usage before is not known to the rule), carries on with the
        new half-life when it changes, and is dropped when it is turned off."""
        half_life = self.pool_settings(pool).usage_half_life_s
        kept = self.usage.get(pool)
        now = self.last_time
        if half_life is None:
            self.usage.pop(pool, None)
        elif kept is None:
            gpus = sum(n.gpus for n in self.nodes.values() if n.pool == pool)
            usage = self.usage[pool] = PoolUsage(half_life, Decayed(0.0, now, gpus))
            for job in self.live.values():
                if job.pool == pool and job.held:
                    usage.held(job.project, now, _gpus_in(job.held))
        elif kept.half_life_s != half_life:
            kept.retune(now, half_life)

    def _count_held(self, job: Job, gpus: int) -> None:
        """The job's project holds `gpus` more (or fewer) GPUs in the job's pool from now."""
        usage = self.usage.get(job.pool or "") if self.usage else None
        if usage is not None and gpus:
            usage.held(job.project, self.last_time, gpus)

    def _count_capacity(self, pool: str, gpus: int) -> None:
        usage = self.usage.get(pool) if self.usage else None
        if usage is not None and gpus:
            usage.capacity.move(self.last_time, usage.half_life_s, gpus)

    def _take(self, job: Job, replicas: list[Replica] | tuple[Replica, ...]) -> bool:
        """Record that `job` holds these GPUs, if they exist and nobody else holds them."""
        for r in replicas:
            node = self.nodes.get(r.node)
            owners, reserved = self.owners.get(r.node, {}), self.reserved.get(r.node, {})
            if node is None or any(
                not 0 <= g < node.gpus or g in owners or reserved.get(g, job.id) != job.id
                for g in r.gpus
            ):
                return False
        for r in replicas:
            owners = self.owners.setdefault(r.node, {})
            for g in r.gpus:
                owners[g] = job.id
        return True

    def _reserve(self, job: Job, replicas: tuple[Replica, ...], victims: tuple[str, ...]) -> bool:
        """Hold GPUs for a nominee, if each is free, held by one of its victims or being given
        back by a stopping job (rule 7), and not already held for someone else."""
        for r in replicas:
            node = self.nodes.get(r.node)
            if node is None:
                return False
            owners, reserved = self.owners.get(r.node, {}), self.reserved.get(r.node, {})
            for g in r.gpus:
                if not 0 <= g < node.gpus or reserved.get(g, job.id) != job.id:
                    return False
                owner = owners.get(g)
                if owner is None or owner == job.id or owner in victims:
                    continue
                if not self._giving_back(owner, r.node, g):
                    return False
        for r in replicas:
            reserved = self.reserved.setdefault(r.node, {})
            for g in r.gpus:
                reserved[g] = job.id
        return True

    def _giving_back(self, job_id: str, node: str, gpu: int) -> bool:
        """Is this GPU on its way back: its job paused, cancelled, stopping (the replicas asked
        to stop), or cut off by a lost node?"""
        job = self.jobs.get(job_id)
        if job is None:
            return False
        whole = job.phase in ("paused", "cancelled", "stopping") or job.lost_node
        stopping = job.held if whole else job.held[len(job.held) - job.stop_replicas :]
        return any(r.node == node and gpu in r.gpus for r in stopping)

    def _drop_nomination(self, job: Job) -> None:
        for r in job.nomination:
            reserved = self.reserved.get(r.node)
            if reserved is not None:
                for g in r.gpus:
                    if reserved.get(g) == job.id:
                        del reserved[g]
        job.nomination, job.nomination_pool, job.nomination_id = (), None, ""

    def _give_back(self, job: Job, replicas: list[Replica]) -> None:
        freed = 0
        for r in replicas:
            owners = self.owners.get(r.node)
            if owners is None:
                continue
            for g in r.gpus:
                if owners.get(g) == job.id:
                    del owners[g]
                    freed += 1
        self._count_held(job, -freed)

    def _settle(self, job: Job) -> None:
        """Keep `live` exact: final jobs that hold nothing leave it."""
        if job.phase in FINAL_PHASES and not job.held:
            self.live.pop(job.id, None)
            self._ported.pop(job.id, None)
        else:
            self.live[job.id] = job
            self.note_ports(job)

    def note_ports(self, job: Job) -> None:
        """Keep `_ported` exact for a live job."""
        if job.spec.ports:
            self._ported[job.id] = job


#: A handler returns None when the event took effect, or why it did not.
Refusal = str | None


def _cluster_configured(state: ClusterState, e: ClusterConfigured) -> Refusal:
    state.settings = e.settings
    for name in (e.settings.default_compute_pool, e.settings.default_aux_pool):
        if name is not None:
            state._ensure_pool(name)
    for name in state.pools:
        state._retune_usage(name)
    return None


def _scheduling_held(state: ClusterState, e: SchedulingHeld) -> Refusal:
    state.held = e.held
    return None


def _volumes_configured(state: ClusterState, e: VolumesConfigured) -> Refusal:
    state.volumes = e.grants
    return None


def _pool_configured(state: ClusterState, e: PoolConfigured) -> Refusal:
    state._ensure_pool(e.pool).scheduler = e.scheduler
    state._retune_usage(e.pool)
    return None


def _node_registered(state: ClusterState, e: NodeRegistered) -> Refusal:
    state._ensure_pool(e.pool)
    known = state.nodes.get(e.node)
    if known is not None:
        state._count_capacity(known.pool, -known.gpus)
        state._count_capacity(e.pool, e.gpus)
        known.pool, known.gpus = e.pool, e.gpus
        return None
    state._count_capacity(e.pool, e.gpus)
    state.nodes[e.node] = Node(name=e.node, pool=e.pool, gpus=e.gpus, order=state._node_seq)
    state._node_seq += 1
    return None


def _node_lost(state: ClusterState, e: NodeLost) -> Refusal:
    lost = state.nodes.pop(e.node, None)
    if lost is None:
        return "unknown node"
    state._count_capacity(lost.pool, -lost.gpus)
    state.owners.pop(e.node, None)
    state.reserved.pop(e.node, None)
    for job in list(state.live.values()):
        if job.nomination and any(r.node == e.node for r in job.nomination):
            state._drop_nomination(job)
        if not any(r.node == e.node for r in job.held):
            continue
        kept = [r for r in job.held if r.node != e.node]
        state._count_held(job, -_gpus_in([r for r in job.held if r.node == e.node]))
        job.stop_replicas = min(job.stop_replicas, len(kept))
        job.held = kept
        if not kept:
            _released(state, job, e.time)
        elif job.phase in HOLDING_PHASES:
            job.lost_node = True
    return None


def _node_cordoned(state: ClusterState, e: NodeCordoned) -> Refusal:
    """No new work on the node: nominations holding its GPUs are dropped (their jobs wait to
    be placed again, elsewhere), and placements decided before the cordon are refused. A drain
    also marks the jobs running there, which the next cycle asks to stop."""
    node = state.nodes.get(e.node)
    if node is None:
        return "unknown node"
    node.cordoned = True
    for job in list(state.live.values()):
        if job.nomination and any(r.node == e.node for r in job.nomination):
            state._drop_nomination(job)
        if e.drain and job.phase in HOLDING_PHASES and any(r.node == e.node for r in job.held):
            job.drained = True
    return None


def _node_uncordoned(state: ClusterState, e: NodeUncordoned) -> Refusal:
    node = state.nodes.get(e.node)
    if node is None:
        return "unknown node"
    node.cordoned = False
    return None


def _on_cordoned_node(state: ClusterState, replicas: Sequence[Replica]) -> bool:
    for r in replicas:
        node = state.nodes.get(r.node)
        if node is not None and node.cordoned:
            return True
    return False


_CORDONED: Final = "a node it names is cordoned"


def _port_clash(state: ClusterState, job: Job, replicas: Sequence[Replica]) -> Refusal:
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


def _project_configured(state: ClusterState, e: ProjectConfigured) -> Refusal:
    project = state.projects.get(e.project)
    if project is None:
        project = state.projects[e.project] = Project(name=e.project, order=len(state.projects))
    project.terms = dict(e.terms)
    return None


def _job_submitted(state: ClusterState, e: JobSubmitted) -> Refusal:
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


def _job_admitted(state: ClusterState, e: JobAdmitted) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return _UNKNOWN_JOB
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


def _job_rejected(state: ClusterState, e: JobRejected) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return _UNKNOWN_JOB
    if job.phase != "submitted":
        return f"job is {job.phase}, not submitted"
    job.phase, job.reject_reason, job.rejected_at = "rejected", e.reason, state.position
    state._settle(job)
    return None


def _job_nominated(state: ClusterState, e: JobNominated) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return _UNKNOWN_JOB
    refusal = _nomination_refusal(job, e)
    if refusal is not None:
        return refusal
    job.nominations += 1  # counted even when refused: the next nomination gets a fresh id
    job.last_nomination_id = e.id
    if _on_cordoned_node(state, e.replicas):
        return _CORDONED
    clash = _port_clash(state, job, e.replicas)
    if clash is not None:
        return clash
    if not state._reserve(job, e.replicas, e.victims):
        return "a GPU it holds is taken, held for another job, or gone"
    job.nomination, job.nomination_pool, job.nomination_id = e.replicas, e.pool, e.id
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


def _job_scheduled(state: ClusterState, e: JobScheduled) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return _UNKNOWN_JOB
    if e.scale_up:
        return _job_scaled_up(state, job, e)
    refusal = _placement_refusal(state, job, e)
    if refusal is not None:
        return refusal
    if not state._take(job, e.replicas):
        return _GPUS_TAKEN  # decided on a state the log has since moved past: no effect
    job.attempt, job.pool, job.held = e.attempt, sys.intern(e.pool), list(e.replicas)
    state._count_held(job, _gpus_in(e.replicas))
    job.phase, job.started_at = "starting", None
    state._drop_nomination(job)
    job.stop_replicas, job.stop_reason, job.lost_node, job.drained = 0, "", False, False
    return None


def _placement_refusal(state: ClusterState, job: Job, e: JobScheduled) -> Refusal:
    """Why a placement of a pending job is refused before its GPUs are looked at."""
    if job.phase != "pending":
        return f"job is {job.phase}, not pending"
    if len(e.replicas) > job.replicas:
        return "more replicas than the job has"
    if _on_cordoned_node(state, e.replicas):
        return _CORDONED
    return _port_clash(state, job, e.replicas)


def _job_scaled_up(state: ClusterState, job: Job, e: JobScheduled) -> Refusal:
    """More replicas for a running elastic job: they join its running attempt."""
    if job.phase not in ("starting", "running") or e.attempt != job.attempt:
        return "not the job's running attempt"
    if len(job.held) + len(e.replicas) > job.replicas:
        return "more replicas than the job has"
    if _on_cordoned_node(state, e.replicas):
        return _CORDONED
    clash = _port_clash(state, job, e.replicas)
    if clash is not None:
        return clash
    taken = state._take(job, e.replicas)
    if taken:
        job.held.extend(e.replicas)
        state._count_held(job, _gpus_in(e.replicas))
    state._drop_nomination(job)
    return None if taken else _GPUS_TAKEN


def _job_started(state: ClusterState, e: JobStarted) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return _UNKNOWN_JOB
    if e.attempt != job.attempt or job.phase != "starting":
        return "not the job's starting attempt"
    if (foreign := _foreign_node(job, e.node)) is not None:
        return foreign
    job.phase, job.started_at = "running", e.time
    return None


def _job_preemption_requested(state: ClusterState, e: JobPreemptionRequested) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return _UNKNOWN_JOB
    if e.attempt != job.attempt or not job.held:
        return "not the job's current attempt, or it holds nothing"
    if e.id == job.stop_id:
        return "applied already"
    if e.for_job is not None and e.causation is not None:
        # A stop that makes room stands or falls with the nomination it serves: a victim is
        # never stopped for a nominee whose GPUs the fold did not hold.
        nominee = state.jobs.get(e.for_job)
        if nominee is None or nominee.nomination_id != e.causation:
            return f"its nomination {e.causation} was not applied"
    whole = e.replicas == 0 or e.replicas >= len(job.held)
    # Stops of some replicas add up: two claims in one cycle may each take one of a job's
    # extras, and both requests can be recorded before the executor answers the first.
    more = len(job.held) if whole else job.stop_replicas + e.replicas
    job.stop_replicas = min(len(job.held), more)
    job.stop_reason, job.stop_id = e.reason, e.id
    if whole and job.phase in ("starting", "running"):
        job.phase = "stopping"
    return None


def _job_preempted(state: ClusterState, e: JobPreempted) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return _UNKNOWN_JOB
    if e.attempt != job.attempt or not job.held:
        return "not the job's current attempt, or it holds nothing"
    if (foreign := _foreign_node(job, e.node)) is not None:
        return foreign
    if e.own_replicas and e.node is not None:
        return _node_stopped(state, job, e, e.node)
    whole = e.replicas == 0 or e.replicas >= len(job.held)
    if not whole and job.stop_replicas < e.replicas:
        return "no stop of that many replicas was asked"  # a repeat, or a forgery
    if e.reason in MAKES_ROOM:
        job.preemptions += 1
    if whole:
        state._give_back(job, job.held)
        job.held = []
        _released(state, job, e.time)
    else:
        state._give_back(job, job.held[len(job.held) - e.replicas :])
        del job.held[len(job.held) - e.replicas :]
        job.stop_replicas = max(0, job.stop_replicas - e.replicas)
    if e.checkpointed:
        job.last_checkpoint_at = e.time
    return None


def _node_stopped(state: ClusterState, job: Job, e: JobPreempted, node: str) -> Refusal:
    """One node stopped its own replicas of the stop in progress (and stored what they saved):
    they are given back, and the stop is over only once every node being stopped reported,
    so the next attempt never starts from a checkpoint some node is still storing. A report
    with no stop in progress (a shut down, a replica lost) stops the whole attempt: the other
    nodes see the job stopping and report theirs. Of a stop of some replicas (an elastic
    job's extras), a node reports `e.replicas` of its own: the newest it has being stopped,
    since each request takes the newest not taken yet and a node reports its requests in turn."""
    if job.stop_replicas == 0:
        job.stop_replicas, job.stop_reason = len(job.held), e.reason
        if job.phase in ("starting", "running"):
            job.phase = "stopping"
    whole = job.stop_replicas >= len(job.held)
    stopping = job.held[len(job.held) - job.stop_replicas :]
    mine = [r for r in stopping if r.node == node]
    if not whole and e.replicas:
        mine = mine[len(mine) - e.replicas :] if len(mine) >= e.replicas else []
    if not mine:
        return f"no replica being stopped is on {node}"  # a repeat
    state._give_back(job, mine)
    job.held = [r for r in job.held if r not in mine]
    job.stop_replicas -= len(mine)
    if e.checkpointed:
        job.last_checkpoint_at = e.time
    if e.reason in MAKES_ROOM and _counts(job, e, whole):
        job.preemptions += 1
    if not job.held:
        _released(state, job, e.time)
    return None


def _counts(job: Job, e: JobPreempted, whole: bool) -> bool:
    """Whether this node's report counts the stop as a preemption, once per stop: a whole
    attempt's when its last node reported; each request for some replicas by its first node's
    report, the one under the request's own answer's id (the others add the node's name)."""
    if whole:
        return job.stop_replicas == 0
    return e.causation is not None and e.id == ids.stopped(e.causation)


def _released(state: ClusterState, job: Job, time: float) -> None:
    """The job's attempt is over and it holds nothing: back in the queue unless it was ended."""
    job.stop_replicas, job.stop_reason, job.lost_node, job.drained = 0, "", False, False
    job.started_at = None
    if job.phase in HOLDING_PHASES:
        job.phase, job.pending_since = "pending", time
    state._settle(job)


def _job_checkpointed(state: ClusterState, e: JobCheckpointed) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return _UNKNOWN_JOB
    if e.attempt != job.attempt:
        return "not the job's current attempt"
    if (foreign := _foreign_node(job, e.node)) is not None:
        return foreign
    job.last_checkpoint_at = e.time
    if e.save_s:
        job.save_s = e.save_s
    return None


def _job_paused(state: ClusterState, e: JobPaused) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return _UNKNOWN_JOB
    if job.phase in FINAL_PHASES or job.phase in ("paused", "submitted"):
        return f"job is {job.phase}"
    job.phase = "paused"
    state._drop_nomination(job)
    return None


def _job_resumed(state: ClusterState, e: JobResumed) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return _UNKNOWN_JOB
    if job.phase != "paused":
        return f"job is {job.phase}, not paused"
    job.phase, job.pending_since = ("stopping" if job.held else "pending"), e.time
    return None


def _job_ended(
    state: ClusterState, job_id: str, phase: JobPhase, attempt: int | None, node: str | None = None
) -> Refusal:
    job = state.jobs.get(job_id)
    if job is None:
        return _UNKNOWN_JOB
    if job.phase in FINAL_PHASES:
        return f"job is {job.phase} already"
    if attempt is not None and attempt != job.attempt:
        return "not the job's current attempt"
    if (foreign := _foreign_node(job, node)) is not None:
        return foreign
    job.phase = phase
    if phase != "cancelled":
        state._give_back(job, job.held)
        job.held = []  # the workload exited: its GPUs are free now
    state._drop_nomination(job)
    state._settle(job)
    return None


def _job_completed(state: ClusterState, e: JobCompleted) -> Refusal:
    return _job_ended(state, e.job_id, "completed", e.attempt, e.node)


def _job_failed(state: ClusterState, e: JobFailed) -> Refusal:
    return _job_ended(state, e.job_id, "failed", e.attempt, e.node)


def _job_cancelled(state: ClusterState, e: JobCancelled) -> Refusal:
    return _job_ended(state, e.job_id, "cancelled", None)


def _job_priority_changed(state: ClusterState, e: JobPriorityChanged) -> Refusal:
    job = state.jobs.get(e.job_id)
    if job is None:
        return _UNKNOWN_JOB
    if job.phase in FINAL_PHASES:
        return f"job is {job.phase}"
    job.priority = e.priority
    return None


def _workload_report(state: ClusterState, e: JobProgress | JobMessage) -> Refusal:
    """A workload's own progress or message changes no state; only one from a node that runs
    none of the attempt's replicas is refused (so no read model shows another node's word)."""
    job = state.jobs.get(e.job_id)
    if job is None or e.attempt != job.attempt:
        return None  # as before reports named their node: nothing here to check it against
    return _foreign_node(job, e.node)


def _foreign_node(job: Job, node: str | None) -> Refusal:
    """Why a node's report about the job's current attempt is refused: the node holds no
    replica of it (an executor's credentials reported, for a job running elsewhere, an outcome
    that the node running it then acted on). None when the node has a replica, or the report
    names no node (written before reports named theirs: applied as it always was)."""
    if node is None or any(r.node == node for r in job.held):
        return None
    return f"node {node} holds no replica of attempt {job.attempt}"


def _gpus_in(replicas: list[Replica] | tuple[Replica, ...]) -> int:
    return sum(len(r.gpus) for r in replicas)


_UNKNOWN_JOB: Final = "unknown job"
_GPUS_TAKEN: Final = "a GPU it names is taken, held for another job, or gone"


_HANDLERS: Final[dict[type[Event], Callable[[ClusterState, Any], Refusal]]] = {
    ClusterConfigured: _cluster_configured,
    PoolConfigured: _pool_configured,
    SchedulingHeld: _scheduling_held,
    VolumesConfigured: _volumes_configured,
    NodeRegistered: _node_registered,
    NodeLost: _node_lost,
    NodeCordoned: _node_cordoned,
    NodeUncordoned: _node_uncordoned,
    ProjectConfigured: _project_configured,
    JobSubmitted: _job_submitted,
    JobAdmitted: _job_admitted,
    JobRejected: _job_rejected,
    JobNominated: _job_nominated,
    JobScheduled: _job_scheduled,
    JobStarted: _job_started,
    JobPreemptionRequested: _job_preemption_requested,
    JobPreempted: _job_preempted,
    JobCheckpointed: _job_checkpointed,
    JobPaused: _job_paused,
    JobResumed: _job_resumed,
    JobCompleted: _job_completed,
    JobFailed: _job_failed,
    JobCancelled: _job_cancelled,
    JobPriorityChanged: _job_priority_changed,
    JobProgress: _workload_report,
    JobMessage: _workload_report,
}
