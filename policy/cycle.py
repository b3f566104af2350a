"""One scheduling cycle over the whole cluster: state and time in, decisions (events) out.

`decide(state, now)` is pure: it reads the state, never writes it, and uses no clock of its own,
so the scheduler service, the scenario runner and the simulator get the same decisions from the
same log. It returns a `Plan`: the decisions (as events), the log position they were decided
on, and why each job left waiting waits. Order of work:

1. jobs that must stop (paused, cancelled, on a lost node) are asked to;
2. nominated jobs whose GPUs have been given up start on them;
3. per pool, fair shares are divided, then idle GPUs are handed out (the pool's scheduler);
   jobs with a list of pools try the next pool when one cannot take them;
4. per pool, jobs still waiting may preempt (in-project) or reclaim (between projects).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from events import Event, JobNominated, JobPreemptionRequested, JobScheduled, Replica
from events.catalogue import PreemptionReason
from events.model import SchedulerType
from policy.accounts import Accounts
from policy.candidate_search import gather
from policy.candidates import Candidate, WaitReason
from policy.capacity import Capacity, NodeSlots
from policy.collector import paused
from policy.decisions import Decisions
from policy.pool_cycle import PoolCycle
from policy.schedulers import fair_share, priority, round_robin
from policy.state import ClusterState, Job

Allocate = Callable[[PoolCycle, list[Candidate]], list[Candidate]]
Preempt = Callable[[PoolCycle, list[Candidate]], None]

SCHEDULERS: dict[SchedulerType, tuple[Allocate, Preempt]] = {
    "fair_share": (fair_share.allocate, fair_share.preempt),
    "priority": (priority.allocate, priority.preempt),
    "round_robin": (round_robin.allocate, round_robin.preempt),
}


@dataclass(slots=True, eq=False)
class Plan:
    """One cycle's decisions, in the order they must be written: placements, nominations
    (each followed by the stop requests it causes) and other stop requests."""

    #: the log position of the state decided on (every decision carries it as `basis_seq`)
    basis_seq: int
    events: list[Event] = field(default_factory=list)
    #: the reasons given while deciding, and the jobs left waiting for room ("no_fit")
    #: unless a reason was given for them: what `waiting` is made of
    reasons: dict[str, WaitReason] = field(default_factory=dict)
    waiting_for_room: list[list[Job]] = field(default_factory=list)
    #: jobs that hold GPUs or are given some in this cycle: not waiting, whatever was said
    not_waiting: set[str] = field(default_factory=set)
    _waiting: dict[str, WaitReason] | None = None

    @property
    def waiting(self) -> dict[str, WaitReason]:
        """Why each admitted job that is still waiting after this cycle waits.

        Named when first asked for, not while deciding: the scheduler never asks, and naming
        every waiting job (reading each one's id, a string elsewhere in memory) was a pass
        over the queue that missed the cache at scale. Within a cycle a reason given for a
        job always wins over waiting for room, so the order it is put together in does not
        matter."""
        if self._waiting is None:
            leaving = self.not_waiting
            waiting = {j: r for j, r in self.reasons.items() if j not in leaving}
            for jobs in self.waiting_for_room:
                for job in jobs:
                    job_id = job.id
                    if job_id not in leaving:
                        waiting.setdefault(job_id, "no_fit")
            self._waiting = waiting
        return self._waiting

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        mine, theirs = (self.basis_seq, self.events), (other.basis_seq, other.events)
        return mine == theirs and self.waiting == other.waiting

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it was

    def __bool__(self) -> bool:
        return bool(self.events)

    def __len__(self) -> int:
        return len(self.events)

    @property
    def placements(self) -> list[JobScheduled]:
        return [e for e in self.events if isinstance(e, JobScheduled)]

    @property
    def stops(self) -> list[JobPreemptionRequested]:
        return [e for e in self.events if isinstance(e, JobPreemptionRequested)]

    @property
    def nominations(self) -> list[JobNominated]:
        return [e for e in self.events if isinstance(e, JobNominated)]


def decide(state: ClusterState, now: float) -> Plan:
    """The cycle's decisions on this state at `now`, with the cyclic garbage collector paused
    while it runs: a cycle makes no garbage that only the collector could free
    (policy/collector.py)."""
    with paused():
        return _decide(state, now)


def _decide(state: ClusterState, now: float) -> Plan:
    plan = Plan(state.position)
    decisions = Decisions(state.position, now, plan.events)
    out, waiting = plan.events, plan.reasons
    stopping = _stopping(state)
    _ask_to_stop(stopping, decisions)
    if state.held:
        for job in state.live.values():
            if job.phase == "pending":
                waiting[job.id] = "held"
        return plan
    cycles = _pool_cycles(state, stopping, decisions, waiting, plan.waiting_for_room)
    queued = gather(state, cycles, waiting)
    for cycle in cycles.values():
        cycle.accounts.divide()
    placed: set[str] = set()
    waiting_first: dict[str, tuple[list[Candidate], set[str]]] = {}
    for k, by_pool in enumerate(queued.rounds):
        for pool, cands in by_pool.items():
            todo = [c for c in cands if c.job.id not in placed] if placed else cands
            if not todo:
                continue
            allocate, _ = SCHEDULERS[cycles[pool].settings.type]
            start = len(out)
            left = allocate(cycles[pool], todo)
            # the jobs whose minimum was placed: an extra replica's placement is a scale-up
            here = {e.job_id for e in out[start:] if isinstance(e, JobScheduled) and not e.scale_up}
            placed.update(here)
            if k == 0:
                waiting_first[pool] = (left, here)
    for pool, (left, here) in waiting_first.items():
        todo = _not_placed(left, placed, here)
        if todo:
            _, preempt = SCHEDULERS[cycles[pool].settings.type]
            preempt(cycles[pool], todo)
    plan.not_waiting.update(placed, queued.extras)  # only jobs still pending after it wait
    for cycle in cycles.values():
        cycle.close()
    return plan


def _not_placed(left: list[Candidate], placed: set[str], here: set[str]) -> list[Candidate]:
    """The candidates a pool's allocation left whose job was not placed (`placed`, by every
    pool; `here`, by this pool's). A minimum left waiting by a pool was not placed by it (its
    job has one candidate there): only another pool may have placed its job, and mostly none
    did, so the jobs of most candidates (elsewhere in memory, their ids too) are not read."""
    if not placed:
        return left
    elsewhere = placed - here
    if not elsewhere:
        return [c for c in left if not c.extra or c.job.id not in placed]
    return [c for c in left if c.job.id not in (placed if c.extra else elsewhere)]


def fair_shares(state: ClusterState, now: float) -> dict[str, dict[str, int]]:
    """Each pool's fair share per project, as the next cycle would compute it."""
    cycles = _pool_cycles(state, _stopping(state), Decisions(state.position, now), {}, [])
    gather(state, cycles, {})
    result: dict[str, dict[str, int]] = {}
    for pool, cycle in cycles.items():
        cycle.accounts.divide()
        result[pool] = {a.project: a.fair_share for a in cycle.accounts.accounts.values()}
    return result


#: Rule 11: with a usage half-life the shares move with time alone; while a job waits in such
#: a pool, the policy looks again every this part of the half-life.
USAGE_TICKS_PER_HALF_LIFE: Final = 64


def next_wakeup(state: ClusterState, now: float) -> float | None:
    """The next moment a decision could change with no new event: a pending job's
    preemption_delay or a running job's min_runtime runs out, or (rule 11) the next look at
    a pool whose shares move with time while a job waits there."""
    due: list[float] = []
    if state.usage:
        tick = _usage_tick(state)
        if tick is not None:
            due.append(now + tick)
    for job in state.live.values():
        if job.phase == "pending" and not job.nomination and job.preemption_delay_s > 0:
            due.append(job.pending_since + job.preemption_delay_s)
        elif job.phase == "running" and job.min_runtime_s > 0 and job.started_at is not None:
            due.append(job.started_at + job.min_runtime_s)
        if job.phase == "running" and job.elastic and job.preemption_delay_s > 0:
            due.append(job.pending_since + job.preemption_delay_s)  # its extras may preempt
    later = [t for t in due if t > now]
    return min(later) if later else None


def _usage_tick(state: ClusterState) -> float | None:
    """Rule 11: the interval to look again at, for the pools with a half-life in which a job
    (or an elastic job's extra replica) waits: a share that moves changes nothing while
    nobody waits."""
    waiting: set[str] = set()
    for job in state.live.values():
        if job.phase == "pending" and not job.nomination and job.pools:
            waiting.add(job.pools[0])
        elif job.pool and job.elastic and job.active_replicas < job.replicas:
            waiting.add(job.pool)  # an elastic job's extras wait too
    lives = [u.half_life_s for pool, u in state.usage.items() if pool in waiting]
    return min(lives) / USAGE_TICKS_PER_HALF_LIFE if lives else None


# -- the steps ---------------------------------------------------------------------------------


_STOPPING_PHASES: Final = frozenset({"paused", "stopping", "cancelled"})


def _stopping(state: ClusterState) -> list[Job]:
    """The jobs that are giving GPUs back, or must be asked to: paused, cancelled, stopping,
    cut off by a lost node, or with replicas asked to stop. Found from the jobs' own fields
    (their `held`, a list elsewhere in memory, is read only for these): a pass over every job
    that reads more than that missed the processor's cache at scale."""
    return [
        job
        for job in state.live.values()
        if job.phase in _STOPPING_PHASES or job.lost_node or job.stop_replicas or job.drained
    ]


def _ask_to_stop(stopping: list[Job], decisions: Decisions) -> None:
    for job in stopping:
        phase = job.phase
        reason: PreemptionReason
        if phase in ("paused", "stopping"):
            reason = "pause"
        elif phase == "cancelled":
            reason = "cancel"
        elif job.lost_node:
            reason = "node_lost"
        elif job.drained:
            reason = "drain"
        else:
            continue  # replicas asked to stop: asked already
        if job.held and not job.stop_replicas:
            decisions.stop(job, reason)


def _pool_cycles(
    state: ClusterState,
    stopping: list[Job],
    decisions: Decisions,
    waiting: dict[str, WaitReason],
    waiting_for_room: list[list[Job]],
) -> dict[str, PoolCycle]:
    """Each pool's cycle, with its idle GPUs (neither held by a job nor held for a nominee:
    the fold's `owners` and `reserved`, rather than every job's replicas) and the GPUs being
    given back (rule 7) that are not held for a nominee already."""
    owners, reserved = state.owners, state.reserved
    by_pool: dict[str, list[NodeSlots]] = {p: [] for p in state.pools}
    cordoned_gpus: dict[str, int] = {}  # per pool: still counted in the pool's fair shares
    for node in state.nodes.values():
        if node.cordoned:
            # out of service for a while, not lost: no new work goes there, so the cycle
            # does not see its GPUs (idle, releasing or freed by a victim) as room
            by_pool.setdefault(node.pool, [])
            cordoned_gpus[node.pool] = cordoned_gpus.get(node.pool, 0) + node.gpus
            continue
        held, held_for = owners.get(node.name), reserved.get(node.name)
        slots = by_pool.setdefault(node.pool, [])
        if held or held_for:
            busy = held or _NONE
            free = [g for g in range(node.gpus) if g not in busy and g not in (held_for or _NONE)]
        else:
            free = list(range(node.gpus))
        slots.append(NodeSlots(node.name, node.order, len(slots), node.gpus, free))
    back: dict[str, dict[str, list[int]]] = {}
    for job in stopping:
        for r in _giving_back(job):
            where = state.nodes.get(r.node)
            if where is not None and not where.cordoned:
                kept = [g for g in r.gpus if g not in reserved.get(r.node, _NONE)]
                if kept:
                    back.setdefault(where.pool, {}).setdefault(r.node, []).extend(kept)
    # host ports published on each node (or held for a nominee there): rare, so only looked
    # at by the requests that publish ports
    ports = {node: set(taken) for node, taken in state.ports_taken().items()}
    cycles: dict[str, PoolCycle] = {}
    for pool, nodes in by_pool.items():
        capacity = Capacity(nodes, ports)
        gpus = capacity.total_gpus + cordoned_gpus.get(pool, 0)
        accounts = Accounts(state, pool, gpus, decisions.now)
        settings = state.pool_settings(pool)
        releasing = back.get(pool, {})
        cycles[pool] = PoolCycle(
            state,
            pool,
            settings,
            capacity,
            accounts,
            decisions,
            releasing,
            waiting,
            waiting_for_room,
        )
    return cycles


def _giving_back(job: Job) -> list[Replica]:
    """The replicas a job is giving back (rule 7): all of them when it is paused, cancelled,
    stopping or cut off by a lost node, else those asked to stop (the newest)."""
    if job.phase in ("paused", "cancelled", "stopping") or job.lost_node:
        return job.held
    if job.stop_replicas:
        return job.held[len(job.held) - job.stop_replicas :]
    return []


_NONE: Final[dict[int, str]] = {}
