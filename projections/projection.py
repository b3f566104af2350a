"""The projection: events in, changed rows out.

It keeps the fold (`ClusterState`, the same code every service folds the log with) so each row
says what the fold decided: a decision made on a state the log had moved past is on the
timeline with `applied = False`, and a job's state is the fold's. Beside the fold it keeps what
the read models add: each job's clocks (queued, running, GPU-seconds), each project's usage per
pool, open over-quota periods and open preemptions.

`apply` takes events one at a time in log order; `take` returns the rows changed since the
last `take` (a job changed by ten events in one batch is one row). Fair shares are computed by
the policy's own `fair_shares` once per `take`, not per event: they are a view of the pool as
a whole, and a batch's end is where a reader sees it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import msgspec

from events import (
    Event,
    JobCheckpointed,
    JobNominated,
    JobPreempted,
    JobPreemptionRequested,
    JobScheduled,
    NodeCordoned,
    NodeLost,
    NodeRegistered,
    NodeUncordoned,
    PoolConfigured,
    ProjectConfigured,
    ProjectQuotaCrossed,
    WorkRelayed,
    encode_event,
)
from events.catalogue import LOCAL_ADDRESS, MAKES_ROOM
from policy.commands.admission import asked_priority
from policy.cycle import decide, fair_shares
from policy.state import ClusterState, Job
from policy.usage import Usage
from projections.rows import (
    JobRow,
    NodeRow,
    OverQuotaRow,
    PreemptionRow,
    ProjectPoolRow,
    TimelineRow,
)

QUEUED_PHASES: Final = frozenset({"submitted", "pending"})

ProjectPool = tuple[str, str]


class Batch(msgspec.Struct):
    """Rows changed by the events up to `last_seq` since the previous batch."""

    last_seq: int
    timeline: list[TimelineRow]
    jobs: list[JobRow]
    nodes: list[NodeRow]
    project_pools: list[ProjectPoolRow]
    over_quota: list[OverQuotaRow]
    preemptions: list[PreemptionRow]

    @property
    def empty(self) -> bool:
        return not self.timeline


@dataclass(slots=True)
class _Clock:
    """A job's accounting: time spent per state up to `since`."""

    phase: str
    gpus_held: int
    since: float
    state_since: float
    queued_s: float = 0.0
    running_s: float = 0.0
    gpu_s: float = 0.0
    first_started_at: float | None = None

    def advance(self, to: float) -> None:
        elapsed = max(0.0, to - self.since)
        if self.phase in QUEUED_PHASES:
            self.queued_s += elapsed
        elif self.phase == "running":
            self.running_s += elapsed
        self.gpu_s += self.gpus_held * elapsed
        self.since = max(self.since, to)


@dataclass(frozen=True, slots=True)
class _Shape:
    priority: int
    preemptible: bool
    gpus: int
    replicas: int
    min_replicas: int


def _shape(state: ClusterState, job: Job) -> _Shape:
    """What the job is: as admitted, or, for a job never admitted (waiting for admission, or
    rejected), the GPUs and replicas its spec asks for: the fold shapes a job only when
    admitting it. A rejected job also shows the priority its spec asks for (an unknown class,
    a reason to reject it, leaves the fold's); one still waiting keeps the fold's, which a
    change of priority may have set."""
    if job.phase not in ("submitted", "rejected"):
        return _Shape(job.priority, job.preemptible, job.gpus, job.replicas, job.min_replicas)
    spec = job.spec
    priority, preemptible = job.priority, job.preemptible
    if job.phase == "rejected":
        priority, preemptible = asked_priority(state, spec) or (priority, preemptible)
    minimum = spec.replicas if spec.min_replicas is None else spec.min_replicas
    return _Shape(priority, preemptible, spec.gpus, spec.replicas, minimum)


def _signature(job: Job | None) -> object:
    """What an event can change about a job: equal before and after means it had no effect."""
    if job is None:
        return None
    return (
        job.phase,
        job.attempt,
        len(job.held),
        job.stop_replicas,
        job.nomination,
        job.preemptions,
        job.last_checkpoint_at,
        job.priority,
    )


@dataclass
class Projection:
    state: ClusterState = field(default_factory=ClusterState)
    last_seq: int = 0
    _clocks: dict[str, _Clock] = field(default_factory=dict)
    _job_seq: dict[str, int] = field(default_factory=dict)
    #: each project's GPUs in use per pool, counted as the quota ledger counts them
    _usage: Usage = field(default_factory=Usage)
    _fair: dict[ProjectPool, int] = field(default_factory=dict)
    #: rule 11: each project's decayed usage U in the pools with a half-life
    _decayed: dict[ProjectPool, float] = field(default_factory=dict)
    _project_pools: dict[ProjectPool, int] = field(default_factory=dict)  # key -> last seq
    _nodes: dict[str, NodeRow] = field(default_factory=dict)
    _over_open: dict[ProjectPool, OverQuotaRow] = field(default_factory=dict)
    _preempting: dict[tuple[str, int], PreemptionRow] = field(default_factory=dict)
    # changed since the last take
    _timeline: list[TimelineRow] = field(default_factory=list)
    _dirty_jobs: set[str] = field(default_factory=set)
    _dirty_nodes: set[str] = field(default_factory=set)
    _dirty_pp: set[ProjectPool] = field(default_factory=set)
    _dirty_over: dict[tuple[str, str, int], OverQuotaRow] = field(default_factory=dict)
    _dirty_preemptions: dict[int, PreemptionRow] = field(default_factory=dict)
    _shares_stale: bool = False
    #: job -> why the policy leaves it waiting (its own reason code), for jobs still pending
    _waiting: dict[str, str] = field(default_factory=dict)
    _waiting_stale: bool = False
    #: each node's address as it registered it (a job's URLs are its nodes' addresses)
    _addresses: dict[str, str] = field(default_factory=dict)

    # -- events in ---------------------------------------------------------------------------

    def apply(self, seq: int, event: Event) -> None:
        """Fold one event (the next in the log) and note the rows it changes."""
        state = self.state
        if isinstance(event, WorkRelayed):
            # a copy of an event already folded, for one node's executor: no row of its own
            state.apply(event, seq)
            self.last_seq = seq
            return
        touched = self._touched_jobs(event)
        before = {job_id: _signature(state.jobs.get(job_id)) for job_id in touched}
        nodes_before = {job_id: self._job_nodes(job_id) for job_id in touched}
        lost_work = self._work_lost(event) if isinstance(event, JobPreempted) else None
        applied = state.apply(event).applied  # the fold's own verdict, not re-derived
        self.last_seq = seq
        self._waiting_stale = True
        changed = any(_signature(state.jobs.get(job_id)) != before[job_id] for job_id in touched)
        for job_id in touched:
            job = state.jobs.get(job_id)
            if job is None:
                continue
            self._account(job, event.time, seq)
            self._dirty_nodes.update(nodes_before[job_id])
            self._dirty_nodes.update(self._job_nodes(job_id))
        if changed and not isinstance(event, JobCheckpointed):  # demand or holdings moved
            self._shares_stale = True
        self._other_rows(seq, event, applied, lost_work)
        self._timeline.append(self._timeline_row(seq, event, applied, nodes_before))

    def _node_rows(
        self,
        seq: int,
        event: NodeRegistered | NodeLost | NodeCordoned | NodeUncordoned,
        applied: bool,
    ) -> None:
        match event:
            case NodeRegistered(node=node, pool=pool, gpus=gpus):
                self._addresses[node] = event.address or LOCAL_ADDRESS
                known = self._nodes.get(node)
                registered_at = known.registered_at if known and not known.lost else event.time
                cordon = known.cordon if known and not known.lost else ""  # kept on a restart
                self._nodes[node] = NodeRow(
                    node, pool, gpus, gpus, False, registered_at, None, seq, cordon
                )
                self._dirty_nodes.add(node)
                self._shares_stale = True
            case NodeLost(node=node):
                known = self._nodes.get(node)
                if known is not None and not known.lost:
                    self._nodes[node] = msgspec.structs.replace(
                        known, lost=True, free=0, lost_at=event.time, last_seq=seq
                    )
                    self._dirty_nodes.add(node)
                    self._shares_stale = True
            case NodeCordoned(node=node, drain=drain) if applied:
                self._set_cordon(node, "drained" if drain else "cordoned", seq)
            case NodeUncordoned(node=node) if applied:
                self._set_cordon(node, "", seq)

    def _set_cordon(self, node: str, cordon: str, seq: int) -> None:
        known = self._nodes.get(node)
        if known is not None:
            self._nodes[node] = msgspec.structs.replace(known, cordon=cordon, last_seq=seq)
            self._dirty_nodes.add(node)

    def _touched_jobs(self, event: Event) -> list[str]:
        job_id: str | None = getattr(event, "job_id", None)
        if job_id is not None:
            return [job_id]
        if isinstance(event, NodeLost | NodeCordoned):
            return [
                job.id
                for job in self.state.live.values()
                if any(r.node == event.node for r in (*job.held, *job.nomination))
            ]
        return []

    def _job_nodes(self, job_id: str) -> tuple[str, ...]:
        job = self.state.jobs.get(job_id)
        if job is None or not (job.held or job.nomination):
            return ()
        if len(job.held) == 1 and not job.nomination:  # the common case, said quickly
            return (job.held[0].node,)
        return tuple(dict.fromkeys(r.node for r in (*job.held, *job.nomination)))

    def _work_lost(self, event: JobPreempted) -> float | None:
        """GPU-seconds of work a preempted attempt loses: since its last checkpoint (or its
        start) on the replicas stopped; nothing if it saved a checkpoint as it stopped."""
        job = self.state.jobs.get(event.job_id)
        if job is None or event.attempt != job.attempt or not job.held:
            return None
        if event.checkpointed or job.started_at is None:
            return 0.0
        since = max(job.started_at, job.last_checkpoint_at or job.started_at)
        replicas = event.replicas if 0 < event.replicas < len(job.held) else len(job.held)
        return max(0.0, event.time - since) * replicas * job.gpus

    def _account(self, job: Job, time: float, seq: int) -> None:
        clock = self._clocks.get(job.id)
        if clock is None:
            clock = self._clocks[job.id] = _Clock(job.phase, 0, time, time)
        clock.advance(time)
        if clock.phase != job.phase:
            clock.phase, clock.state_since = job.phase, max(clock.since, time)
            if job.phase == "running" and clock.first_started_at is None:
                clock.first_started_at = clock.state_since
        clock.gpus_held = job.gpus_held()
        self._job_seq[job.id] = seq
        self._dirty_jobs.add(job.id)
        for key in self._usage.job_changed(job):
            self._touch_project_pool(key, seq)

    def _touch_project_pool(self, key: ProjectPool, seq: int) -> None:
        self._project_pools[key] = seq
        self._dirty_pp.add(key)

    def _other_rows(self, seq: int, event: Event, applied: bool, lost: float | None) -> None:
        if isinstance(event, NodeRegistered | NodeLost | NodeCordoned | NodeUncordoned):
            self._node_rows(seq, event, applied)
        match event:
            case PoolConfigured():
                self._shares_stale = True
            case ProjectConfigured(project=project, terms=terms):
                pools = set(terms) | {pool for (p, pool) in self._project_pools if p == project}
                for pool in pools:
                    self._touch_project_pool((project, pool), seq)
                self._shares_stale = True
            case ProjectQuotaCrossed(project=project, pool=pool, over=over):
                self._quota_crossed((project, pool), over, seq, event.time)
            case JobPreemptionRequested(reason=reason) if applied and reason in MAKES_ROOM:
                self._preemption_requested(seq, event)
            case JobPreempted(job_id=job_id, attempt=attempt) if applied:
                self._preempted(seq, event, lost)
                if event.replicas == 0 or self.state.jobs[job_id].attempt != attempt:
                    self._preempting.pop((job_id, attempt), None)
            case _:
                pass

    def _quota_crossed(self, key: ProjectPool, over: bool, seq: int, time: float) -> None:
        open_period = self._over_open.get(key)
        if over and open_period is None:
            row = OverQuotaRow(key[0], key[1], seq, time, None, None)
            self._over_open[key] = row
        elif not over and open_period is not None:
            row = msgspec.structs.replace(open_period, ended_at=time, ended_seq=seq)
            del self._over_open[key]
        else:
            return
        self._dirty_over[(key[0], key[1], row.started_seq)] = row
        self._touch_project_pool(key, seq)

    def _preemption_requested(self, seq: int, event: JobPreemptionRequested) -> None:
        job = self.state.jobs[event.job_id]
        replicas = event.replicas if 0 < event.replicas < len(job.held) else len(job.held)
        row = PreemptionRow(
            seq=seq,
            victim=event.job_id,
            attempt=event.attempt,
            reason=event.reason,
            beneficiary=event.for_job,
            pool=job.pool,
            replicas=replicas,
            gpus=replicas * job.gpus,
            requested_at=event.time,
            preempted_at=None,
            checkpointed=None,
            work_lost_gpu_s=None,
        )
        self._preempting[(event.job_id, event.attempt)] = row
        self._dirty_preemptions[seq] = row

    def _preempted(self, seq: int, event: JobPreempted, lost: float | None) -> None:
        row = self._preempting.get((event.job_id, event.attempt))
        if row is None:
            if event.reason not in MAKES_ROOM:
                return  # a pause, a cancel or a lost node: not a preemption in the user's sense
            job = self.state.jobs[event.job_id]
            row = PreemptionRow(
                seq, event.job_id, event.attempt, event.reason, None, job.pool,
                event.replicas, event.replicas * job.gpus, event.time, None, None, None,
            )  # fmt: skip
        row = msgspec.structs.replace(
            row, preempted_at=event.time, checkpointed=event.checkpointed, work_lost_gpu_s=lost
        )
        self._preempting[(event.job_id, event.attempt)] = row
        self._dirty_preemptions[row.seq] = row

    def _timeline_row(
        self, seq: int, event: Event, applied: bool, nodes_before: dict[str, tuple[str, ...]]
    ) -> TimelineRow:
        job_id: str | None = getattr(event, "job_id", None)
        job = self.state.jobs.get(job_id) if job_id is not None else None
        project: str | None = getattr(event, "project", None)
        pool: str | None = getattr(event, "pool", None)
        nodes: tuple[str, ...] = ()
        if isinstance(event, JobScheduled | JobNominated):
            nodes = tuple(dict.fromkeys(r.node for r in event.replicas))
        elif isinstance(event, NodeRegistered | NodeLost | NodeCordoned | NodeUncordoned):
            nodes = (event.node,)
        elif job_id is not None:
            nodes = nodes_before.get(job_id) or self._job_nodes(job_id)
        if job is not None:
            project = job.project or job.spec.project
            pool = pool or job.pool or job.nomination_pool or next(iter(job.pools), None)
        reason = getattr(event, "reason", None)
        return TimelineRow(
            seq=seq,
            time=event.time,
            type=type(event).__name__,
            event_id=event.id,
            actor=event.actor,
            causation=event.causation,
            job_id=job_id,
            project=project,
            pool=pool,
            nodes=nodes,
            reason=reason or None,
            for_job=getattr(event, "for_job", None),
            applied=applied,
            data=encode_event(event).decode(),
        )

    # -- rows out ----------------------------------------------------------------------------

    def take(self) -> Batch:
        """The rows changed since the last take, and forget them."""
        if self._shares_stale:
            self._refresh_fair_shares()
        if self._waiting_stale:
            self._refresh_waiting()
        if self.state.usage or self._decayed:
            self._refresh_decayed_usage()
        batch = Batch(
            last_seq=self.last_seq,
            timeline=self._timeline,
            jobs=[self.job_row(job_id) for job_id in sorted(self._dirty_jobs)],
            nodes=[self.node_row(n) for n in sorted(self._dirty_nodes) if n in self._nodes],
            project_pools=[self.project_pool_row(key) for key in sorted(self._dirty_pp)],
            over_quota=list(self._dirty_over.values()),
            preemptions=list(self._dirty_preemptions.values()),
        )
        self.discard()
        return batch

    def discard(self) -> None:
        """Forget the rows changed since the last take without making them (events folded again
        after a restart, written before): the views of the whole pool (fair shares, why jobs
        wait) are left to the next take, which sees the state they end in."""
        self._timeline = []
        self._dirty_jobs, self._dirty_nodes, self._dirty_pp = set(), set(), set()
        self._dirty_over, self._dirty_preemptions = {}, {}

    def _refresh_fair_shares(self) -> None:
        self._shares_stale = False
        now = self.state.last_time
        seen: set[ProjectPool] = set()
        for pool, shares in fair_shares(self.state, now).items():
            for project, share in shares.items():
                key = (project, pool)
                seen.add(key)
                if self._fair.get(key, 0) != share:
                    self._fair[key] = share
                    # a view of the pool, not an event of the project's: its last_seq stays
                    self._project_pools.setdefault(key, 0)
                    self._dirty_pp.add(key)
        for key in [k for k in self._fair if k not in seen]:
            del self._fair[key]
            self._dirty_pp.add(key)

    def _refresh_decayed_usage(self) -> None:
        """Rule 11: U moves with time; read at the end of each batch, a row is written again
        when its U moved by a tenth of a percent or more."""
        now = self.state.last_time
        seen: set[ProjectPool] = set()
        for pool, usage in self.state.usage.items():
            shares = usage.shares(now)
            projects = shares.keys() | {p for p, in_pool in self._project_pools if in_pool == pool}
            for project in sorted(projects):
                u = shares.get(project, 0.0)  # a project that never held GPUs there: 0
                key = (project, pool)
                seen.add(key)
                if abs(self._decayed.get(key, -1.0) - u) >= 0.001:
                    self._decayed[key] = u
                    self._project_pools.setdefault(key, 0)
                    self._dirty_pp.add(key)
        for key in [k for k in self._decayed if k not in seen]:
            del self._decayed[key]
            self._dirty_pp.add(key)

    def _refresh_waiting(self) -> None:
        """Ask the policy itself why each pending job waits: a scheduling cycle decided on the
        state as it stands at the end of this batch (the plan is read, never published). A job
        the plan would place or nominate has no reason: it is about to start."""
        self._waiting_stale = False
        pending = any(job.phase == "pending" for job in self.state.live.values())
        waiting: dict[str, str] = (
            dict(decide(self.state, self.state.last_time).waiting) if pending else {}
        )
        for job_id in self._waiting.keys() | waiting.keys():
            if self._waiting.get(job_id) != waiting.get(job_id) and job_id in self.state.jobs:
                self._dirty_jobs.add(job_id)  # a view of the cycle: the row's last_seq stays
        self._waiting = waiting

    def job_row(self, job_id: str) -> JobRow:
        job = self.state.jobs[job_id]
        clock = self._clocks[job_id]
        shape = _shape(self.state, job)
        return JobRow(
            job_id=job.id,
            order=job.seq,
            project=job.project or job.spec.project,
            pool=job.pool or job.nomination_pool or next(iter(job.pools), None),
            pools=job.pools,
            state=job.phase,
            priority=shape.priority,
            preemptible=shape.preemptible,
            gpus=shape.gpus,
            replicas=shape.replicas,
            min_replicas=shape.min_replicas,
            attempt=job.attempt,
            gpus_held=job.gpus_held(),
            nodes=tuple(dict.fromkeys(r.node for r in job.held)),
            submitted_at=job.submitted_at,
            state_since=clock.state_since,
            queued_s=clock.queued_s,
            running_s=clock.running_s,
            gpu_s=clock.gpu_s,
            accounted_at=clock.since,
            first_started_at=clock.first_started_at,
            preemptions=job.preemptions,
            nominated=bool(job.nomination),
            stop_reason=job.stop_reason,
            reject_reason=job.reject_reason,
            waiting=self._waiting.get(job_id, ""),
            last_seq=self._job_seq[job_id],
            ports=tuple(f"{p.host}:{p.container}" for p in job.spec.ports),
            urls=self._urls(job),
            volumes=tuple(v.text() for v in job.spec.volumes),
        )

    def _urls(self, job: Job) -> tuple[str, ...]:
        """Where the job's published ports are reached: each node it holds replicas on (a
        node publishes a port once, so one replica a node), each host port."""
        if not job.spec.ports or not job.held:
            return ()
        nodes = dict.fromkeys(r.node for r in job.held)
        return tuple(
            f"http://{self._addresses.get(node, LOCAL_ADDRESS)}:{p.host}"
            for node in nodes
            for p in job.spec.ports
        )

    def node_row(self, name: str) -> NodeRow:
        row = self._nodes[name]
        node = self.state.nodes.get(name)
        if row.lost or node is None:
            return row
        busy = set(self.state.owners.get(name, {})) | set(self.state.reserved.get(name, {}))
        return msgspec.structs.replace(row, free=max(0, node.gpus - len(busy)))

    def pools_of(self, project: str) -> list[str]:
        """The pools a project has had terms or usage in, by name."""
        return sorted(pool for (name, pool) in self._project_pools if name == project)

    def project_pool_row(self, key: ProjectPool) -> ProjectPoolRow:
        project, pool = key
        known = self.state.projects.get(project)
        terms = known.in_pool(pool) if known is not None else None
        return ProjectPoolRow(
            project=project,
            pool=pool,
            quota=terms.quota if terms else 0,
            over_quota_weight=terms.over_quota_weight if terms else 1,
            limit=terms.limit if terms else None,
            priority=terms.priority if terms else 100,
            usage=self._usage.of(*key),
            fair_share=self._fair.get(key, 0),
            over_quota=key in self._over_open,
            last_seq=self._project_pools.get(key, 0),
            decayed_usage=self._decayed.get(key),
        )
