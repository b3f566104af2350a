"""The cluster as the fold keeps it: its data, the queries on it, and the moves the fold's
handlers make with it (taking, holding and giving back GPUs, keeping `live` exact).

`ClusterState` (policy/state.py) is this data plus the fold: the handlers that change it, in
policy/fold_cluster.py, policy/fold_placement.py and policy/fold_attempts.py, are typed
against this class, so none of them imports the state and the imports have no cycle.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Self

from events import PriorityClass, Replica, SchedulerSettings, VolumeGrant
from events.model import ClusterSettings
from policy.decay import Decayed, PoolUsage
from policy.records import FINAL_PHASES, HOLDING_PHASES, Job, Node, Pool, Project, gpus_in

#: A handler returns None when the event took effect, or why it did not.
Refusal = str | None
#: A handler: folds one event of its type into the data (typed `Any`: the table that picks the
#: handler by the event's type is what matches the two).
Handler = Callable[["ClusterData", Any], Refusal]

UNKNOWN_JOB: Final = "unknown job"


@dataclass(slots=True)
class ClusterData:
    """The fold's data and the moves on it; `ClusterState` adds the fold (`apply`)."""

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
    #: One object for each distinct list of GPU indexes of a replica (see `shared`): made
    #: again from the jobs, never written to a snapshot
    _gpu_lists: dict[tuple[int, ...], tuple[int, ...]] = field(
        default_factory=dict, repr=False, compare=False, metadata={"derived": True}
    )
    #: The live jobs whose replicas publish host ports (few: `ports_taken` reads only these):
    #: made again from the jobs, never written to a snapshot
    _ported: dict[str, Job] = field(
        default_factory=dict, repr=False, compare=False, metadata={"derived": True}
    )
    #: (project, pool) -> the non-preemptible jobs placed or nominated there that may still
    #: count there (one that no longer does is dropped when next asked: `unpreemptible_use`):
    #: made again from the jobs, never written to a snapshot
    _unpreemptible: dict[tuple[str, str], dict[str, Job]] = field(
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

    def clone(self) -> Self:
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

    def ported(self) -> set[int]:
        """The live jobs whose replicas publish host ports, by identity (`id`): whether a job
        is one is then asked without reading its `spec`, an object elsewhere in memory (a
        cycle asks it of every pending job)."""
        return {id(job) for job in self._ported.values()}

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
        if job.held:
            job.held = self.shared(job.held)
        if job.nomination:
            job.nomination = tuple(self.shared(job.nomination))

    def shared(self, replicas: Iterable[Replica]) -> list[Replica]:
        """The replicas, with their node names and GPU indexes one object each (as
        `share_values` does for a job's names): decoded from an event or a snapshot, every
        replica's node name was a string of its own, and a cycle reads the node of every
        victim's replicas, often more than once. At 4x the bench's size a state restored from
        a snapshot decided its burst cycle in 426.5 ms before, 404.2 ms shared
        (`bench.policy_cycle --restored`)."""
        gpu_lists, found = self._gpu_lists, []
        for r in replicas:
            node, gpus = sys.intern(r.node), gpu_lists.setdefault(r.gpus, r.gpus)
            found.append(r if node is r.node and gpus is r.gpus else Replica(node, gpus))
        return found

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
                    usage.held(job.project, now, gpus_in(job.held))
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

    def note_unpreemptible(self, job: Job) -> None:
        """A job placed or nominated: a non-preemptible one counts against its project's
        quota in that pool (rule 3) while it holds GPUs or has GPUs held for it there."""
        if job.preemptible:
            return
        for pool in (job.pool, job.nomination_pool):
            if pool is not None:
                self._unpreemptible.setdefault((job.project, pool), {})[job.id] = job

    def unpreemptible_use(self, project: str, pool: str, but: str = "") -> int:
        """The project's non-preemptible usage in the pool as the policy counts it (rule 3):
        the replicas its jobs run there and are not being stopped, and those held for them
        there; `but`: leave that job's nomination out."""
        counted = self._unpreemptible.get((project, pool))
        if not counted:
            return 0
        use = 0
        for job_id, job in list(counted.items()):
            placed = job.pool == pool and job.phase in ("starting", "running")
            nominated = job.nomination_pool == pool and bool(job.nomination)
            if not placed and not nominated and job.phase not in HOLDING_PHASES:
                del counted[job_id]  # counts here no more
                continue
            if placed:
                use += job.active_replicas * job.gpus
            if nominated and job_id != but:
                use += len(job.nomination) * job.gpus
        return use

    def note_ports(self, job: Job) -> None:
        """Keep `_ported` exact for a live job."""
        if job.spec.ports:
            self._ported[job.id] = job

    def _end_attempt(self, job: Job, time: float) -> None:
        """The job's attempt is over and it holds nothing: back in the queue unless it was
        ended."""
        job.stop_replicas, job.stop_reason, job.lost_node, job.drained = 0, "", False, False
        job.started_at = None
        if job.phase in HOLDING_PHASES:
            job.phase, job.pending_since = "pending", time
        self._settle(job)
